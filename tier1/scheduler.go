package tier1

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/defaults"
	"github.com/meridian-router/meridian/request"
)

// Errors a decision can return; the data plane maps both to 503.
var (
	// ErrNoEndpoints: no ready endpoint (inside the subset hint, if any).
	ErrNoEndpoints = errors.New("no ready endpoint")
	// ErrNoCapableEndpoint: no ready endpoint can serve the adapter.
	ErrNoCapableEndpoint = errors.New("no endpoint can serve the adapter")
	// ErrContextLength: the request (prompt plus max_tokens) is longer
	// than the max_model_len of every ready endpoint that serves it. The
	// data plane answers 400, as vLLM would.
	ErrContextLength = errors.New("request longer than every endpoint's max_model_len")
)

// Scorer names, in the order of Score.Parts. They are the weights' names
// in the gateway configuration.
const (
	Queue = iota
	KVCache
	Prefix
	LoraAffinity
	RunningRequests
	PredictedLatency
	LRU
	numScorers
)

// ScorerNames are the scorers' configuration names, indexed like
// Score.Parts.
var ScorerNames = [numScorers]string{"queue", "kvCache", "prefix", "loraAffinity", "runningRequests", "predictedLatency", "lru"}

// Options tune Meridian-mode scoring and the picker. The zero value of a
// field means its default (DefaultOptions); GIE mode ignores the scales.
type Options struct {
	// Fallbacks is how many endpoints after the primary a decision returns,
	// best first, for the data plane to retry on before the first byte.
	// Default 2; negative means none. Each costs one more pass over the
	// candidates.
	Fallbacks int
	// MaxMetricsAge is how old an endpoint's last scrape may be before the
	// endpoint is avoided: it is only a fallback, after the fresh ones.
	// When every candidate is older, all are used (fail open: a scraper
	// outage must not take the pool down). Default
	// 1s: 20 missed scrapes at the usual 50ms interval. GIE's 200ms bound
	// is known to be too tight; a larger bound only matters when a scraper
	// is stuck, since the accounting since the scrape covers the gap.
	MaxMetricsAge time.Duration
	// QueueHalf is the number of waiting requests (scraped plus dispatched
	// since) at which the queue score is 1/2: score = 1/(1+waiting/QueueHalf).
	// Smaller values make the queue dominate sooner. Default 4.
	QueueHalf float64
	// RunningHalf is the same for running requests. Default 64, a quarter
	// of vLLM's default batch limit.
	RunningHalf float64
	// QueueSaturation and KVSaturation are where an endpoint counts as
	// fully loaded for the prefix scorer: its prefix score is the cached
	// share × (1 − pressure), pressure = max(waiting/QueueSaturation,
	// kv/KVSaturation) clamped to [0, 1]. A cached prefix is worth little
	// on a pod that will make the request wait anyway. Defaults 8 and 0.95.
	QueueSaturation float64
	KVSaturation    float64
	// LatencyScale is the predicted TTFT at which the predictedLatency
	// score is 1/2: score = scale/(scale+ttft). Default 500ms.
	LatencyScale time.Duration
	// Rand returns uniformly random 64-bit values for tie-breaks and the
	// random pickers. It must be safe for concurrent use. Default
	// math/rand/v2.Uint64; the replay tool passes a seeded source so runs
	// repeat.
	Rand func() uint64
}

// DefaultOptions returns the defaults documented on Options.
func DefaultOptions() Options {
	return Options{
		Fallbacks:       2,
		MaxMetricsAge:   time.Second,
		QueueHalf:       4,
		RunningHalf:     64,
		QueueSaturation: 8,
		KVSaturation:    0.95,
		LatencyScale:    500 * time.Millisecond,
		Rand:            rand.Uint64,
	}
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.Fallbacks == 0 {
		o.Fallbacks = d.Fallbacks
	}
	if o.Fallbacks < 0 {
		o.Fallbacks = 0
	}
	o.MaxMetricsAge = defaults.Positive(o.MaxMetricsAge, d.MaxMetricsAge)
	o.QueueHalf = defaults.Positive(o.QueueHalf, d.QueueHalf)
	o.RunningHalf = defaults.Positive(o.RunningHalf, d.RunningHalf)
	o.QueueSaturation = defaults.Positive(o.QueueSaturation, d.QueueSaturation)
	o.KVSaturation = defaults.Positive(o.KVSaturation, d.KVSaturation)
	o.LatencyScale = defaults.Positive(o.LatencyScale, d.LatencyScale)
	if o.Rand == nil {
		o.Rand = d.Rand
	}
	return o
}

// Request is what a decision needs to know about one request. The data
// plane builds it once per request: Model, Adapter, Tenant, Band and
// Subset from the request's headers and routing, then Scheduler.Prepare
// fills Hashes and PromptTokens from the parsed body.
type Request struct {
	// Model is the target model (after any rewrite): the base model name.
	Model string
	// Adapter is the LoRA adapter the request names, or "" for the base
	// model.
	Adapter string
	// Hashes are the prompt's prefix-block hashes (Scheduler.Prepare).
	Hashes []uint64
	// PromptTokens is the estimated prompt length in tokens.
	PromptTokens int
	// MaxTokens is the most output tokens the request asks for
	// (max_tokens), 0 when unset. With PromptTokens it is checked against
	// an endpoint's max_model_len (Capabilities).
	MaxTokens int
	// Tenant and Band are carried for the data plane's accounting; the
	// scorers do not use them.
	Tenant string
	Band   string
	// Subset, when non-nil, restricts the pick to endpoints with these
	// addresses (the proxy's x-gateway-destination-endpoint-subset); an
	// empty non-nil Subset leaves nothing to pick.
	Subset []string
}

// target is the name the server knows the request by: the adapter, or the
// base model.
func (r *Request) target() string {
	if r.Adapter != "" {
		return r.Adapter
	}
	return r.Model
}

// Scheduler picks an endpoint of one pool for each request. It is
// immutable after NewScheduler and safe for concurrent use; on a
// configuration change the data plane builds a new one over the same Pool
// and swaps a pointer (atomic.Pointer[Scheduler]).
type Scheduler struct {
	name    string
	model   string
	pool    *Pool
	policy  config.SchedulerPolicy
	weights [numScorers]float64
	gie     bool
	picker  string
	opts    Options

	scratch sync.Pool
}

// NewScheduler builds the scheduler described by sched and its resolved
// policy (config.Snapshot.Policy) over pool.
func NewScheduler(pool *Pool, sched config.Scheduler, policy config.SchedulerPolicy, opts Options) (*Scheduler, error) {
	if pool == nil {
		return nil, fmt.Errorf("tier1: scheduler %q: nil pool", sched.Name)
	}
	d := config.DefaultPolicy()
	policy.BlockSize = defaults.Positive(policy.BlockSize, d.BlockSize)
	policy.MaxPrefixBlocks = defaults.Positive(policy.MaxPrefixBlocks, d.MaxPrefixBlocks)
	policy.LRUCapacityPerServer = defaults.Positive(policy.LRUCapacityPerServer, d.LRUCapacityPerServer)
	if policy.Picker == "" {
		policy.Picker = d.Picker
	}
	if policy.Scoring == "" {
		policy.Scoring = sched.Scoring
	}
	if policy.Scoring == "" {
		policy.Scoring = d.Scoring
	}
	s := &Scheduler{
		name:   sched.Name,
		model:  sched.ModelName,
		pool:   pool,
		policy: policy,
		picker: policy.Picker,
		opts:   opts.withDefaults(),
	}
	switch policy.Scoring {
	case config.ScoringMeridian:
	case config.ScoringGIE:
		s.gie = true
	default:
		return nil, fmt.Errorf("tier1: scheduler %q: unknown scoring %q (want %q or %q)",
			sched.Name, policy.Scoring, config.ScoringMeridian, config.ScoringGIE)
	}
	switch policy.Picker {
	case config.PickerMaxScore, config.PickerWeightedRandom, config.PickerRandom:
	default:
		return nil, fmt.Errorf("tier1: scheduler %q: unknown picker %q", sched.Name, policy.Picker)
	}
	w := policy.Weights
	s.weights = [numScorers]float64{w.Queue, w.KVCache, w.Prefix, w.LoraAffinity, w.RunningRequests, w.PredictedLatency, w.LRU}
	for i, v := range s.weights {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("tier1: scheduler %q: weight %s = %v: want a finite value ≥ 0", sched.Name, ScorerNames[i], v)
		}
	}
	s.scratch.New = func() any { return new(scratch) }
	return s, nil
}

// Name is the scheduler's name; Model the model name it serves.
func (s *Scheduler) Name() string  { return s.name }
func (s *Scheduler) Model() string { return s.model }

// Pool is the pool the scheduler picks from.
func (s *Scheduler) Pool() *Pool { return s.pool }

// Policy is the resolved policy, defaults filled in.
func (s *Scheduler) Policy() config.SchedulerPolicy { return s.policy }

// SharesPrefixIndex reports whether this scheduler's dispatches should be
// exchanged with other replicas as PrefixEvents. GIE keeps one index per
// replica, so GIE mode does not.
func (s *Scheduler) SharesPrefixIndex() bool { return !s.gie }

// blockSize is the prefix block size in characters for this decision. GIE
// auto-tunes it to 4 characters per token of the servers' KV block size
// (from the first endpoint reporting one); Meridian keeps the configured
// size so that hashes mean the same on every replica and in Tier-2.
func (s *Scheduler) blockSize() int {
	if s.gie {
		for _, ep := range s.pool.Endpoints() {
			if m := ep.Metrics(); m != nil && m.BlockSize > 0 {
				return m.BlockSize * charsPerToken
			}
		}
	}
	return s.policy.BlockSize
}

// Prepare fills req.Hashes (reusing its capacity) and req.PromptTokens
// from the parsed body. Set req.Model and req.Adapter first: the hashes
// are seeded with the adapter (or model) name and the body's cache salt,
// since a server shares no cache across models, adapters or salts.
func (s *Scheduler) Prepare(req *Request, body *request.Body) {
	sc := s.scratch.Get().(*scratch)
	if s.gie {
		sc.text = s.PrepareText(req, body, sc.text)
	} else {
		// The text is not needed: PrefixHashes hashes a chat without
		// building it.
		req.PromptTokens = body.EstimateTokens()
		req.MaxTokens = body.MaxTokens
		req.Hashes, sc.text = request.PrefixHashes(req.Hashes[:0], body, req.target(), s.policy.BlockSize,
			s.policy.MaxPrefixBlocks, sc.text)
	}
	s.scratch.Put(sc)
}

// PrepareText is Prepare building the prompt text it hashes in buf
// (reusing its capacity), which it returns for the caller to read: in
// Meridian mode the head of request.AppendPromptText's form that covers
// the hashed blocks (request.AppendPromptHead with PromptTextLimit bytes),
// so that a caller who needs the text too does not build it again. The
// result is empty in GIE mode (the text hashed there is in another form)
// and for token-id prompts.
func (s *Scheduler) PrepareText(req *Request, body *request.Body, buf []byte) []byte {
	req.PromptTokens = body.EstimateTokens()
	req.MaxTokens = body.MaxTokens
	if s.gie {
		buf = request.AppendGIEPrompt(buf[:0], body)
		req.Hashes = request.BlockHashes(req.Hashes[:0], request.Seed(req.target(), body.CacheSalt),
			buf, s.blockSize(), s.policy.MaxPrefixBlocks)
		return buf[:0]
	}
	if (body.Kind == request.Completion || body.Kind == request.Embedding) && body.TokenIDs != nil {
		req.Hashes, buf = request.PrefixHashes(req.Hashes[:0], body, req.target(), s.policy.BlockSize,
			s.policy.MaxPrefixBlocks, buf)
		return buf[:0] // no text
	}
	buf = request.PrefixText(buf[:0], body, s.policy.BlockSize, s.policy.MaxPrefixBlocks)
	req.Hashes = request.BlockHashes(req.Hashes[:0], request.Seed(req.target(), body.CacheSalt), buf,
		s.policy.BlockSize, s.policy.MaxPrefixBlocks)
	return buf
}

// PromptTextLimit is how many bytes of a prompt's text PrepareText
// returns at most (all of it when that is shorter), and the block size of
// req.Hashes over that text; 0, 0 in GIE mode, where PrepareText returns
// no text.
func (s *Scheduler) PromptTextLimit() (limit, blockSize int) {
	if s.gie {
		return 0, 0
	}
	p := &s.policy
	if p.BlockSize <= 0 || p.MaxPrefixBlocks <= 0 || p.MaxPrefixBlocks > (1<<40)/p.BlockSize {
		return math.MaxInt, p.BlockSize // PrefixHashes builds the whole text
	}
	return p.BlockSize * p.MaxPrefixBlocks, p.BlockSize
}

// HashText fills req.Hashes from a prompt text already in the form the
// scheduler's mode hashes (request.AppendPromptText for Meridian,
// request.AppendGIEPrompt for GIE), for callers such as the replay tool
// that have text but no body.
func (s *Scheduler) HashText(req *Request, text []byte, cacheSalt string) {
	req.Hashes = request.BlockHashes(req.Hashes[:0], request.Seed(req.target(), cacheSalt), text,
		s.blockSize(), s.policy.MaxPrefixBlocks)
}

// scratch is one decision's working memory, pooled per scheduler. Its
// contents are meaningless between decisions.
type scratch struct {
	cands  []*Endpoint
	stale  []*Endpoint
	loads  []load
	counts []int32 // prefix blocks matched, by endpoint slot
	match  matchScratch
	total  []float64
	keys   []uint64
	parts  [][numScorers]float64 // only for Explain
	text   []byte
}

// Schedule picks an endpoint for req at time now and appends it, then up
// to Options.Fallbacks more in order of preference, to dst. It returns the
// extended slice, or an error wrapping ErrNoEndpoints or
// ErrNoCapableEndpoint. It records nothing: call Dispatch for the
// endpoint actually used.
func (s *Scheduler) Schedule(req *Request, now time.Time, dst []*Endpoint) ([]*Endpoint, error) {
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	if err := s.score(req, now, sc, false); err != nil {
		return dst, err
	}
	start := len(dst)
	dst = s.pick(sc, dst)
	// Endpoints avoided for stale metrics are the last fallbacks, so that
	// a fresh primary failing before its first byte (a pod answering 5xx)
	// is still retried on a ready pod when its others missed a scrape or
	// two, rather than answered with its error.
	for _, ep := range sc.stale {
		if len(dst)-start > s.opts.Fallbacks {
			break
		}
		dst = append(dst, ep)
	}
	return dst, nil
}

// Score is one candidate's evaluation, for debugging and tests.
type Score struct {
	Endpoint *Endpoint
	// Parts are the seven scorers' values in [0, 1], indexed like
	// ScorerNames, before weighting; unweighted scorers are still computed.
	Parts [numScorers]float64
	// Total is Σ weight × part.
	Total float64
}

// Explain scores every candidate for req as Schedule would, without
// picking.
func (s *Scheduler) Explain(req *Request, now time.Time) ([]Score, error) {
	sc := new(scratch)
	if err := s.score(req, now, sc, true); err != nil {
		return nil, err
	}
	out := make([]Score, len(sc.cands))
	for i, ep := range sc.cands {
		out[i] = Score{Endpoint: ep, Parts: sc.parts[i], Total: sc.total[i]}
	}
	return out, nil
}

// filter fills sc.cands with the endpoints req may go to.
func (s *Scheduler) filter(req *Request, now time.Time, set *endpointSet, sc *scratch) error {
	sc.cands, sc.stale = sc.cands[:0], sc.stale[:0]
	if req.Subset != nil && len(req.Subset) == 0 {
		return fmt.Errorf("tier1: %w: the subset hint is empty", ErrNoEndpoints)
	}
	ready, tooLong := 0, 0
	for _, ep := range set.list {
		if !ep.ready.Load() || (req.Subset != nil && !inSubset(req.Subset, ep.Address)) {
			continue
		}
		ready++
		if s.gie {
			// GIE's default profile has no filters beyond the subset.
			sc.cands = append(sc.cands, ep)
			continue
		}
		m := ep.metrics.Load()
		if c := ep.caps.Load(); c != nil {
			if !c.serves(req.Model, req.Adapter) {
				continue
			}
			if !c.fits(req.PromptTokens + req.MaxTokens) {
				tooLong++
				continue
			}
		} else if req.Adapter != "" && m != nil && m.LoRAReported && m.MaxLoRA == 0 &&
			!m.hasAdapter(m.RunningAdapters, req.Adapter) && !m.hasAdapter(m.WaitingAdapters, req.Adapter) {
			continue
		}
		if m == nil || now.Sub(m.ScrapedAt) > s.opts.MaxMetricsAge {
			sc.stale = append(sc.stale, ep)
			continue
		}
		sc.cands = append(sc.cands, ep)
	}
	if len(sc.cands) == 0 {
		sc.cands = append(sc.cands, sc.stale...)
		sc.stale = sc.stale[:0] // candidates now, not last resorts
	}
	if len(sc.cands) == 0 {
		if tooLong > 0 {
			return fmt.Errorf("tier1: %w: %d prompt + %d output tokens on %d ready endpoints",
				ErrContextLength, req.PromptTokens, req.MaxTokens, tooLong)
		}
		if ready > 0 {
			return fmt.Errorf("tier1: %w: %q on %d ready endpoints", ErrNoCapableEndpoint, req.target(), ready)
		}
		if req.Subset != nil {
			return fmt.Errorf("tier1: %w in the subset hint (%d addresses)", ErrNoEndpoints, len(req.Subset))
		}
		return fmt.Errorf("tier1: %w in pool %q", ErrNoEndpoints, s.name)
	}
	return nil
}

func inSubset(subset []string, addr string) bool {
	for _, a := range subset {
		if a == addr {
			return true
		}
	}
	return false
}

// score filters and scores the candidates into sc.cands and sc.total (and
// sc.parts when explain is set).
func (s *Scheduler) score(req *Request, now time.Time, sc *scratch, explain bool) error {
	set := s.pool.set.Load()
	if err := s.filter(req, now, set, sc); err != nil {
		return err
	}
	n := len(sc.cands)
	sc.loads = grow(sc.loads, n)
	sc.total = grow(sc.total, n)
	if explain {
		sc.parts = grow(sc.parts, n)
	}
	for i, ep := range sc.cands {
		sc.loads[i] = ep.load()
		sc.total[i] = 0
	}
	w := &s.weights
	all := explain

	// Prefix matches: needed by prefix, by predictedLatency (uncached
	// tokens) and by lru (whether any endpoint has a hit).
	maxHit := int32(0)
	total := float64(len(req.Hashes))
	needPrefix := all || w[Prefix] > 0 || w[PredictedLatency] > 0 || w[LRU] > 0
	if needPrefix {
		sc.counts = grow(sc.counts, set.slots)
		clear(sc.counts)
		if len(req.Hashes) > 0 {
			if s.gie {
				s.pool.index.match(req.Hashes, sc.counts, false, &sc.match)
			} else {
				s.pool.index.matchAnchored(req.Hashes, sc.counts, &sc.match)
			}
		}
		for _, ep := range sc.cands {
			maxHit = max(maxHit, sc.counts[ep.slot])
		}
	}

	// GIE's min–max load scorers need the extremes over the candidates.
	var minQ, maxQ, minR, maxR int
	if s.gie && (all || w[Queue] > 0 || w[RunningRequests] > 0) {
		minQ, maxQ, minR, maxR = math.MaxInt, math.MinInt, math.MaxInt, math.MinInt
		for i := range sc.loads {
			m := sc.loads[i].m
			minQ, maxQ = min(minQ, m.Waiting), max(maxQ, m.Waiting)
			minR, maxR = min(minR, m.Running), max(maxR, m.Running)
		}
	}
	// lru: least recently picked first, only for prompts with no cached
	// prefix anywhere among the candidates.
	var minT, maxT int64
	if (all || w[LRU] > 0) && maxHit == 0 {
		minT, maxT = math.MaxInt64, math.MinInt64
		for _, ep := range sc.cands {
			t := ep.lastPicked.Load()
			minT, maxT = min(minT, t), max(maxT, t)
		}
	}
	nowNanos := now.UnixNano()
	latScale := s.opts.LatencyScale.Seconds()
	// Once some candidate has shown a first token, the ones that have not
	// are optimistic until tried (latencyUnobserved); before any has,
	// all use the prior, whose prefill term orders them by cache.
	observed := false
	if all || w[PredictedLatency] > 0 {
		for _, ep := range sc.cands {
			if ep.latency.Load().coef.Load() != nil {
				observed = true
				break
			}
		}
	}

	for i, ep := range sc.cands {
		l := &sc.loads[i]
		var p [numScorers]float64
		hit := 0.0
		if needPrefix && total > 0 {
			hit = float64(sc.counts[ep.slot]) / total
		}
		if all || w[Queue] > 0 {
			if s.gie {
				p[Queue] = minMax(l.m.Waiting, minQ, maxQ)
			} else {
				p[Queue] = 1 / (1 + l.waiting/s.opts.QueueHalf)
			}
		}
		if all || w[RunningRequests] > 0 {
			if s.gie {
				p[RunningRequests] = minMax(l.m.Running, minR, maxR)
			} else {
				p[RunningRequests] = 1 / (1 + l.running/s.opts.RunningHalf)
			}
		}
		if all || w[KVCache] > 0 {
			if s.gie {
				p[KVCache] = 1 - l.m.KVCacheUsage
			} else {
				// Convex: a cache a third full is as good as an empty one
				// for the next request; the penalty grows as it nears full
				// and vLLM starts preempting.
				kv := min(max(l.kv, 0), 1)
				p[KVCache] = 1 - kv*kv
			}
		}
		if all || w[Prefix] > 0 {
			if s.gie {
				p[Prefix] = hit
			} else {
				pressure := max(l.waiting/s.opts.QueueSaturation, l.kv/s.opts.KVSaturation)
				p[Prefix] = hit * (1 - min(max(pressure, 0), 1))
			}
		}
		if all || w[LoraAffinity] > 0 {
			p[LoraAffinity] = s.loraScore(req, ep, l, nowNanos)
		}
		if all || w[PredictedLatency] > 0 {
			x := latencyFeatures(l.waiting, l.running, float64(req.PromptTokens)*(1-hit), l.backlog)
			p[PredictedLatency] = latScale / (latScale + ep.latency.Load().predict(&x, observed))
		}
		if all || w[LRU] > 0 {
			switch {
			case maxHit > 0 || maxT == minT:
				p[LRU] = 1
			default:
				p[LRU] = float64(maxT-ep.lastPicked.Load()) / float64(maxT-minT)
			}
		}
		t := 0.0
		for k, v := range p {
			if w[k] > 0 {
				t += w[k] * clamp01(v)
			}
		}
		sc.total[i] = t
		if explain {
			sc.parts[i] = p
		}
	}
	return nil
}

// clamp01 limits a score to [0, 1], NaN (a server exporting NaN) to 0.
func clamp01(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return min(v, 1)
}

// minMax is GIE's (max−v)/(max−min), 1 when all are equal.
func minMax(v, lo, hi int) float64 {
	if hi == lo {
		return 1
	}
	return float64(hi-v) / float64(hi-lo)
}

// loraScore is loraAffinity. GIE: 1 when the adapter is running, else 0.8
// with a free slot, else 0.6 when it is waiting to load, else 0 (for the
// base model too, which is never "running" as an adapter). Meridian keeps
// the steps, counts adapters dispatched since the scrape as loaded (a
// burst of different adapters must not overfill one pod's slots), scores
// base-model requests 1 everywhere (no preference), and prices a forced
// eviction by what it would evict: up to 0.4 when the pod's least-used
// adapter is below average demand, 0 when every adapter there is hot.
func (s *Scheduler) loraScore(req *Request, ep *Endpoint, l *load, now int64) float64 {
	m := l.m
	name := req.target()
	if s.gie {
		switch {
		case m.hasAdapter(m.RunningAdapters, name):
			return 1
		case len(m.RunningAdapters)+len(m.WaitingAdapters) < m.MaxLoRA:
			return 0.8
		case m.hasAdapter(m.WaitingAdapters, name):
			return 0.6
		}
		return 0
	}
	if req.Adapter == "" {
		return 1
	}
	switch {
	case m.hasAdapter(m.RunningAdapters, name):
		return 1
	case !m.LoRAReported:
		return 0.8 // unknown: assume a free slot
	}
	pending := ep.pendingAdapterCount()
	if pending > 0 && ep.adapterPending(name) {
		return 0.9 // sent there since the scrape: loaded or loading now
	}
	switch {
	case len(m.RunningAdapters)+len(m.WaitingAdapters)+pending < m.MaxLoRA:
		return 0.8
	case m.hasAdapter(m.WaitingAdapters, name):
		return 0.6
	}
	coldest := math.Inf(1)
	for _, a := range m.RunningAdapters {
		coldest = min(coldest, s.pool.lora.hotness(a, now))
	}
	if math.IsInf(coldest, 1) {
		return 0
	}
	return 0.4 * max(0, 1-coldest)
}

// pick appends the chosen endpoints, best first, to dst.
func (s *Scheduler) pick(sc *scratch, dst []*Endpoint) []*Endpoint {
	n := len(sc.cands)
	sc.keys = grow(sc.keys, n)
	rnd := s.opts.Rand
	switch s.picker {
	case config.PickerWeightedRandom:
		// A-Res weighted sampling without replacement: key = U^(1/score),
		// compared as log(U)/score. Zero scores never win over positive
		// ones; all zero is a uniform draw.
		positive := false
		for i := range n {
			u := (float64(rnd()>>11) + 1) / (1 << 53) // (0, 1]
			if sc.total[i] > 0 {
				positive = true
				sc.total[i] = math.Log(u) / sc.total[i]
			} else {
				sc.total[i] = math.Inf(-1)
			}
			sc.keys[i] = rnd()
		}
		if !positive {
			clear(sc.total[:n])
		}
	case config.PickerRandom:
		clear(sc.total[:n])
		for i := range n {
			sc.keys[i] = rnd()
		}
	default:
		for i := range n {
			sc.keys[i] = rnd()
		}
	}
	k := min(n, 1+s.opts.Fallbacks)
	// Selection of the k best by (total, key): k passes, cheaper than a
	// sort for the small k used.
	for range k {
		best := -1
		for i := range n {
			if sc.cands[i] == nil {
				continue
			}
			if best < 0 || sc.total[i] > sc.total[best] || (sc.total[i] == sc.total[best] && sc.keys[i] > sc.keys[best]) {
				best = i
			}
		}
		dst = append(dst, sc.cands[best])
		sc.cands[best] = nil
	}
	return dst
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n, n+n/4)
	}
	return s[:n]
}

// Dispatch records that req was sent to ep at now: the endpoint's in-flight
// accounting, the lru scorer's recency, adapter demand, and (optimistically,
// as GIE does) the prompt's blocks in the prefix index. It returns the
// Ticket on which the data plane reports the first token and the end. To
// share the dispatch with other replicas, publish
// PrefixEvent{ep.ID, now.UnixNano(), req.Hashes} (copy the hashes if req is
// reused) when SharesPrefixIndex is true.
func (s *Scheduler) Dispatch(ep *Endpoint, req *Request, now time.Time) Ticket {
	l := ep.load()
	hit := 0.0
	// An endpoint removed since the decision keeps its accounting but must
	// not write index entries: its slot may already be another endpoint's.
	if len(req.Hashes) > 0 && s.pool.Endpoint(ep.ID) == ep {
		var held int
		if s.gie {
			held = s.pool.index.add(ep.slot, s.capacity(l.m), now.UnixNano(), req.Hashes, true)
		} else {
			held = s.pool.index.addAnchored(ep.slot, s.capacity(l.m), now.UnixNano(), req.Hashes)
		}
		hit = float64(held) / float64(len(req.Hashes))
	}
	uncached := int64(float64(req.PromptTokens) * (1 - hit))
	t := Ticket{ep: ep, hit: hit, backlog: uncached, features: latencyFeatures(l.waiting, l.running, float64(uncached), l.backlog)}
	ep.backlog.Add(uncached)
	ep.dispatched.Add(1)
	ep.tokens.Add(int64(req.PromptTokens))
	ep.inFlight.Add(1)
	ep.lastPicked.Store(now.UnixNano())
	if req.Adapter != "" {
		ep.addPendingAdapter(req.Adapter)
		s.pool.lora.record(req.Adapter, now.UnixNano())
	}
	return t
}

// capacity is the prefix index capacity for an endpoint: GIE uses the
// server's GPU block count as a count of its own blocks (auto-tune) or
// LRUCapacityPerServer; Meridian converts the server's KV cache to blocks
// of the configured size.
func (s *Scheduler) capacity(m *Metrics) int {
	if s.gie {
		if m.GPUBlocks > 0 {
			return m.GPUBlocks
		}
		return s.policy.LRUCapacityPerServer
	}
	return meridianCapacity(m, s.policy.BlockSize, s.policy.LRUCapacityPerServer)
}

// ApplyPrefixEvent applies another replica's dispatch to the pool's prefix
// index, with this scheduler's block size and capacity rules. It reports
// false for an unknown endpoint.
func (s *Scheduler) ApplyPrefixEvent(ev PrefixEvent) bool {
	return s.pool.applyPrefixEvent(ev, s.policy.BlockSize, s.policy.LRUCapacityPerServer)
}
