package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"time"
)

// PodConfig describes one simulated model-server pod.
type PodConfig struct {
	// Name identifies the pod in outcomes and metrics, e.g. "h100-0".
	Name string `json:"name"`
	// Profile is the GPU and engine configuration.
	Profile Profile `json:"profile"`
	// Model is the served model name; "" means Profile.Model.Name.
	Model string `json:"model,omitempty"`
	// Adapters are the LoRA adapters the pod can serve (vLLM's
	// --lora-modules). Requests for others fail with ErrUnknownAdapter.
	Adapters []string `json:"adapters,omitempty"`
	// Labels are free-form pod labels (GPU generation, pool, Region) for
	// whoever builds an endpoint list from the fleet. The model ignores them.
	Labels map[string]string `json:"labels,omitempty"`
	// Seed seeds the pod's random source (fault draws). Equal seeds give
	// equal runs.
	Seed uint64 `json:"seed,omitempty"`
	// Faults are injected from the start; change them with SetFaults.
	Faults Faults `json:"faults,omitempty"`
}

// ModelName is the served base model name.
func (c *PodConfig) ModelName() string {
	if c.Model != "" {
		return c.Model
	}
	return c.Profile.Model.Name
}

// Pod is the clock-agnostic model of one vLLM engine: FCFS waiting and
// running queues, a per-step token budget with chunked prefill, a bounded KV
// cache with prefix caching and preemption by recompute, and a bounded set
// of resident LoRA adapters.
//
// Time advances only through BeginStep and EndStep, one vLLM engine
// iteration at a time: BeginStep(now) schedules the batch and returns how
// long the step takes; EndStep(now+d) applies its progress. The caller owns
// the clock: Engine drives it on virtual time, LivePod on the wall clock.
// A Pod is not safe for concurrent use; its driver serialises calls.
type Pod struct {
	cfg     PodConfig
	prof    *Profile
	model   string
	faults  Faults
	rng     *rand.Rand
	adapter map[string]bool // adapters this pod may serve

	waiting []*seq
	running []*seq
	batch   []*seq // scheduled in the current step
	byReq   map[*Request]*seq
	inStep  bool

	cache   *prefixCache
	private int // KV blocks held by sequences outside the prefix cache

	resident map[string]*loraSlot
	loads    int // adapters loaded in the current step

	events []Event
	stats  podStats

	// Engine bookkeeping; unused by other drivers.
	engine    *Engine
	stepping  bool
	stepEnd   func()
	stepEndAt time.Duration // when the step in progress ends
}

type loraSlot struct {
	running  int
	lastUsed time.Duration
}

type podStats struct {
	hits, queries        uint64 // prefix cache, in tokens
	promptTokens         uint64 // prompt tokens computed (not cached)
	generationTokens     uint64
	preemptions          uint64
	adapterLoads         uint64
	requestsOK, failures uint64
}

// seq is one request inside the pod.
type seq struct {
	req     *Request
	tag     any
	arrival time.Duration

	target    int // tokens to prefill: the prompt, or prompt+generated after a preemption
	computed  int // of target
	generated int
	kvTokens  int // tokens whose KV is held

	private      int // KV blocks held outside the prefix cache
	pinned       []*cacheEntry
	pinnedBlocks int
	promoted     int // PrefixHashes entries pinned so far

	scheduled   int // tokens in the current step
	firstToken  time.Duration
	cached      int
	cachedSet   bool
	preemptions int
	running     bool
	done        bool
	watch       bool
	watchFirst  bool // report the first token (EventToken) even unwatched
	cancel      bool // cancelled during a step; failed at EndStep
}

// EventKind says what an Event reports.
type EventKind int

const (
	// EventToken reports new output tokens of a watched request.
	EventToken EventKind = iota
	// EventDone reports a request that generated all its tokens.
	EventDone
	// EventFailed reports a request that failed; Outcome.Err says why.
	EventFailed
)

// Event is a change to one request reported by EndStep or Cancel.
type Event struct {
	Kind EventKind
	// Tag is the value passed to Submit.
	Tag any
	// Tokens is the request's generated-token count after this step.
	Tokens int
	// Outcome is set for EventDone and EventFailed.
	Outcome Outcome
}

// NewPod validates cfg and builds an idle pod.
func NewPod(cfg PodConfig) (*Pod, error) {
	if err := cfg.Profile.Validate(); err != nil {
		return nil, fmt.Errorf("pod %s: %w", cfg.Name, err)
	}
	if err := cfg.Faults.Validate(); err != nil {
		return nil, fmt.Errorf("pod %s: %w", cfg.Name, err)
	}
	if len(cfg.Adapters) > 0 && cfg.Profile.MaxLoRAs == 0 {
		return nil, fmt.Errorf("pod %s: adapters given but profile %s has maxLoRAs 0", cfg.Name, cfg.Profile.Name)
	}
	p := &Pod{
		cfg:      cfg,
		model:    cfg.ModelName(),
		faults:   cfg.Faults,
		rng:      rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		adapter:  make(map[string]bool, len(cfg.Adapters)),
		byReq:    make(map[*Request]*seq),
		cache:    newPrefixCache(),
		resident: make(map[string]*loraSlot),
	}
	p.prof = &p.cfg.Profile
	for _, a := range cfg.Adapters {
		if a == "" {
			return nil, fmt.Errorf("pod %s: empty adapter name", cfg.Name)
		}
		p.adapter[a] = true
	}
	return p, nil
}

// Name is the pod's name.
func (p *Pod) Name() string { return p.cfg.Name }

// Config returns the pod's configuration (Faults as at start).
func (p *Pod) Config() PodConfig { return p.cfg }

// Model is the served base model name.
func (p *Pod) Model() string { return p.model }

// HasAdapter reports whether the pod serves the named adapter.
func (p *Pod) HasAdapter(name string) bool { return p.adapter[name] }

// SetServed changes what the pod serves, as a restart of vLLM with other
// --lora-modules and --max-model-len would: the adapters it has registered
// and the longest request it accepts (0 keeps the profile's). Requests in
// flight are not affected.
func (p *Pod) SetServed(adapters []string, maxModelLen int) error {
	if len(adapters) > 0 && p.prof.MaxLoRAs == 0 {
		return fmt.Errorf("pod %s: adapters given but profile %s has maxLoRAs 0", p.cfg.Name, p.prof.Name)
	}
	if maxModelLen < 0 {
		return fmt.Errorf("pod %s: max model length %d", p.cfg.Name, maxModelLen)
	}
	p.cfg.Adapters = slices.Clone(adapters)
	p.adapter = make(map[string]bool, len(adapters))
	for _, a := range adapters {
		p.adapter[a] = true
	}
	if maxModelLen > 0 {
		p.prof.MaxModelLen = maxModelLen // the pod's own copy (p.cfg.Profile)
	}
	return nil
}

// Faults returns the faults in force.
func (p *Pod) Faults() Faults { return p.faults }

// SetFaults replaces the faults in force. Clearing Hang lets the driver
// step again; the driver must be told (Engine.SetFaults, LivePod.SetFaults).
func (p *Pod) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("pod %s: %w", p.cfg.Name, err)
	}
	p.faults = f
	return nil
}

// Busy reports whether the pod has requests to work on.
func (p *Pod) Busy() bool { return len(p.waiting)+len(p.running) > 0 }

// Submit queues r at time now. It returns an error wrapping one of the
// Err* reasons if the pod refuses the request at once (bad request,
// injected error or rate limit); then no events follow for it. The tag is
// returned in the request's events. r must not change until its final
// event.
func (p *Pod) Submit(now time.Duration, r *Request, tag any) error {
	if err := p.admissible(r); err != nil {
		p.stats.failures++
		return err
	}
	if _, dup := p.byReq[r]; dup {
		return fmt.Errorf("pod %s: request %q submitted twice: %w", p.cfg.Name, r.ID, ErrInvalidRequest)
	}
	if p.faults.ErrorRate > 0 || p.faults.RejectRate > 0 {
		x := p.rng.Float64()
		switch {
		case x < p.faults.ErrorRate:
			p.stats.failures++
			return fmt.Errorf("pod %s: %w", p.cfg.Name, ErrServerError)
		case x < p.faults.ErrorRate+p.faults.RejectRate:
			p.stats.failures++
			return fmt.Errorf("pod %s: %w", p.cfg.Name, ErrRateLimited)
		}
	}
	s := &seq{req: r, tag: tag, arrival: now, target: r.PromptTokens, firstToken: -1}
	p.byReq[r] = s
	p.waiting = append(p.waiting, s)
	return nil
}

// Watch asks for an EventToken event at every step that gives the request
// submitted as r new tokens (a streaming client). Unwatched requests report
// only their end.
func (p *Pod) Watch(r *Request) {
	if s := p.byReq[r]; s != nil {
		s.watch = true
	}
}

// WatchFirst asks for one EventToken event, at the step that gives the
// request submitted as r its first token (unless it also finishes then).
func (p *Pod) WatchFirst(r *Request) {
	if s := p.byReq[r]; s != nil {
		s.watchFirst = true
	}
}

func (p *Pod) admissible(r *Request) error {
	switch {
	case r.PromptTokens < 1 || r.OutputTokens < 1:
		return fmt.Errorf("request %q: prompt %d and output %d tokens must both be at least 1: %w",
			r.ID, r.PromptTokens, r.OutputTokens, ErrInvalidRequest)
	case len(r.PrefixHashes) > 0 && (r.HashBlockTokens <= 0 || r.HashBlockTokens%p.prof.BlockSize != 0):
		return fmt.Errorf("request %q: hashBlockTokens %d must be a positive multiple of block size %d: %w",
			r.ID, r.HashBlockTokens, p.prof.BlockSize, ErrInvalidRequest)
	case len(r.PrefixHashes) > 0 && (len(r.PrefixHashes)-1)*r.HashBlockTokens >= r.PromptTokens:
		return fmt.Errorf("request %q: %d prefix hashes of %d tokens exceed a %d-token prompt: %w",
			r.ID, len(r.PrefixHashes), r.HashBlockTokens, r.PromptTokens, ErrInvalidRequest)
	case r.PromptTokens+r.OutputTokens > p.prof.MaxModelLen:
		return fmt.Errorf("request %q: %d prompt + %d output tokens exceed max model length %d: %w",
			r.ID, r.PromptTokens, r.OutputTokens, p.prof.MaxModelLen, ErrContextLength)
	case p.blocksFor(r.PromptTokens+r.OutputTokens) > p.prof.NumGPUBlocks:
		return fmt.Errorf("request %q: needs more than the pod's %d KV blocks: %w",
			r.ID, p.prof.NumGPUBlocks, ErrContextLength)
	case r.Adapter != "" && !p.adapter[r.Adapter]:
		return fmt.Errorf("pod %s does not serve adapter %q: %w", p.cfg.Name, r.Adapter, ErrUnknownAdapter)
	}
	return nil
}

func (p *Pod) blocksFor(tokens int) int {
	return (tokens + p.prof.BlockSize - 1) / p.prof.BlockSize
}

func (p *Pod) freeBlocks() int {
	return p.prof.NumGPUBlocks - p.private - p.cache.blocks
}

// reserve makes need blocks free by evicting idle cached blocks; it
// reports whether it succeeded.
func (p *Pod) reserve(need int) bool {
	if short := need - p.freeBlocks(); short > 0 {
		p.cache.evict(short)
	}
	return need <= p.freeBlocks()
}

// BeginStep schedules one engine step at time now and returns its
// duration. ok is false when there is nothing to do (or the pod hangs);
// then EndStep must not be called. Running requests go first (one decode
// token each, or their next prefill chunk), preempting the most recently
// admitted ones if KV blocks run out; then waiting requests are admitted
// FCFS while the token budget, max-num-seqs, KV blocks and LoRA slots allow.
func (p *Pod) BeginStep(now time.Duration) (d time.Duration, ok bool) {
	if p.inStep {
		panic("sim: BeginStep called twice without EndStep")
	}
	if p.faults.Hang || !p.Busy() {
		return 0, false
	}
	budget := p.prof.MaxBatchedTokens
	p.batch = p.batch[:0]
	p.loads = 0
	preempted := false
	for i := 0; i < len(p.running) && budget > 0; i++ {
		s := p.running[i]
		n := 1
		if s.computed < s.target {
			n = min(s.target-s.computed, budget)
		}
		need := max(0, p.blocksFor(s.kvTokens+n)-s.pinnedBlocks-s.private)
		for !p.reserve(need) {
			victim := p.running[len(p.running)-1]
			p.preempt(now, victim)
			preempted = true
			if victim == s {
				break
			}
		}
		if !s.running {
			break // s preempted itself: it was the last one
		}
		s.private += need
		p.private += need
		s.scheduled = n
		budget -= n
		p.batch = append(p.batch, s)
	}
	if !preempted {
		budget = p.admit(now, budget)
	}
	if len(p.batch) == 0 {
		// Cannot happen: with nothing running every adapter slot and every
		// cached block can be freed, and Submit refused requests larger
		// than the cache. Were it to, reporting idle makes the engine end
		// the run and fail the waiting requests with ErrUnfinished rather
		// than spin.
		return 0, false
	}
	var c stepCost
	for _, s := range p.batch {
		c.tokens += s.scheduled
		if s.computed < s.target {
			c.attnPairs += float64(s.scheduled) * (float64(s.computed) + float64(s.scheduled)/2)
			c.kvReadToken += float64(s.computed)
		} else {
			c.attnPairs += float64(s.kvTokens)
			c.kvReadToken += float64(s.kvTokens)
		}
	}
	c.loads = p.loads
	d = p.prof.stepTime(c)
	if f := p.faults.SlowFactor; f > 0 && f != 1 {
		d = time.Duration(float64(d) * f)
	}
	p.inStep = true
	return d, true
}

// admit moves waiting requests into the running batch FCFS and returns the
// budget left. A request whose adapter cannot get a slot is skipped (later
// ones may still run), as vLLM does; one that does not fit in KV stops
// admission.
func (p *Pod) admit(now time.Duration, budget int) int {
	for i := 0; i < len(p.waiting) && budget > 0 && len(p.running) < p.prof.MaxNumSeqs; {
		s := p.waiting[i]
		evict, load, ok := p.loraSlot(s.req.Adapter)
		if !ok {
			i++
			continue
		}
		hashes := s.req.PrefixHashes
		m := p.cache.match(hashes)
		cachedTokens := min(m*s.req.HashBlockTokens, s.req.PromptTokens)
		if m > 0 && cachedTokens >= s.target {
			// vLLM recomputes at least the last block to get logits.
			m--
			cachedTokens = m * s.req.HashBlockTokens
		}
		for j, h := range hashes[:m] {
			s.pinned = append(s.pinned, p.cache.pin(h))
			s.pinnedBlocks += p.chunkBlocks(s.req, j)
		}
		n := min(s.target-cachedTokens, budget)
		need := max(0, p.blocksFor(cachedTokens+n)-s.pinnedBlocks)
		if !p.reserve(need) {
			p.unpinAll(s)
			break
		}
		if load {
			if evict != "" {
				delete(p.resident, evict)
			}
			p.resident[s.req.Adapter] = &loraSlot{}
			p.loads++
			p.stats.adapterLoads++
		}
		p.loraUse(now, s.req.Adapter)
		p.waiting = slices.Delete(p.waiting, i, i+1)
		s.running = true
		s.computed, s.kvTokens, s.promoted = cachedTokens, cachedTokens, m
		s.private = need
		p.private += need
		if !s.cachedSet {
			s.cached, s.cachedSet = cachedTokens, true
		}
		p.stats.queries += uint64(s.req.PromptTokens)
		p.stats.hits += uint64(cachedTokens)
		s.scheduled = n
		budget -= n
		p.running = append(p.running, s)
		p.batch = append(p.batch, s)
	}
	return budget
}

// loraSlot reports whether a request for adapter may join the batch and,
// if the adapter is not resident, that it must be loaded (load) into a free
// slot or in place of the least recently used idle adapter (evict).
func (p *Pod) loraSlot(adapter string) (evict string, load, ok bool) {
	if adapter == "" {
		return "", false, true
	}
	if _, ok := p.resident[adapter]; ok {
		return "", false, true
	}
	if len(p.resident) < p.prof.MaxLoRAs {
		return "", true, true
	}
	found := false
	var oldest time.Duration
	for name, slot := range p.resident {
		if slot.running > 0 {
			continue
		}
		if !found || slot.lastUsed < oldest || (slot.lastUsed == oldest && name < evict) {
			evict, oldest, found = name, slot.lastUsed, true
		}
	}
	return evict, found, found
}

func (p *Pod) loraUse(now time.Duration, adapter string) {
	if slot := p.resident[adapter]; slot != nil {
		slot.running++
		slot.lastUsed = now
	}
}

func (p *Pod) loraRelease(now time.Duration, adapter string) {
	if slot := p.resident[adapter]; slot != nil {
		slot.running--
		slot.lastUsed = now
	}
}

// preempt evicts a running request back to the head of the waiting queue;
// its KV cache is dropped and recomputed (prompt and tokens generated so
// far) when it is scheduled again.
func (p *Pod) preempt(now time.Duration, s *seq) {
	p.removeRunning(s)
	p.release(now, s)
	s.target = s.req.PromptTokens + s.generated
	s.computed, s.kvTokens, s.promoted = 0, 0, 0
	s.preemptions++
	p.stats.preemptions++
	p.waiting = slices.Insert(p.waiting, 0, s)
}

func (p *Pod) removeRunning(s *seq) {
	if i := slices.Index(p.running, s); i >= 0 {
		p.running = slices.Delete(p.running, i, i+1)
	}
}

// release frees the request's private blocks, its cache references and
// its adapter slot use.
func (p *Pod) release(now time.Duration, s *seq) {
	p.private -= s.private
	s.private = 0
	p.unpinAll(s)
	if s.running {
		p.loraRelease(now, s.req.Adapter)
		s.running = false
	}
}

// unpinAll drops the request's cache references, deepest block first so
// that the deepest blocks are the first evicted (as vLLM frees them).
func (p *Pod) unpinAll(s *seq) {
	for i := len(s.pinned) - 1; i >= 0; i-- {
		p.cache.unpin(s.pinned[i])
	}
	s.pinned = s.pinned[:0]
	s.pinnedBlocks = 0
}

// promote hands the request's fully computed prefix blocks to the prefix
// cache, sharing an existing copy when another request cached it first.
func (p *Pod) promote(s *seq) {
	h := s.req.HashBlockTokens
	for s.promoted < len(s.req.PrefixHashes) {
		if end := min((s.promoted+1)*h, s.req.PromptTokens); end > s.computed {
			return
		}
		blocks := p.chunkBlocks(s.req, s.promoted)
		hash := s.req.PrefixHashes[s.promoted]
		e := p.cache.pin(hash)
		if e == nil {
			e = p.cache.insert(hash, blocks)
		}
		// The request's private copy is dropped either way: moved into
		// the cache, or discarded in favour of the shared one.
		moved := min(blocks, s.private)
		s.private -= moved
		p.private -= moved
		s.pinned = append(s.pinned, e)
		s.pinnedBlocks += blocks
		s.promoted++
	}
}

// chunkBlocks is the KV blocks covered by the request's i-th prefix hash
// (the last one may cover a partial chunk).
func (p *Pod) chunkBlocks(r *Request, i int) int {
	start := i * r.HashBlockTokens
	end := min(start+r.HashBlockTokens, r.PromptTokens)
	return p.blocksFor(end) - p.blocksFor(start)
}

// EndStep applies the step begun by BeginStep, at time now (normally the
// step's start plus its duration), and returns the events it caused. The
// returned slice is reused by the next call.
func (p *Pod) EndStep(now time.Duration) []Event {
	if !p.inStep {
		panic("sim: EndStep without BeginStep")
	}
	p.inStep = false
	p.events = p.events[:0]
	finished := false
	for _, s := range p.batch {
		n := s.scheduled
		s.scheduled = 0
		if s.cancel {
			p.events = append(p.events, p.finish(now, s, fmt.Errorf("pod %s: %w", p.cfg.Name, ErrCancelled)))
			finished = true
			continue
		}
		if s.computed < s.target {
			s.computed += n
			s.kvTokens += n
			p.stats.promptTokens += uint64(n)
			p.promote(s)
			if s.computed < s.target {
				continue // more prefill chunks to go
			}
		} else {
			s.kvTokens++
		}
		s.generated++
		p.stats.generationTokens++
		first := s.firstToken < 0
		if first {
			s.firstToken = now
		}
		switch {
		case s.generated >= s.req.OutputTokens:
			p.events = append(p.events, p.finish(now, s, nil))
			finished = true
		case p.faults.CrashAfterTokens > 0 && s.generated >= p.faults.CrashAfterTokens:
			p.events = append(p.events, p.finish(now, s, fmt.Errorf("pod %s: after %d tokens: %w", p.cfg.Name, s.generated, ErrCrashed)))
			finished = true
		case s.watch || first && s.watchFirst:
			p.events = append(p.events, Event{Kind: EventToken, Tag: s.tag, Tokens: s.generated})
		}
	}
	if finished {
		p.running = slices.DeleteFunc(p.running, func(s *seq) bool { return s.done })
	}
	return p.events
}

// finish records a request's end and returns its event. The caller removes
// it from the running queue.
func (p *Pod) finish(now time.Duration, s *seq, err error) Event {
	s.done = true
	p.release(now, s)
	delete(p.byReq, s.req)
	kind := EventDone
	if err != nil {
		kind = EventFailed
		p.stats.failures++
	} else {
		p.stats.requestsOK++
	}
	return Event{Kind: kind, Tag: s.tag, Tokens: s.generated, Outcome: p.outcome(now, s, err)}
}

func (p *Pod) outcome(now time.Duration, s *seq, err error) Outcome {
	return Outcome{
		Request:      s.req,
		Pod:          p.cfg.Name,
		Arrival:      s.arrival,
		FirstToken:   s.firstToken,
		Finish:       now,
		CachedTokens: s.cached,
		OutputTokens: s.generated,
		Preemptions:  s.preemptions,
		Err:          err,
	}
}

// Cancel withdraws r (its client went away) and frees what it holds. A
// request outside the current step is failed at once and its EventFailed
// (wrapping ErrCancelled) returned in a new slice; one in the current step
// is failed by EndStep, which reports the event. It returns false if r is
// not in the pod.
func (p *Pod) Cancel(now time.Duration, r *Request) ([]Event, bool) {
	s := p.byReq[r]
	if s == nil || s.cancel {
		return nil, false
	}
	if p.inStep && s.scheduled > 0 {
		s.cancel = true
		return nil, true
	}
	if s.running {
		p.removeRunning(s)
	} else if i := slices.Index(p.waiting, s); i >= 0 {
		p.waiting = slices.Delete(p.waiting, i, i+1)
	}
	return []Event{p.finish(now, s, fmt.Errorf("pod %s: %w", p.cfg.Name, ErrCancelled))}, true
}

// Drain fails every request still in the pod with err, running ones first
// then waiting ones in queue order, and returns their events in a new
// slice. It must not be called between BeginStep and EndStep.
func (p *Pod) Drain(now time.Duration, err error) []Event {
	if p.inStep {
		panic("sim: Drain during a step")
	}
	all := append(append([]*seq(nil), p.running...), p.waiting...)
	p.running, p.waiting = p.running[:0], p.waiting[:0]
	var evs []Event
	for _, s := range all {
		evs = append(evs, p.finish(now, s, fmt.Errorf("pod %s: %w", p.cfg.Name, err)))
	}
	return evs
}

// Metrics is a pod's state as its /metrics endpoint reports it.
type Metrics struct {
	// Waiting and Running count requests in each queue.
	Waiting, Running int
	// KVCacheUsage is the fraction of KV blocks held by running requests
	// (vllm:kv_cache_usage_perc, 0–1). Cached blocks nobody uses count as
	// free, as in vLLM.
	KVCacheUsage float64
	// RunningAdapters and WaitingAdapters are the sorted distinct adapters
	// of running and waiting requests.
	RunningAdapters, WaitingAdapters []string
	// MaxLoRA is the number of adapter slots.
	MaxLoRA int
	// BlockSize and NumGPUBlocks describe the KV cache.
	BlockSize, NumGPUBlocks int
	// PrefixCacheHits and PrefixCacheQueries count prompt tokens found in
	// and looked up in the prefix cache.
	PrefixCacheHits, PrefixCacheQueries uint64
	// PromptTokens counts prompt tokens computed (cache misses and
	// recomputation); GenerationTokens counts output tokens.
	PromptTokens, GenerationTokens uint64
	// Preemptions counts preemptions by recompute.
	Preemptions uint64
	// AdapterLoads counts LoRA adapters loaded into a slot (first loads
	// and reloads after an eviction).
	AdapterLoads uint64
	// RequestsOK and Failures count finished requests by result.
	RequestsOK, Failures uint64
}

// Metrics returns a snapshot of the pod's state.
func (p *Pod) Metrics() Metrics {
	used := p.private + p.cache.blocks - p.cache.evictable
	return Metrics{
		Waiting:            len(p.waiting),
		Running:            len(p.running),
		KVCacheUsage:       float64(used) / float64(p.prof.NumGPUBlocks),
		RunningAdapters:    adapters(p.running),
		WaitingAdapters:    adapters(p.waiting),
		MaxLoRA:            p.prof.MaxLoRAs,
		BlockSize:          p.prof.BlockSize,
		NumGPUBlocks:       p.prof.NumGPUBlocks,
		PrefixCacheHits:    p.stats.hits,
		PrefixCacheQueries: p.stats.queries,
		PromptTokens:       p.stats.promptTokens,
		GenerationTokens:   p.stats.generationTokens,
		Preemptions:        p.stats.preemptions,
		AdapterLoads:       p.stats.adapterLoads,
		RequestsOK:         p.stats.requestsOK,
		Failures:           p.stats.failures,
	}
}

func adapters(q []*seq) []string {
	var out []string
	for _, s := range q {
		if a := s.req.Adapter; a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	sort.Strings(out)
	return out
}
