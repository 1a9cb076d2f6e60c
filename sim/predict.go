package sim

import (
	"fmt"
	"time"
)

// PredictFirstToken answers "if r were submitted to p now, when would its
// first token come?" for a pod driven by an Engine, from the pod's true
// state at the engine's Now (its waiting queue,
// its running batch and the step in progress, its prefix cache and
// adapter slots) and the pod model itself: it steps a copy of the pod,
// with no further arrivals and no random faults, until r's first token.
// The pod is not changed.
//
// It returns the predicted first-token time (virtual, absolute) and nil;
// an error wrapping the pod's reason if the pod would refuse r
// (ErrContextLength, ErrUnknownAdapter, ErrInvalidRequest); or limit and
// ErrBeyondLimit once the projection passes limit without a first token
// (limit ≤ 0 means none), so that a caller looking for the earliest pod
// can stop projecting a pod already worse than its best.
//
// It is the replay tool's oracle: a router that knew everything the
// simulator knows at the instant of a decision. It costs a copy of the
// pod and a few engine steps per call.
func (p *Pod) PredictFirstToken(r *Request, limit time.Duration) (time.Duration, error) {
	e := p.engine
	if e == nil {
		return 0, fmt.Errorf("pod %s is not driven by an engine: %w", p.Name(), ErrInvalidRequest)
	}
	if err := p.admissible(r); err != nil {
		return 0, err
	}
	if p.faults.Hang {
		return limit, ErrBeyondLimit
	}
	c := p.clone()
	t := e.now
	if p.stepping {
		c.EndStep(p.stepEndAt)
		t = p.stepEndAt
	}
	c.faults = Faults{}
	if err := c.Submit(t, r, nil); err != nil {
		return 0, err
	}
	s := c.byReq[r]
	for {
		if limit > 0 && t > limit {
			return limit, ErrBeyondLimit
		}
		d, ok := c.BeginStep(t)
		if !ok {
			return limit, ErrBeyondLimit
		}
		if f := p.faults.SlowFactor; f > 0 && f != 1 {
			d = time.Duration(float64(d) * f)
		}
		t += d
		c.EndStep(t)
		if s.firstToken >= 0 {
			return t, nil
		}
	}
}

// ErrBeyondLimit is returned by PredictFirstToken when the projection
// passed its limit (or the pod hangs) before the first token.
var ErrBeyondLimit = fmt.Errorf("sim: no first token within the projection's limit")

// clone returns a copy of the pod's scheduling state (queues, KV and
// prefix cache, adapter slots) that can be stepped without touching p. It
// is not attached to any engine, has its own random source and drops
// statistics and event buffers.
func (p *Pod) clone() *Pod {
	c := &Pod{
		cfg:      p.cfg,
		model:    p.model,
		faults:   p.faults,
		rng:      nil,
		adapter:  p.adapter, // read-only after NewPod
		byReq:    make(map[*Request]*seq, len(p.byReq)+1),
		inStep:   p.inStep,
		private:  p.private,
		resident: make(map[string]*loraSlot, len(p.resident)),
		loads:    p.loads,
	}
	c.prof = &c.cfg.Profile
	cache, entries := p.cache.clone()
	c.cache = cache
	for name, slot := range p.resident {
		cp := *slot
		c.resident[name] = &cp
	}
	seqs := make(map[*seq]*seq, len(p.running)+len(p.waiting))
	cp := func(s *seq) *seq {
		if n, ok := seqs[s]; ok {
			return n
		}
		n := new(seq)
		*n = *s
		n.tag = nil
		n.watch = false
		if len(s.pinned) > 0 {
			n.pinned = make([]*cacheEntry, len(s.pinned))
			for i, e := range s.pinned {
				n.pinned[i] = entries[e]
			}
		}
		seqs[s] = n
		c.byReq[n.req] = n
		return n
	}
	c.running = make([]*seq, len(p.running), len(p.running)+1)
	for i, s := range p.running {
		c.running[i] = cp(s)
	}
	c.waiting = make([]*seq, len(p.waiting), len(p.waiting)+1)
	for i, s := range p.waiting {
		c.waiting[i] = cp(s)
	}
	c.batch = make([]*seq, len(p.batch))
	for i, s := range p.batch {
		c.batch[i] = cp(s)
	}
	return c
}

// clone deep-copies the cache and returns the map from old entries to new
// ones, for the sequences' pins.
func (c *prefixCache) clone() (*prefixCache, map[*cacheEntry]*cacheEntry) {
	n := &prefixCache{entries: make(map[uint64]*cacheEntry, len(c.entries)), blocks: c.blocks, evictable: c.evictable}
	m := make(map[*cacheEntry]*cacheEntry, len(c.entries))
	for h, e := range c.entries {
		ne := &cacheEntry{hash: e.hash, blocks: e.blocks, refs: e.refs}
		n.entries[h] = ne
		m[e] = ne
	}
	// Rebuild the LRU list in the same order.
	var prev *cacheEntry
	for e := c.head; e != nil; e = e.next {
		ne := m[e]
		ne.prev = prev
		if prev != nil {
			prev.next = ne
		} else {
			n.head = ne
		}
		prev = ne
	}
	n.tail = prev
	return n, m
}

// InFlight is the number of requests waiting or running on the pod.
func (p *Pod) InFlight() int { return len(p.waiting) + len(p.running) }
