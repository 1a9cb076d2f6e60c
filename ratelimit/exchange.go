package ratelimit

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// The exchange. Every SyncInterval each instance folds the units attempted
// against each limit into a demand estimate (units per second), sets its
// share of each limit to its demand over the sum of every live instance's
// demand (each counted at least MinShare of the limit), and gossips both
// the estimates and the shares it took. Local buckets refill at share ×
// rate. When all instances see the same estimates the shares sum to
// exactly 1. A peer that falls silent keeps the share it last reported.
//
// The Limiter speaks the shape of a gossip channel: LocalState for
// push/pull (every entry this instance knows, so state spreads through any
// peer), Merge for whatever a peer sent, and Run to broadcast this
// instance's own entry each interval. It imports no transport.

// peer is what this instance knows of another.
type peer struct {
	seq     uint64
	heard   time.Time // when the origin produced the entry, on our clock
	leaving bool
	limits  map[uint64]report // limit hash → the peer's demand and share
}

// report is one instance's state for one limit.
type report struct {
	demand float64 // units per second, smoothed
	share  float64 // the fraction of the limit the instance holds
}

// entry is one origin's report on the wire.
type entry struct {
	origin  string
	seq     uint64
	age     time.Duration // how long ago the sender heard it; 0 from the origin
	leaving bool
	limits  map[uint64]report
}

const (
	wireVersion = 2
	reportSize  = 16 // hash u64, demand f32, share f32
)

var errPayload = errors.New("ratelimit: malformed exchange payload")

// appendEntry encodes one entry:
//
//	origin (uvarint length, bytes) · seq (uvarint) · age in ms (uvarint) ·
//	flags (byte; 1 = leaving) · count (uvarint) ·
//	count × (hash u64le, demand f32le, share f32le)
func appendEntry(b []byte, e *entry) []byte {
	b = binary.AppendUvarint(b, uint64(len(e.origin)))
	b = append(b, e.origin...)
	b = binary.AppendUvarint(b, e.seq)
	b = binary.AppendUvarint(b, uint64(e.age/time.Millisecond))
	var flags byte
	if e.leaving {
		flags = 1
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(len(e.limits)))
	for h, r := range e.limits {
		b = binary.LittleEndian.AppendUint64(b, h)
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(r.demand)))
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(r.share)))
	}
	return b
}

// decode parses a payload: version byte, entry count, entries.
func decode(p []byte) ([]entry, error) {
	if len(p) < 2 || p[0] != wireVersion {
		return nil, fmt.Errorf("%w: bad version or too short (%d bytes)", errPayload, len(p))
	}
	p = p[1:]
	uv := func() (uint64, error) {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			return 0, fmt.Errorf("%w: truncated varint", errPayload)
		}
		p = p[n:]
		return v, nil
	}
	count, err := uv()
	if err != nil {
		return nil, err
	}
	if count > uint64(len(p)) {
		return nil, fmt.Errorf("%w: %d entries in %d bytes", errPayload, count, len(p))
	}
	out := make([]entry, 0, count)
	for range count {
		var e entry
		ln, err := uv()
		if err != nil {
			return nil, err
		}
		if ln == 0 || ln > uint64(len(p)) {
			return nil, fmt.Errorf("%w: origin length %d", errPayload, ln)
		}
		e.origin = string(p[:ln])
		p = p[ln:]
		if e.seq, err = uv(); err != nil {
			return nil, err
		}
		age, err := uv()
		if err != nil {
			return nil, err
		}
		e.age = time.Duration(min(age, uint64(math.MaxInt64/int64(time.Millisecond)))) * time.Millisecond
		if len(p) < 1 {
			return nil, fmt.Errorf("%w: truncated flags", errPayload)
		}
		e.leaving = p[0]&1 != 0
		p = p[1:]
		n, err := uv()
		if err != nil {
			return nil, err
		}
		if n > uint64(len(p))/reportSize {
			return nil, fmt.Errorf("%w: %d limits in %d bytes", errPayload, n, len(p))
		}
		e.limits = make(map[uint64]report, n)
		for range n {
			h := binary.LittleEndian.Uint64(p)
			d := float64(math.Float32frombits(binary.LittleEndian.Uint32(p[8:])))
			sh := float64(math.Float32frombits(binary.LittleEndian.Uint32(p[12:])))
			p = p[reportSize:]
			if math.IsNaN(d) || math.IsInf(d, 0) || d < 0 {
				return nil, fmt.Errorf("%w: demand %v", errPayload, d)
			}
			if math.IsNaN(sh) || sh < 0 || sh > 1 {
				return nil, fmt.Errorf("%w: share %v", errPayload, sh)
			}
			e.limits[h] = report{demand: d, share: sh}
		}
		out = append(out, e)
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errPayload, len(p))
	}
	return out, nil
}

// LocalState returns every entry this instance holds that is still live:
// its own and its peers', with their ages. It is the push/pull payload.
func (l *Limiter) LocalState() []byte {
	now := l.cfg.Now()
	l.viewMu.Lock()
	defer l.viewMu.Unlock()
	b := []byte{wireVersion}
	var count uint64
	var body []byte
	if l.own != nil {
		body = append(body, l.own...)
		count++
	}
	for origin, p := range l.peers {
		age := now.Sub(p.heard)
		if age > l.cfg.PeerTimeout {
			continue
		}
		body = appendEntry(body, &entry{origin: origin, seq: p.seq, age: max(age, 0), leaving: p.leaving, limits: p.limits})
		count++
	}
	b = binary.AppendUvarint(b, count)
	return append(b, body...)
}

// Merge folds a peer's payload (a broadcast or a LocalState) into this
// instance's view. from is the gossip sender and is informational: each
// entry names its origin. Malformed payloads are counted and ignored.
func (l *Limiter) Merge(from string, payload []byte) {
	entries, err := decode(payload)
	now := l.cfg.Now()
	l.viewMu.Lock()
	defer l.viewMu.Unlock()
	if err != nil {
		l.mergeErr = fmt.Errorf("from %s: %w", from, err)
		l.metrics.exchangeErrors.Inc()
		return
	}
	for i := range entries {
		e := &entries[i]
		if e.origin == l.cfg.Instance {
			continue
		}
		p := l.peers[e.origin]
		if p != nil && e.seq <= p.seq {
			continue
		}
		heard := now.Add(-e.age)
		if now.Sub(heard) > l.cfg.PeerTimeout {
			continue
		}
		if p == nil {
			p = &peer{}
			l.peers[e.origin] = p
		}
		p.seq, p.heard, p.leaving, p.limits = e.seq, heard, e.leaving, e.limits
		if !e.leaving {
			l.heard = true
		}
	}
}

// initialShare is the share a limit starts with. Caller holds updateMu.
func (l *Limiter) initialShare(now time.Time) float64 {
	l.viewMu.Lock()
	defer l.viewMu.Unlock()
	live := 0
	for _, p := range l.peers {
		if !p.leaving && now.Sub(p.heard) <= l.cfg.PeerTimeout {
			live++
		}
	}
	switch {
	case live > 0:
		return 1 / float64(live+1)
	case !l.heard && now.Sub(l.started) < l.cfg.Warmup:
		return l.cfg.InitialShare
	}
	return 1
}

// Sync folds the demand measured since the last call into each limit's
// estimate, recomputes every share from the current view, resizes the
// local buckets and returns this instance's entry as a broadcast payload.
// Run calls it every SyncInterval; tests with a fake clock call it directly.
func (l *Limiter) Sync() []byte {
	return l.SyncAt(l.cfg.Now())
}

// SyncAt is Sync at a given time.
func (l *Limiter) SyncAt(now time.Time) []byte {
	// updateMu keeps every tenant's set of limits fixed between the fold
	// and the resize; Update is rare and neither is on the request path.
	l.updateMu.Lock()
	defer l.updateMu.Unlock()
	ns := now.UnixNano()
	tbl := *l.tenants.Load()
	ts := make([]*tenant, 0, len(tbl))
	for _, t := range tbl {
		ts = append(ts, t)
	}

	dt := l.cfg.SyncInterval.Seconds()
	if !l.lastSync.IsZero() && now.After(l.lastSync) {
		dt = now.Sub(l.lastSync).Seconds()
	}
	l.lastSync = now
	alpha := 1 - math.Exp(-dt/l.cfg.DemandTimeConstant.Seconds())

	// Fold the demand measured since the last sync, under each tenant's
	// lock. Only Sync writes lim.demand, and updateMu serialises Syncs.
	var lims []*limit
	for _, t := range ts {
		t.mu.Lock()
		for _, lim := range t.all {
			sample := lim.pending / dt
			lim.pending = 0
			lim.demand = math.Max(0, lim.demand+alpha*(sample-lim.demand))
			lims = append(lims, lim)
		}
		t.mu.Unlock()
	}

	// Fresh peers' shares follow their demand. A peer silent for longer
	// than StaleAfter (cut off, or its reports lost) keeps the share it
	// last reported, so a partition leaves every side with what it held and
	// demand growing on one side cannot squeeze the other; after
	// PeerTimeout it holds nothing.
	l.viewMu.Lock()
	var fresh, held []*peer
	for origin, p := range l.peers {
		switch age := now.Sub(p.heard); {
		case age > 2*l.cfg.PeerTimeout:
			delete(l.peers, origin)
		case p.leaving || age > l.cfg.PeerTimeout:
		case age > l.cfg.StaleAfter:
			held = append(held, p)
		default:
			fresh = append(fresh, p)
		}
	}
	warming := len(fresh)+len(held) == 0 && !l.heard && now.Sub(l.started) < l.cfg.Warmup
	shares := make([]float64, len(lims))
	saturated := make([]bool, len(lims)) // total demand above the limit
	for i, lim := range lims {
		if warming {
			shares[i] = l.cfg.InitialShare
			continue
		}
		floor := l.cfg.MinShare * lim.perSec
		self := math.Max(lim.demand, floor)
		others, demand := 0.0, lim.demand
		for _, p := range fresh {
			r := p.limits[lim.hash]
			others += math.Max(r.demand, floor)
			demand += r.demand
		}
		var heldShare float64
		for _, p := range held {
			r, ok := p.limits[lim.hash]
			if !ok { // no demand there when it went quiet: the floor's share
				r.share = floor / (self + others + floor)
			}
			heldShare += r.share
			demand += r.demand
		}
		heldShare = math.Min(heldShare, 1-l.cfg.MinShare)
		shares[i] = (1 - heldShare) * self / (self + others)
		saturated[i] = demand > lim.perSec
	}
	l.viewMu.Unlock()

	// Resize every local bucket to its new share.
	own := &entry{origin: l.cfg.Instance, limits: map[uint64]report{}}
	i := 0
	for _, t := range ts {
		t.mu.Lock()
		for _, lim := range t.all {
			share := shares[i]
			burst := lim.burst
			if saturated[i] {
				burst = math.Min(burst, lim.perSec*l.cfg.SaturatedBurst.Seconds())
			}
			lim.share = share
			lim.b.advance(ns)
			lim.b.resize(lim.perSec*share, burst*share)
			lim.shareG.Set(share)
			if lim.demand > 1e-9 {
				own.limits[lim.hash] = report{demand: lim.demand, share: share}
			}
			i++
		}
		t.mu.Unlock()
	}

	l.viewMu.Lock()
	defer l.viewMu.Unlock()
	l.seq = max(l.seq+1, uint64(ns))
	own.seq, own.leaving = l.seq, l.leaving
	l.own = appendEntry(l.own[:0], own)
	return append([]byte{wireVersion, 1}, l.own...)
}

// Leave marks this instance as leaving and returns a payload that tells
// peers to release its shares at once. Broadcast it before shutting down.
func (l *Limiter) Leave() []byte {
	l.viewMu.Lock()
	l.leaving = true
	l.viewMu.Unlock()
	return l.Sync()
}

// Run calls Sync every SyncInterval and hands each payload to publish (for
// example a gossip node's Broadcast for the Limiter's channel) until ctx is
// done; it then publishes the leaving tombstone and returns ctx's error.
// publish is called from Run's goroutine only and should not block for
// long: a slow publish delays the next sync.
func (l *Limiter) Run(ctx context.Context, publish func(payload []byte)) error {
	tick := time.NewTicker(l.cfg.SyncInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			publish(l.Leave())
			return ctx.Err()
		case <-tick.C:
			publish(l.Sync())
		}
	}
}

// Peer is what this instance knows of another, for status pages and tests.
type Peer struct {
	Instance string
	// Seq orders the peer's reports; it is the peer's clock in Unix
	// nanoseconds at its last sync (or one more than its previous Seq).
	Seq uint64
	// Heard is when the peer produced its last report, on this clock.
	Heard   time.Time
	Leaving bool
	// Held is true while the peer is silent for longer than StaleAfter:
	// it keeps the share it had instead of one that follows its demand.
	Held bool
	// Live is false once Heard is older than PeerTimeout or the peer left:
	// it no longer holds a share.
	Live bool
}

// Peers returns the peers this instance has heard from, sorted by name.
func (l *Limiter) Peers() []Peer {
	now := l.cfg.Now()
	l.viewMu.Lock()
	defer l.viewMu.Unlock()
	out := make([]Peer, 0, len(l.peers))
	for name, p := range l.peers {
		out = append(out, Peer{
			Instance: name, Seq: p.seq, Heard: p.heard, Leaving: p.leaving,
			Held: !p.leaving && now.Sub(p.heard) > l.cfg.StaleAfter && now.Sub(p.heard) <= l.cfg.PeerTimeout,
			Live: !p.leaving && now.Sub(p.heard) <= l.cfg.PeerTimeout,
		})
	}
	slices.SortFunc(out, func(a, b Peer) int { return strings.Compare(a.Instance, b.Instance) })
	return out
}
