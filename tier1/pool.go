package tier1

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is the live state of one scheduler's model servers: the endpoints
// with their metrics and accounting, the prefix index, and adapter demand.
// It outlives configuration reloads: a new Scheduler built over the same
// Pool keeps everything learned so far. Safe for concurrent use.
type Pool struct {
	mu    sync.Mutex // serialises membership changes
	set   atomic.Pointer[endpointSet]
	slots []bool // slot in use
	index *PrefixIndex
	lora  adapterDemand
	peers peerCounts
	// classes are the latency models shared by class (SetClass). A
	// class's model outlives its endpoints, so that a replaced pod of the
	// class resumes with what the class learned; classes with no endpoint
	// are dropped once they outnumber the endpoints (pruneClasses), so a
	// label whose values churn cannot grow the map without bound.
	classes map[string]*latencyClass
}

// latencyClass is one class's shared model and how many endpoints use it.
type latencyClass struct {
	model   *latencyModel
	members int
}

type endpointSet struct {
	list []*Endpoint // in insertion order
	byID map[string]*Endpoint
	// slots is one more than the highest slot in use: the length of
	// per-slot scratch arrays.
	slots int
}

// NewPool returns an empty pool.
func NewPool() *Pool {
	p := &Pool{index: NewPrefixIndex()}
	p.set.Store(&endpointSet{byID: map[string]*Endpoint{}})
	p.lora.counts = map[string]*adapterRate{}
	return p
}

// Add returns the endpoint with this ID, adding it (ready, without
// metrics) if it is new. An existing endpoint's address is updated.
func (p *Pool) Add(id, address string) *Endpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.set.Load()
	if ep, ok := old.byID[id]; ok {
		if ep.Address == address {
			return ep
		}
		// A new address is a new server: nothing it cached carries over.
		p.removeLocked(id)
		old = p.set.Load()
	}
	slot := slices.Index(p.slots, false)
	if slot < 0 {
		slot = len(p.slots)
		p.slots = append(p.slots, true)
	}
	p.slots[slot] = true
	ep := &Endpoint{ID: id, Address: address, slot: int32(slot)}
	ep.latency.Store(new(latencyModel))
	ep.ready.Store(true)
	next := &endpointSet{
		list:  append(slices.Clip(old.list), ep),
		byID:  make(map[string]*Endpoint, len(old.byID)+1),
		slots: max(old.slots, slot+1),
	}
	for k, v := range old.byID {
		next.byID[k] = v
	}
	next.byID[id] = ep
	p.set.Store(next)
	return ep
}

// DefaultLatencyClassLabel is the pod label whose value names an
// endpoint's latency class when the scheduler's options name none.
const DefaultLatencyClassLabel = "gpu"

// SetClass makes ep share one latency model with the pool's other
// endpoints of the same class (pods of one GPU type serving the same
// model answer alike, so their first tokens teach one model four or eight
// times as fast, and identical pods under identical load are predicted
// alike instead of by what each one's few observations happened to be).
// An empty class gives ep a model of its own. Setting the class ep
// already has keeps what its model learned.
func (p *Pool) SetClass(ep *Endpoint, class string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ep.class == class && ep.latency.Load() != nil {
		return
	}
	if c := p.classes[ep.class]; c != nil {
		c.members--
	}
	ep.class = class
	if class == "" {
		ep.latency.Store(new(latencyModel))
		return
	}
	c := p.classes[class]
	if c == nil {
		p.pruneClasses()
		if p.classes == nil {
			p.classes = map[string]*latencyClass{}
		}
		c = &latencyClass{model: new(latencyModel)}
		p.classes[class] = c
	}
	c.members++
	ep.latency.Store(c.model)
}

// pruneClasses drops the classes no endpoint uses once there are more
// classes than endpoints plus a few.
func (p *Pool) pruneClasses() {
	if len(p.classes) <= len(p.set.Load().list)+8 {
		return
	}
	for name, c := range p.classes {
		if c.members <= 0 {
			delete(p.classes, name)
		}
	}
}

// Class is ep's latency class ("" when it learns alone).
func (p *Pool) Class(ep *Endpoint) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return ep.class
}

// Remove drops an endpoint and what the prefix index knew of it.
func (p *Pool) Remove(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removeLocked(id)
}

func (p *Pool) removeLocked(id string) {
	old := p.set.Load()
	ep, ok := old.byID[id]
	if !ok {
		return
	}
	next := &endpointSet{
		list:  make([]*Endpoint, 0, len(old.list)-1),
		byID:  make(map[string]*Endpoint, len(old.byID)),
		slots: old.slots,
	}
	for _, e := range old.list {
		if e != ep {
			next.list = append(next.list, e)
			next.byID[e.ID] = e
		}
	}
	p.set.Store(next)
	if c := p.classes[ep.class]; c != nil {
		c.members--
	}
	p.index.removePod(ep.slot)
	p.slots[ep.slot] = false
}

// Endpoints returns the pool's endpoints. The slice is shared: do not
// modify it.
func (p *Pool) Endpoints() []*Endpoint { return p.set.Load().list }

// Endpoint returns the endpoint with this ID, or nil.
func (p *Pool) Endpoint(id string) *Endpoint { return p.set.Load().byID[id] }

// PrefixIndex returns the pool's prefix index.
func (p *Pool) PrefixIndex() *PrefixIndex { return p.index }

// applyPrefixEvent records another replica's dispatch in the prefix index.
// It reports false when the endpoint is unknown here (not yet discovered,
// or gone); such events are dropped. Capacity comes from the endpoint's
// metrics as for local dispatches, with the Meridian scheduler's block
// size: events are only exchanged between Meridian-mode replicas.
func (p *Pool) applyPrefixEvent(ev PrefixEvent, blockSize, defaultCapacity int) bool {
	ep := p.Endpoint(ev.Endpoint)
	if ep == nil {
		return false
	}
	p.index.addAnchored(ep.slot, meridianCapacity(ep.Metrics(), blockSize, defaultCapacity), ev.Stamp, ev.Hashes)
	return true
}

// meridianCapacity is how many blocks of blockSize characters an
// endpoint's KV cache holds: its GPU blocks × tokens per block × 4
// characters per token, over the block size; defaultCapacity when the
// server does not report its cache.
func meridianCapacity(m *Metrics, blockSize, defaultCapacity int) int {
	if m == nil || m.GPUBlocks <= 0 || m.BlockSize <= 0 || blockSize <= 0 {
		return defaultCapacity
	}
	return max(1, m.GPUBlocks*m.BlockSize*charsPerToken/blockSize)
}

// charsPerToken is the rule of thumb relating prompt characters to tokens.
const charsPerToken = 4

// adapterDemand tracks how much each LoRA adapter is asked for, as an
// exponentially decayed request count, so that loraAffinity can tell a hot
// adapter (costly to evict) from a long-tail one.
type adapterDemand struct {
	mu     sync.RWMutex
	counts map[string]*adapterRate
	total  adapterRate
}

type adapterRate struct {
	value float64
	at    int64 // UnixNano of the last update
}

// adapterHalfLife is how fast demand is forgotten.
const adapterHalfLife = 60 * time.Second

func (r *adapterRate) decayed(now int64) float64 {
	if r.at == 0 || now <= r.at {
		return r.value
	}
	return r.value * math.Exp2(-float64(now-r.at)/float64(adapterHalfLife))
}

func (d *adapterDemand) record(name string, now int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.counts[name]
	if r == nil {
		r = &adapterRate{}
		d.counts[name] = r
	}
	r.value, r.at = r.decayed(now)+1, now
	d.total.value, d.total.at = d.total.decayed(now)+1, now
}

// hotness is an adapter's demand relative to the mean adapter's: 1 is
// average, above 1 hot, 0 never asked for.
func (d *adapterDemand) hotness(name string, now int64) float64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	r := d.counts[name]
	if r == nil || len(d.counts) == 0 {
		return 0
	}
	total := d.total.decayed(now)
	if total <= 0 {
		return 0
	}
	return r.decayed(now) / total * float64(len(d.counts))
}
