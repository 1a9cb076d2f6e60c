// Package gateway is one cluster's Tier-1 at run time: it keeps the pools
// of model-server endpoints in step with configuration and discovery,
// scrapes them, and turns a parsed request into a routing decision that
// the standalone proxy and the ext_proc picker both carry out.
//
// It decides which scheduler serves a request (body-based routing: an
// adapter maps to its base model), whether the request may go to that
// pool now, must wait, or is turned away (admission by priority band, one
// priority.Gate per pool fed from the pods' live metrics; see Route), and
// asks the scheduler for a primary endpoint and fallbacks once it may go.
// It does not move bytes: forwarding belongs to the proxy, and Envoy does
// it in ext_proc mode.
package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/loop"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/request"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/discovery"
	"github.com/meridian-router/meridian/tier1/hygiene"
	"github.com/meridian-router/meridian/tier1/scrape"
)

// Headers Tier-1 reads and writes (GIE's names).
const (
	HeaderModelName       = "X-Gateway-Model-Name"
	HeaderBaseModelName   = "X-Gateway-Base-Model-Name"
	HeaderDestination     = "x-gateway-destination-endpoint"
	HeaderServed          = "x-gateway-destination-endpoint-served"
	HeaderSubset          = "x-gateway-destination-endpoint-subset"
	HeaderObjective       = "x-gateway-inference-objective"
	HeaderFairnessID      = "x-gateway-inference-fairness-id"
	HeaderModelRewrite    = "x-gateway-model-name-rewrite"
	HeaderTenant          = "x-meridian-tenant"
	HeaderBand            = "x-meridian-band"
	unknownModelMessage   = "no matching model: set the model in the request body or the x-gateway-model-name header"
	noEndpointsMessage    = "no ready endpoint for model %q"
	noCapableMessage      = "no endpoint can serve adapter %q of model %q"
	contextLengthMessage  = "the request is longer than every endpoint of model %q accepts (about %d prompt tokens + max_tokens %d)"
	defaultTargetPortPath = "/metrics"
)

// Config configures a Gateway. Zero fields take the documented defaults.
type Config struct {
	// Cluster selects this cluster's InferenceGatewayConfig (by
	// spec.cluster, or by name). Empty works when there is only one.
	Cluster string
	// Replica names this process among the cluster's Tier-1 replicas.
	Replica string
	// Scrape tunes metric polling of the pods.
	Scrape scrape.Config
	// Options tune the schedulers.
	Options tier1.Options
	// Admission tunes per-pool admission by priority band; the zero value
	// is on with priority's defaults.
	Admission Admission
	// Registerer receives the gateway's metrics; nil means none.
	Registerer prometheus.Registerer
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// OnDispatch, when set, is called for every dispatch with the pool
	// (scheduler name) and the prefix event, for sharing with replicas. It
	// must not block and must copy nothing it keeps: ev.Hashes is owned by
	// the callee.
	OnDispatch func(pool string, ev tier1.PrefixEvent)
	// Prompts, when set, sees every routed prompt to report where tenants'
	// prompts break the prefix cache; nil means no report.
	Prompts *hygiene.Sketch
	// OnInFlight, when set, is called after every dispatch, first token
	// and end of a request in a Meridian-mode pool with the pool, the
	// endpoint's ID and this replica's load there (in-flight count and
	// prefill backlog, tier1.Endpoint.LoadReport), for sharing with
	// replicas (peers.Exchange.PublishInFlight). It must not block.
	OnInFlight func(pool, endpoint string, load tier1.PeerLoad)
	// Tier2Key, when set, is the key Tier-2s sign x-meridian-tenant and
	// x-meridian-band with (internal/trust): a request that carries either
	// without a valid x-meridian-signature is refused with 401, so that
	// only a Tier-2 can claim a tenant's policy or a band. Nil accepts the
	// headers unsigned (a Tier-1 reachable only by its Tier-2s).
	Tier2Key []byte
}

// Gateway holds the live pools and the routing table of one cluster.
type Gateway struct {
	cfg     Config
	log     *slog.Logger
	metrics *Metrics
	scrapeM *scrape.Metrics
	prio    *priority.Metrics
	tenants *priority.Tenants // updated in place on Apply; shared by the Gates

	table atomic.Pointer[table]

	mu    sync.Mutex
	pools map[string]*poolState // by scheduler name; survive reloads
	pods  []discovery.Pod       // Kubernetes pods; nil with static endpoints only
	ctx   context.Context       // lifetime of scrape loops

	// promptText holds *[]byte: the prompt text the scheduler hashes,
	// kept for the prompt sketch until the decision is made.
	promptText sync.Pool
}

// table is one configuration's routing: immutable, swapped whole.
type table struct {
	snap     *config.Snapshot
	gateway  *config.Gateway
	byModel  map[string]*route // modelName → route
	adapters map[string]string // adapter → base model (BBR and loraAdapters)
	bbr      bool
	models   []string // every model name and adapter served, sorted
	// objectives map InferenceObjective names to priorities: the
	// configuration's over Config.Admission.Objectives.
	objectives map[string]int
}

type route struct {
	sched *tier1.Scheduler
	state *poolState
}

// poolState is what the gateway keeps per pool beyond tier1.Pool.
type poolState struct {
	name     string
	model    string
	adapters []string
	// definition is the pool's config.PoolDefinition as last applied.
	definition []string
	pool       *tier1.Pool
	// classLabel is the pod label naming each endpoint's latency class
	// (config.SchedulerOptions.LatencyClassLabel); "" when classes are off.
	classLabel string
	stats      *poolStats
	gate       *priority.Gate // admission by band
	// thresholds turn the pool's pod metrics into its saturation: the
	// scheduler's admission settings over Config.Admission's, swapped on
	// every Apply.
	thresholds atomic.Pointer[priority.Thresholds]
	// pending counts requests admitted and not yet sent to a pod: no
	// endpoint's in-flight count shows them yet.
	pending atomic.Int64

	mu       sync.Mutex
	scrapers map[string]*scraper // by endpoint ID
}

type scraper struct {
	address string
	cancel  context.CancelFunc
	// pod-reported prefix counters of the last scrape
	hits, queries atomic.Uint64 // float bits not needed: counts fit
}

// New builds a gateway from the first snapshot. Start must be called to
// begin scraping.
func New(cfg Config, snap *config.Snapshot) (*Gateway, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	g := &Gateway{
		cfg:     cfg,
		log:     cfg.Logger,
		metrics: newMetrics(cfg.Registerer),
		scrapeM: scrape.NewMetrics(cfg.Registerer),
		pools:   map[string]*poolState{},
		ctx:     context.Background(),
	}
	if cfg.Prompts != nil {
		size := cfg.Prompts.Limit() + 256
		g.promptText.New = func() any { b := make([]byte, 0, size); return &b }
	}
	var err error
	if g.prio, err = priority.NewMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	if g.tenants, err = priority.NewTenants(nil, g.prio); err != nil {
		return nil, err
	}
	if err := g.Apply(snap); err != nil {
		return nil, err
	}
	return g, nil
}

// Start runs the gateway's background work until ctx ends: scraping every
// endpoint, and following snap's updates when updates is non-nil.
func (g *Gateway) Start(ctx context.Context, updates <-chan *config.Snapshot) {
	g.mu.Lock()
	g.ctx = ctx
	for _, ps := range g.pools {
		g.syncScrapersLocked(ps)
	}
	g.mu.Unlock()
	go g.exportGauges(ctx)
	if !g.cfg.Admission.Off {
		go g.observeLoop(ctx)
	}
	if updates == nil {
		return
	}
	go loop.Each(ctx, updates, func(s *config.Snapshot) {
		if err := g.Apply(s); err != nil {
			g.log.Error("tier1: configuration not applied; keeping the running one", "revision", s.Revision, "error", err)
		}
	})
}

// Apply swaps in a new configuration: schedulers, weights and adapter maps
// change atomically; pools, their endpoints' state and prefix indexes carry
// over. A snapshot that cannot be applied leaves the running one.
func (g *Gateway) Apply(snap *config.Snapshot) error {
	gw := snap.Gateway(g.cfg.Cluster)
	if gw == nil {
		return fmt.Errorf("tier1: no InferenceGatewayConfig for cluster %q in the configuration", g.cfg.Cluster)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	// Pools are created on first use and kept for later reloads.
	created := map[string]*poolState{}
	poolFor := func(name string) *tier1.Pool {
		if ps, ok := g.pools[name]; ok {
			return ps.pool
		}
		ps := &poolState{name: name, pool: tier1.NewPool(), stats: newPoolStats(), scrapers: map[string]*scraper{},
			gate: &priority.Gate{Pool: name, Tenants: g.tenants, Metrics: g.prio}}
		created[name] = ps
		return ps.pool
	}
	scheds, err := tier1.Schedulers(snap, gw, poolFor, g.cfg.Options)
	if err != nil {
		return err
	}
	// Checked before anything is swapped; applied last.
	if _, err := priority.NewTenants(snap.Tenants, nil); err != nil {
		return fmt.Errorf("tier1: %w", err)
	}
	t := &table{snap: snap, gateway: gw, byModel: map[string]*route{}, adapters: map[string]string{}, bbr: gw.Spec.BBR.Enabled,
		objectives: g.cfg.Admission.objectives(snap)}
	keep := map[string]bool{}
	for _, sc := range gw.Spec.Schedulers {
		s := scheds[sc.ModelName]
		ps := g.pools[sc.Name]
		if ps == nil {
			ps = created[sc.Name]
			g.pools[sc.Name] = ps
		}
		ps.model, ps.adapters = sc.ModelName, slices.Clone(sc.LoraAdapters)
		ps.definition = snap.PoolDefinition(gw, &sc)
		ps.classLabel = latencyClassLabel(sc.Options)
		// New bounds and waits apply to arrivals from now on; admitted
		// requests keep their tickets.
		gc, th := g.cfg.Admission.forPool(sc.Admission)
		ps.gate.SetConfig(gc)
		ps.thresholds.Store(&th)
		t.byModel[sc.ModelName] = &route{sched: s, state: ps}
		keep[sc.Name] = true
		for _, a := range sc.LoraAdapters {
			t.adapters[a] = sc.ModelName
		}
		t.models = append(t.models, sc.ModelName)
	}
	for a, base := range snap.Adapters {
		if _, ok := t.byModel[base]; ok {
			t.adapters[a] = base
		}
	}
	for a := range t.adapters {
		t.models = append(t.models, a)
	}
	sort.Strings(t.models)
	t.models = slices.Compact(t.models)
	// Pools no longer configured stop scraping and are forgotten.
	for name, ps := range g.pools {
		if !keep[name] {
			ps.mu.Lock()
			for id, sc := range ps.scrapers {
				sc.cancel()
				delete(ps.scrapers, id)
			}
			ps.mu.Unlock()
			delete(g.pools, name)
		}
	}
	old := g.table.Load()
	g.table.Store(t)
	resetChangedIndexes(old, t)
	g.tenants.Update(snap.Tenants) // validated above
	g.syncEndpointsLocked()
	g.metrics.configRevision.Set(float64(snap.Revision))
	return nil
}

// resetChangedIndexes empties the prefix index of every pool kept from old
// to t whose hashes change meaning: another scoring mode (GIE's index
// holds every block, Meridian's every 16th) or block size. Left, the old
// entries would match nothing, or the wrong blocks, and hold the pods'
// capacity until evicted.
func resetChangedIndexes(old, t *table) {
	if old == nil {
		return
	}
	before := map[*poolState]config.SchedulerPolicy{}
	for _, r := range old.byModel {
		before[r.state] = r.sched.Policy()
	}
	for _, r := range t.byModel {
		if p, ok := before[r.state]; ok {
			q := r.sched.Policy()
			if p.Scoring != q.Scoring || p.BlockSize != q.BlockSize {
				r.state.pool.PrefixIndex().Reset()
			}
		}
	}
}

// SetPods replaces the Kubernetes pods discovery knows; it is
// discovery.Kubernetes.Run's callback. Static endpoints from the
// configuration are always included.
func (g *Gateway) SetPods(pods []discovery.Pod) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pods = pods
	g.syncEndpointsLocked()
}

// syncEndpointsLocked makes every pool's endpoints match configuration and
// discovery, and starts or stops scrape loops.
func (g *Gateway) syncEndpointsLocked() {
	t := g.table.Load()
	want := map[string]map[string]discovery.Target{} // pool → id → target
	cluster := g.cfg.Cluster
	if cluster == "" {
		cluster = cmp.Or(t.gateway.Spec.Cluster, t.gateway.Metadata.Name)
	}
	for sched, targets := range discovery.Endpoints(t.snap, cluster, g.pods) {
		m := make(map[string]discovery.Target, len(targets))
		for _, tg := range targets {
			m[tg.ID] = tg
		}
		want[sched] = m
	}
	for name, ps := range g.pools {
		eps := want[name]
		for _, ep := range ps.pool.Endpoints() {
			if _, ok := eps[ep.ID]; !ok {
				ps.pool.Remove(ep.ID)
			}
		}
		for id, tg := range eps {
			ep := ps.pool.Add(id, tg.Address)
			class := ""
			if ps.classLabel != "" {
				class = tg.Labels[ps.classLabel]
			}
			ps.pool.SetClass(ep, class)
		}
		g.syncScrapersLocked(ps)
	}
}

// latencyClassLabel is the label naming a pod's latency class under these
// options: the configured one, tier1.DefaultLatencyClassLabel when none
// is, "" when "-" turns classes off.
func latencyClassLabel(o *config.SchedulerOptions) string {
	if o == nil || o.LatencyClassLabel == "" {
		return tier1.DefaultLatencyClassLabel
	}
	if o.LatencyClassLabel == "-" {
		return ""
	}
	return o.LatencyClassLabel
}

func (g *Gateway) syncScrapersLocked(ps *poolState) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	live := map[string]*tier1.Endpoint{}
	for _, ep := range ps.pool.Endpoints() {
		live[ep.ID] = ep
	}
	for id, sc := range ps.scrapers {
		if ep, ok := live[id]; !ok || ep.Address != sc.address {
			sc.cancel()
			delete(ps.scrapers, id)
		}
	}
	if g.ctx == context.Background() {
		return // not started: Start launches the loops
	}
	for id, ep := range live {
		if _, ok := ps.scrapers[id]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(g.ctx)
		sc := &scraper{address: ep.Address, cancel: cancel}
		ps.scrapers[id] = sc
		ep := ep
		go scrape.Run(ctx, g.cfg.Scrape, g.scrapeM, scrape.Target{
			Pool: ps.name,
			URL:  "http://" + ep.Address + defaultTargetPortPath,
			// What the pod serves: models, registered adapters and
			// max_model_len, for the scheduler's capability filter.
			ModelsURL:      "http://" + ep.Address + "/v1/models",
			OnCapabilities: ep.SetCapabilities,
			OnSample: func(s *scrape.Sample) {
				m := s.Metrics
				ep.SetMetrics(&m)
				if s.HasPrefix {
					sc.hits.Store(uint64(s.PrefixHits))
					sc.queries.Store(uint64(s.PrefixQueries))
				}
			},
		})
	}
}

// Models lists the model names and adapters this cluster serves.
func (g *Gateway) Models() []string { return g.table.Load().models }

// Snapshot returns the configuration in force.
func (g *Gateway) Snapshot() *config.Snapshot { return g.table.Load().snap }

// Decision is one request's routing: which pool, which endpoints (primary
// first), and the request as the scheduler saw it.
type Decision struct {
	// Model is the model the caller named; Target the base model whose pool
	// serves it; Adapter the LoRA adapter, if any.
	Model, Target, Adapter string
	// Rewrite is the model name the body must carry upstream when the
	// caller sent x-gateway-model-name-rewrite (GIE's model rewrite);
	// empty means forward the body's model unchanged.
	Rewrite string
	// Stream is the body's "stream": the response's first byte is its
	// first token only then.
	Stream    bool
	Pool      string
	Endpoints []*tier1.Endpoint
	Request   tier1.Request

	sched   *tier1.Scheduler
	state   *poolState
	start   time.Time
	ticket  *priority.Ticket // admission; nil without
	pending atomic.Bool      // counted in state.pending until dispatched
}

// Meta is what the caller knows of a request besides its body.
type Meta struct {
	// Header carries GIE's and Meridian's routing headers (nil is fine).
	Header http.Header
	// Subset restricts the pick to these addresses (ext_proc subset hint);
	// nil means no restriction.
	Subset []string
	// Bytes is the request body's size, held while it waits for
	// admission (Route).
	Bytes int64
}

// Decide routes a parsed request without admission (see Route, which the
// proxy and the ext_proc picker use). Errors are *request.APIError with
// the status to answer: 404 for an unknown model, 503 when the pool has no
// usable endpoint.
func (g *Gateway) Decide(body *request.Body, meta Meta) (*Decision, error) {
	if err := g.trusted(meta.Header); err != nil {
		return nil, err
	}
	r, target, adapter, err := g.resolve(body, meta)
	if err != nil {
		return nil, err
	}
	return g.decide(r, body, meta, target, adapter)
}

// resolve finds the route (pool) of a request: body-based routing, an
// adapter maps to its base model.
func (g *Gateway) resolve(body *request.Body, meta Meta) (r *route, target, adapter string, err error) {
	t := g.table.Load()
	model := body.Model
	if h := meta.Header.Get(HeaderModelName); h != "" {
		model = h
	}
	// GIE's x-gateway-model-name-rewrite: the request is for this model
	// (scheduled on its pool, and the body's "model" rewritten to it
	// before it reaches the server; see Decision.Rewrite).
	if h := meta.Header.Get(HeaderModelRewrite); h != "" {
		model = h
	}
	target, adapter = model, ""
	if base := meta.Header.Get(HeaderBaseModelName); base != "" && base != model {
		target, adapter = base, model
	}
	r = t.byModel[target]
	if r == nil && adapter == "" {
		if base, ok := t.adapters[model]; ok && (t.bbr || len(t.byModel) == 1) {
			target, adapter, r = base, model, t.byModel[base]
		}
	}
	if r == nil {
		g.metrics.rejected.WithLabelValues("", "unknown_model").Inc()
		return nil, "", "", request.NotFound("model_not_found", unknownModelMessage)
	}
	return r, target, adapter, nil
}

// decide asks r's scheduler for the request's endpoints.
func (g *Gateway) decide(r *route, body *request.Body, meta Meta, target, adapter string) (*Decision, error) {
	start := g.cfg.Now()
	d := &Decision{Model: body.Model, Target: target, Adapter: adapter, Stream: body.Stream, Pool: r.state.name, sched: r.sched, state: r.state, start: start}
	if rw := meta.Header.Get(HeaderModelRewrite); rw != "" && rw != body.Model {
		d.Rewrite = rw
	}
	d.Request.Model, d.Request.Adapter = target, adapter
	d.Request.Tenant = meta.Header.Get(HeaderTenant)
	if d.Request.Tenant == "" {
		d.Request.Tenant = meta.Header.Get(HeaderFairnessID)
	}
	d.Request.Band = meta.Header.Get(HeaderBand)
	d.Request.Subset = meta.Subset
	// The prompt sketch reads the text the scheduler hashes, when it is
	// the form and covers the head the sketch compares: not built twice.
	var text *[]byte
	sketchHashes := false
	if p := g.cfg.Prompts; p != nil {
		limit, bs := r.sched.PromptTextLimit()
		sketchHashes = bs == p.Config().BlockSize
		if sketchHashes && limit >= p.Limit() {
			text = g.promptText.Get().(*[]byte)
			*text = r.sched.PrepareText(&d.Request, body, *text)
		}
	}
	if text == nil {
		r.sched.Prepare(&d.Request, body)
	}
	eps, err := r.sched.Schedule(&d.Request, start, nil)
	g.metrics.scheduling.WithLabelValues(d.Pool).Observe(g.cfg.Now().Sub(start).Seconds())
	if err != nil {
		if text != nil {
			g.promptText.Put(text)
		}
		g.metrics.rejected.WithLabelValues(d.Pool, "no_endpoints").Inc()
		if errors.Is(err, tier1.ErrContextLength) {
			// What vLLM itself answers for a prompt beyond max_model_len.
			return nil, request.BadRequest("context_length_exceeded", fmt.Sprintf(contextLengthMessage, target, d.Request.PromptTokens, d.Request.MaxTokens))
		}
		if errors.Is(err, tier1.ErrNoCapableEndpoint) {
			return nil, request.Unavailable("no_capable_endpoint", fmt.Sprintf(noCapableMessage, adapter, target))
		}
		return nil, request.Unavailable("no_endpoints", fmt.Sprintf(noEndpointsMessage, target))
	}
	d.Endpoints = eps
	if text != nil {
		g.cfg.Prompts.ObserveText(d.Request.Tenant, cmp.Or(d.Adapter, d.Target), *text, d.Request.Hashes, start)
		g.promptText.Put(text)
	} else if g.cfg.Prompts != nil {
		// The sketch reuses the scheduler's hashes only when they are
		// of its blocks (not in GIE mode, nor with another block size).
		var hashes []uint64
		if sketchHashes {
			hashes = d.Request.Hashes
		}
		g.cfg.Prompts.Observe(d.Request.Tenant, cmp.Or(d.Adapter, d.Target), body, hashes, start)
	}
	return d, nil
}

// Dispatch records that the decision's request is being sent to ep and
// returns the ticket on which to report its outcome.
func (g *Gateway) Dispatch(d *Decision, ep *tier1.Endpoint) *Attempt {
	now := g.cfg.Now()
	tk := d.sched.Dispatch(ep, &d.Request, now)
	d.dispatched()
	if len(d.Request.Hashes) > 0 {
		d.state.stats.observeHit(tk.PrefixHit())
	}
	if g.cfg.OnDispatch != nil && len(d.Request.Hashes) > 0 && d.sched.SharesPrefixIndex() {
		g.cfg.OnDispatch(d.Pool, tier1.PrefixEvent{Endpoint: ep.ID, Stamp: now.UnixNano(), Hashes: slices.Clone(d.Request.Hashes)})
	}
	a := &Attempt{g: g, d: d, ticket: tk, sent: now}
	a.publishInFlight()
	return a
}

// publishInFlight shares this replica's load on the attempt's endpoint
// with the other replicas.
func (a *Attempt) publishInFlight() {
	if a.g.cfg.OnInFlight != nil && a.d.sched.SharesPrefixIndex() {
		ep := a.ticket.Endpoint()
		a.g.cfg.OnInFlight(a.d.Pool, ep.ID, ep.LoadReport())
	}
}

// ApplyPeerInFlight records another replica's load on an endpoint of a
// pool (tier1.Scheduler.ApplyPeerInFlight).
func (g *Gateway) ApplyPeerInFlight(pool, replica, endpoint string, load tier1.PeerLoad) bool {
	t := g.table.Load()
	for _, r := range t.byModel {
		if r.state.name == pool {
			return r.sched.ApplyPeerInFlight(replica, endpoint, load)
		}
	}
	return false
}

// ForgetPeer drops the loads a replica reported, in every pool.
func (g *Gateway) ForgetPeer(replica string) {
	for _, v := range g.Pools() {
		v.Pool.ForgetPeer(replica)
	}
}

// ApplyPrefixEvent applies another replica's dispatch to a pool's index.
func (g *Gateway) ApplyPrefixEvent(pool string, ev tier1.PrefixEvent) bool {
	t := g.table.Load()
	for _, r := range t.byModel {
		if r.state.name == pool {
			return r.sched.ApplyPrefixEvent(ev)
		}
	}
	return false
}

// Attempt is one try of a decision on one endpoint.
type Attempt struct {
	g      *Gateway
	d      *Decision
	ticket tier1.Ticket
	sent   time.Time
	first  bool
}

// FirstByte reports the first response byte: the observed time feeds the
// endpoint's latency model (as a first token's when the request streams,
// as a whole answer's otherwise: Ticket.Answered) and the pool's
// statistics.
func (a *Attempt) FirstByte() {
	if a.first {
		return
	}
	a.first = true
	ttft := a.g.cfg.Now().Sub(a.sent)
	if a.d.Stream {
		a.ticket.FirstToken(ttft)
	} else {
		a.ticket.Answered(ttft)
	}
	// The request's prompt has left the prefill backlog: the other
	// replicas would otherwise count it until the request ends.
	a.publishInFlight()
	a.d.state.stats.observeTTFT(a.sent, ttft, a.d.Stream)
	a.g.metrics.ttft.WithLabelValues(a.d.Model, a.d.Pool, streamLabel(a.d.Stream)).Observe(ttft.Seconds())
}

// streamLabel is meridian_tier1_ttft_seconds's stream label: a streamed
// response's first byte is its first token, a non-streamed one's is the
// whole answer, and the two must not be read as one TTFT.
func streamLabel(stream bool) string {
	if stream {
		return "true"
	}
	return "false"
}

// canceledCode labels requests the caller abandoned (nginx's 499).
const canceledCode = 499

// Done ends the attempt with the HTTP status answered (0 for a transport
// failure) and whether it failed on the model server's side. A transport
// failure that is not the server's fault (the caller went away) is
// counted as canceled.
func (a *Attempt) Done(code int, failed bool) {
	if code == 0 && !failed {
		code = canceledCode
	}
	a.ticket.Done()
	a.publishInFlight()
	a.d.state.stats.observeOutcome(a.g.cfg.Now(), failed)
	a.g.metrics.duration.WithLabelValues(a.d.Model, a.d.Pool).Observe(a.g.cfg.Now().Sub(a.sent).Seconds())
	a.g.metrics.requests.WithLabelValues(modelLabel(a.g, a.d.Model), a.d.Target, a.d.Pool, codeLabel(code)).Inc()
}

// Fallback counts a retry on the decision's next endpoint.
func (g *Gateway) Fallback(d *Decision) { g.metrics.fallbacks.WithLabelValues(d.Pool).Inc() }

// Reject counts a request refused before routing (e.g. a bad body).
func (g *Gateway) Reject(reason string) { g.metrics.rejected.WithLabelValues("", reason).Inc() }

func modelLabel(g *Gateway, m string) string {
	t := g.table.Load()
	if _, ok := t.byModel[m]; ok {
		return m
	}
	if _, ok := t.adapters[m]; ok {
		return m
	}
	return "unknown"
}

func codeLabel(code int) string {
	if code == 0 {
		return "error"
	}
	if code == canceledCode {
		return "canceled"
	}
	return fmt.Sprint(code)
}

// Pools lists the pools with their state, for the health feed and metrics.
func (g *Gateway) Pools() []PoolView {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]PoolView, 0, len(g.pools))
	for _, ps := range g.pools {
		out = append(out, PoolView{Name: ps.name, Model: ps.model, Adapters: ps.adapters, Definition: ps.definition, Pool: ps.pool, stats: ps.stats, state: ps})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// PoolView is a read-only look at one pool.
type PoolView struct {
	Name, Model string
	Adapters    []string
	// Definition is the pool's definition as applied
	// (config.PoolDefinition), for drift between clusters.
	Definition []string
	Pool       *tier1.Pool
	stats      *poolStats
	state      *poolState
}

// TTFT returns the recent p50 and p99 time to first byte (zero without
// samples) and the recent error rate, over the window ending at now. The
// quantiles are the streamed requests' when the window has any, the
// non-streamed answers' latency otherwise.
func (v PoolView) TTFT(now time.Time, window time.Duration) (p50, p99 time.Duration, errRate float64) {
	return v.stats.summary(now, window)
}

// PodPrefix returns the pool's pod-reported prefix-cache hits and queries
// (cumulative counters summed over endpoints).
func (v PoolView) PodPrefix() (hits, queries uint64) {
	v.state.mu.Lock()
	defer v.state.mu.Unlock()
	for _, sc := range v.state.scrapers {
		hits += sc.hits.Load()
		queries += sc.queries.Load()
	}
	return hits, queries
}

// IndexHitRatio is the prefix hit ratio the index estimated for recent
// dispatches.
func (v PoolView) IndexHitRatio() float64 { return v.stats.indexHitRatio() }
