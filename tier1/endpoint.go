package tier1

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Metrics is one scrape of a model server, as the scraper parsed it from
// vllm:* (or sglang:*) metrics. A Metrics value is immutable once handed to
// Endpoint.SetMetrics.
type Metrics struct {
	// Waiting and Running are vllm:num_requests_waiting and
	// vllm:num_requests_running.
	Waiting int
	Running int
	// KVCacheUsage is vllm:kv_cache_usage_perc, a fraction in [0, 1].
	KVCacheUsage float64
	// RunningAdapters and WaitingAdapters are the LoRA adapters of the
	// newest vllm:lora_requests_info series; MaxLoRA is its max_lora.
	RunningAdapters []string
	WaitingAdapters []string
	MaxLoRA         int
	// LoRAReported is false when the server exports no LoRA information
	// (no LoRA support, or SGLang): the adapter filter then lets the pod
	// through rather than guessing.
	LoRAReported bool
	// BlockSize is the server's KV block size in tokens and GPUBlocks its
	// number of KV blocks (vllm:cache_config_info); zero when unknown.
	BlockSize int
	GPUBlocks int
	// ScrapedAt is when the scrape completed, on the clock the scheduler is
	// given (wall clock live, virtual time in replay).
	ScrapedAt time.Time
}

func (m *Metrics) hasAdapter(list []string, name string) bool {
	return slices.Contains(list, name)
}

// Capabilities are what a model server can serve, as its /v1/models
// reports it (vLLM lists each served model name with its max_model_len,
// and each registered LoRA adapter as an entry whose parent is a base
// model) or as configuration states it. Unlike vllm:lora_requests_info,
// which lists only adapters running or waiting, Adapters lists every
// adapter the server would accept. A Capabilities value is immutable once
// handed to Endpoint.SetCapabilities.
type Capabilities struct {
	// Models are the base model names served.
	Models []string
	// Adapters are the LoRA adapters registered (--lora-modules or loaded
	// at run time).
	Adapters []string
	// MaxModelLen is the most prompt plus output tokens a request may
	// have (vLLM's --max-model-len); 0 when unknown.
	MaxModelLen int
	// Roots are the base models' roots, in the order of Models: what
	// the server loaded under that name (a path or repository, vLLM's
	// "root"); "" when the server does not say or says the name itself.
	Roots []string
}

// serves reports whether the server accepts requests for target: one of
// its models or adapters.
func (c *Capabilities) serves(model, adapter string) bool {
	if adapter != "" {
		return slices.Contains(c.Adapters, adapter)
	}
	return len(c.Models) == 0 || slices.Contains(c.Models, model) || slices.Contains(c.Adapters, model)
}

// fits reports whether a request of prompt plus output tokens fits the
// server's context.
func (c *Capabilities) fits(tokens int) bool {
	return c.MaxModelLen <= 0 || tokens <= c.MaxModelLen
}

// Endpoint is one model-server pod (one ip:port) of a pool: its last
// scraped metrics plus Meridian's own accounting of what was sent to it
// since. All methods are safe for concurrent use; decisions read an
// endpoint with atomic loads only.
type Endpoint struct {
	// The fields a decision reads come first, so that they share as few
	// cache lines as possible: a 512-pod decision touches every endpoint.

	slot int32 // dense index into per-pool arrays (prefix index)

	ready   atomic.Bool
	metrics atomic.Pointer[Metrics]

	// Since the last scrape: requests dispatched, their prompt tokens, and
	// completions seen. A scrape resets them, since it reflects what came
	// before it.
	dispatched atomic.Int64
	tokens     atomic.Int64
	completed  atomic.Int64
	// lastPicked is the UnixNano of the last dispatch (lru scorer).
	lastPicked atomic.Int64
	pendingN   atomic.Int32 // len(pendingAdapters), read without the lock

	// latency is the endpoint's latency model: its own, or the one its
	// class shares (Pool.SetClass). Never nil once the endpoint is added.
	latency atomic.Pointer[latencyModel]
	class   string // latency class (Pool.SetClass), under the pool's mu

	// ID is the endpoint's stable name (namespace/pod, or the address for
	// static endpoints). Prefix events name endpoints by ID.
	ID string
	// Address is host:port, what the proxy dials and what a subset hint
	// lists.
	Address string

	// inFlight is dispatched minus done since the endpoint was added.
	inFlight atomic.Int64
	// backlog is the uncached prompt tokens of requests this replica sent
	// here whose first token it has not seen: prefill work queued ahead of
	// the next request, which the scraped counts do not size.
	backlog atomic.Int64
	// peerInFlight is the other replicas' in-flight requests here, as
	// they last reported them; peerBase its value at the last scrape.
	// peerBacklog is the sum of their backlogs here (tier1/peerload.go).
	peerInFlight atomic.Int64
	peerBase     atomic.Int64
	peerBacklog  atomic.Int64

	pendingMu       sync.Mutex
	pendingAdapters []string // adapters dispatched since the last scrape

	caps atomic.Pointer[Capabilities] // nil: unknown, every request passes
}

// SetCapabilities installs what the endpoint can serve (nil: unknown).
// Meridian-mode decisions then skip the endpoint for models and adapters
// it does not serve and for requests longer than its MaxModelLen. c must
// not be modified afterwards.
func (e *Endpoint) SetCapabilities(c *Capabilities) { e.caps.Store(c) }

// Capabilities returns what SetCapabilities last installed, or nil.
func (e *Endpoint) Capabilities() *Capabilities { return e.caps.Load() }

// SetReady marks the endpoint as able (or not) to take requests: discovery
// readiness, or a failing scrape. Unready endpoints are never picked.
func (e *Endpoint) SetReady(ready bool) { e.ready.Store(ready) }

// Ready reports what SetReady last set.
func (e *Endpoint) Ready() bool { return e.ready.Load() }

// SetMetrics installs a new scrape and resets the counts of what was sent
// since the previous one. m must not be modified afterwards.
func (e *Endpoint) SetMetrics(m *Metrics) {
	e.metrics.Store(m)
	e.peerBase.Store(e.peerInFlight.Load())
	e.dispatched.Store(0)
	e.tokens.Store(0)
	e.completed.Store(0)
	e.pendingMu.Lock()
	e.pendingAdapters = e.pendingAdapters[:0]
	e.pendingN.Store(0)
	e.pendingMu.Unlock()
}

// Metrics returns the last scrape, or nil before the first.
func (e *Endpoint) Metrics() *Metrics { return e.metrics.Load() }

// InFlight is the number of requests dispatched and not yet done.
func (e *Endpoint) InFlight() int64 { return e.inFlight.Load() }

// PeerInFlight is the other replicas' in-flight requests here, as they
// last reported them (Scheduler.ApplyPeerInFlight).
func (e *Endpoint) PeerInFlight() int64 { return e.peerInFlight.Load() }

// Backlog is this replica's prefill backlog here, in prompt tokens: the
// uncached prompt tokens of the requests it sent whose first token it has
// not seen.
func (e *Endpoint) Backlog() int64 { return max(0, e.backlog.Load()) }

// PeerBacklog is the other replicas' prefill backlog here, as they last
// reported it (Scheduler.ApplyPeerInFlight).
func (e *Endpoint) PeerBacklog() int64 { return e.peerBacklog.Load() }

// LoadReport is what this replica tells the others about its load here,
// after every change (dispatch, first token, end): they apply it with
// Scheduler.ApplyPeerInFlight.
func (e *Endpoint) LoadReport() PeerLoad {
	return PeerLoad{InFlight: e.InFlight(), Backlog: e.Backlog()}
}

func (e *Endpoint) addPeerLoad(d PeerLoad) {
	e.peerInFlight.Add(d.InFlight)
	e.peerBacklog.Add(d.Backlog)
}

// load is an endpoint's state as a decision sees it: the scrape corrected
// by what Meridian sent and saw finish since.
type load struct {
	m       *Metrics
	waiting float64 // scraped waiting + dispatched since scrape not yet done
	running float64 // scraped running − completions beyond dispatches
	kv      float64 // scraped KV use + KV of prompt tokens sent since
	tokens  float64 // prompt tokens sent since the scrape
	backlog float64 // uncached prompt tokens sent and not yet first-tokened, by any replica
}

var zeroMetrics Metrics

func (e *Endpoint) load() load {
	m := e.metrics.Load()
	if m == nil {
		m = &zeroMetrics
	}
	d, c := float64(e.dispatched.Load()), float64(e.completed.Load())
	// Other replicas' requests sent since the scrape count as dispatched.
	d += float64(max(0, e.peerInFlight.Load()-e.peerBase.Load()))
	tok := float64(e.tokens.Load())
	// The prefill queued ahead is the other replicas' as well as ours: a
	// replica seeing only its own would see 1/N of it.
	backlog := max(0, e.backlog.Load()) + max(0, e.peerBacklog.Load())
	l := load{m: m, tokens: tok, backlog: float64(backlog)}
	l.waiting = float64(m.Waiting) + max(0, d-c)
	l.running = max(0, float64(m.Running)-max(0, c-d))
	l.kv = m.KVCacheUsage
	if m.GPUBlocks > 0 && m.BlockSize > 0 {
		l.kv += tok / float64(m.GPUBlocks*m.BlockSize)
	}
	return l
}

func (e *Endpoint) adapterPending(name string) bool {
	e.pendingMu.Lock()
	defer e.pendingMu.Unlock()
	return slices.Contains(e.pendingAdapters, name)
}

func (e *Endpoint) pendingAdapterCount() int { return int(e.pendingN.Load()) }

func (e *Endpoint) addPendingAdapter(name string) {
	e.pendingMu.Lock()
	defer e.pendingMu.Unlock()
	if !slices.Contains(e.pendingAdapters, name) {
		e.pendingAdapters = append(e.pendingAdapters, name)
		e.pendingN.Store(int32(len(e.pendingAdapters)))
	}
}

// Ticket is one dispatched request's bookkeeping, returned by
// Scheduler.Dispatch. The data plane reports the first token and the end of
// the request on it; a Ticket is owned by one goroutine.
type Ticket struct {
	ep       *Endpoint
	features [numFeatures]float64
	hit      float64
	backlog  int64 // this request's share of ep.backlog until its first token
	done     bool
	ttftSeen bool
}

// Endpoint is where the request went.
func (t *Ticket) Endpoint() *Endpoint { return t.ep }

// PrefixHit is the share of the request's prefix blocks the index held for
// the endpoint when it was dispatched: Meridian's estimate of the prefix
// cache hit, for the pool's hit-ratio metric.
func (t *Ticket) PrefixHit() float64 { return t.hit }

// FirstToken feeds the observed time to first token of a streamed
// response to the endpoint's latency model. Calls after the first (and
// after Answered) are ignored.
func (t *Ticket) FirstToken(ttft time.Duration) {
	if t.ep == nil || t.ttftSeen {
		return
	}
	t.ttftSeen = true
	m := t.ep.latency.Load()
	if !m.streamed.Load() { // a store only once: the model is shared by a class
		m.streamed.Store(true)
	}
	m.observe(&t.features, ttft.Seconds())
	t.clearBacklog()
}

// Answered reports the first byte of a non-streamed response, which
// arrives with the whole answer: the prompt has left the prefill
// backlog, but the time is the answer's, not its first token's, so it
// trains the latency model only while the model has seen no streamed
// first token (latencyModel.observeWhole). Calls after the first (and
// after FirstToken) are ignored.
func (t *Ticket) Answered(took time.Duration) {
	if t.ep == nil || t.ttftSeen {
		return
	}
	t.ttftSeen = true
	t.ep.latency.Load().observeWhole(&t.features, took.Seconds())
	t.clearBacklog()
}

// clearBacklog takes the request's prompt out of the endpoint's prefill
// backlog (at its first token, or at its end without one).
func (t *Ticket) clearBacklog() {
	if t.backlog != 0 {
		t.ep.backlog.Add(-t.backlog)
		t.backlog = 0
	}
}

// Done records that the request finished (or failed) and no longer loads
// the endpoint. Calls after the first are ignored.
func (t *Ticket) Done() {
	if t.ep == nil || t.done {
		return
	}
	t.done = true
	t.clearBacklog()
	t.ep.completed.Add(1)
	t.ep.inFlight.Add(-1)
}
