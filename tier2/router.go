// Package tier2 is Meridian's global router: the authenticated OpenAI
// front door that runs several times per Region behind one DNS name. For
// each request it walks explicit stages over one parsed request —
//
//	auth → parse → model resolution → admission → rate limit →
//	cluster choice → forward (fail over before the first byte) → accounting
//
// — and forwards to the chosen cluster's Tier-1. The decisions belong to
// the policy packages (rewrite, priority, ratelimit, regions); this package
// does the I/O around them: HTTP, the pool-health subscriptions, gossip.
package tier2

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/tracing"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/ratelimit"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/request"
	"github.com/meridian-router/meridian/rewrite"
)

// Config configures a Router. Zero fields take the defaults in comments.
type Config struct {
	// Region this instance runs in.
	Region string
	// Fleet orders clusters for each request. Required.
	Fleet *regions.Fleet
	// Auth verifies callers. Nil requires InsecureNoAuth. SetAuth
	// replaces it while serving.
	Auth *Authenticator
	// InsecureNoAuth lets unauthenticated callers in as tenant
	// "anonymous" (local development only).
	InsecureNoAuth bool
	// Limiter enforces global per-tenant rate limits; nil means none.
	Limiter *ratelimit.Limiter
	// Priority admits by band per target model; nil means everything is
	// admitted at once.
	Priority *Admission
	// Transport carries requests to Tier-1s. Nil means NewTransport().
	Transport http.RoundTripper
	// MaxBodyBytes limits request bodies. Zero means 4 MiB.
	MaxBodyBytes int64
	// PrefixBlocks is how many leading prompt blocks of 256 characters key
	// cluster-level prefix affinity. Zero means 4 (about 256 tokens: a
	// system prompt).
	PrefixBlocks int
	// DefaultMaxTokens is the output-token estimate charged to token
	// limits for a request without max_tokens. Zero means 256.
	DefaultMaxTokens int
	// DefaultTenant, when set, names the Tenant whose policy applies to a
	// caller whose token names a tenant without a Tenant object. Empty
	// (the default): such callers are refused with 403.
	DefaultTenant string
	// Tier1Key signs the tenant and band sent to Tier-1s (internal/trust);
	// nil sends them unsigned, for Tier-1s that do not verify.
	Tier1Key []byte
	// ExposeUpstream shows callers the pod address headers Tier-1 sets
	// (x-gateway-destination-endpoint-served): a debugging aid that
	// discloses the cluster's internal addresses. Off by default.
	ExposeUpstream bool
	// BodyReadTimeout bounds reading a request's body, from the end of its
	// headers (a slow or stalled upload holds a connection and a
	// goroutine). Zero means 30 s; a 408 after it.
	BodyReadTimeout time.Duration
	// UpstreamHeaderTimeout bounds the wait for a Tier-1's response
	// headers to a streaming request (a stream answers them with its first
	// event; waiting includes queueing in the cluster). After it the
	// attempt fails over to the next cluster, and the caller gets a 504
	// when none answers. Zero means 60 s.
	UpstreamHeaderTimeout time.Duration
	// UpstreamResponseTimeout is UpstreamHeaderTimeout for a non-streaming
	// request, whose headers come only with the whole completion. Zero
	// means 10 min.
	UpstreamResponseTimeout time.Duration
	// StreamIdleTimeout ends a stream (with an error event) when its
	// Tier-1 sends nothing for this long. Zero means 60 s.
	StreamIdleTimeout time.Duration
	// MaxHeaders bounds the number of request header values (431 beyond).
	// The size of the headers is bounded by the http.Server's
	// MaxHeaderBytes. Zero means 100.
	MaxHeaders int
	// Tracer, when set, traces every inference request (internal/tracing):
	// a server span continuing the caller's traceparent, spans for
	// admission, the rate limit, the cluster choice and each upstream
	// attempt, whose context goes to the Tier-1 as traceparent. Nil (the
	// default): no spans, and a caller's traceparent and tracestate go on
	// to the Tier-1 unchanged.
	Tracer trace.Tracer
	// AccessLog, when set, gets one line per inference request at its end
	// (request id, tenant, models, status, cluster, tokens charged,
	// duration). Nil: none.
	AccessLog *slog.Logger
	Logger    *slog.Logger
	Metrics   *Metrics
	Now       func() time.Time
}

// Router serves the front door. Apply swaps its configuration.
type Router struct {
	cfg  Config
	log  *slog.Logger
	m    *Metrics
	snap atomic.Pointer[state]
	auth atomic.Pointer[Authenticator]
	// stopping ends every upstream attempt when Abort is called.
	stopping context.Context
	abort    context.CancelFunc
	bufs     sync.Pool
	readers  sync.Pool // *relayReader, a 32 KiB buffer for relaying event streams
	cohorts  sync.Map  // rewrite name → *rewrite.Cohort of its rollout's state; see Canary
}

// state is one configuration's derived routing state.
type state struct {
	snap     *config.Snapshot
	resolver *rewrite.Resolver
	tenants  *priority.Tenants
	served   map[string]bool // target models some scheduler serves (models and adapters)
}

// NewRouter builds a router over the first configuration.
func NewRouter(cfg Config, snap *config.Snapshot) (*Router, error) {
	if cfg.Fleet == nil {
		return nil, errors.New("tier2: a Fleet is required")
	}
	if cfg.Auth == nil && !cfg.InsecureNoAuth {
		return nil, errors.New("tier2: no JWT authentication is configured (spec.auth.jwt of this Region's gateways); pass --insecure-no-auth to run without it")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Transport == nil {
		cfg.Transport = NewTransport()
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = request.DefaultMaxBytes
	}
	if cfg.PrefixBlocks <= 0 {
		cfg.PrefixBlocks = 4
	}
	if cfg.DefaultMaxTokens <= 0 {
		cfg.DefaultMaxTokens = 256
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	for _, d := range []struct {
		p   *time.Duration
		def time.Duration
	}{
		{&cfg.BodyReadTimeout, 30 * time.Second},
		{&cfg.UpstreamHeaderTimeout, 60 * time.Second},
		{&cfg.UpstreamResponseTimeout, 10 * time.Minute},
		{&cfg.StreamIdleTimeout, 60 * time.Second},
	} {
		if *d.p <= 0 {
			*d.p = d.def
		}
	}
	if cfg.MaxHeaders <= 0 {
		cfg.MaxHeaders = 100
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	r := &Router{cfg: cfg, log: cfg.Logger, m: cfg.Metrics}
	r.auth.Store(cfg.Auth)
	r.stopping, r.abort = context.WithCancel(context.Background())
	r.bufs.New = func() any { return new([32 << 10]byte) }
	r.readers.New = func() any {
		rr := &relayReader{}
		rr.br = bufio.NewReaderSize(rr, 32<<10)
		return rr
	}
	if err := r.Apply(snap); err != nil {
		return nil, err
	}
	return r, nil
}

// SetAuth replaces the authenticator (a reloaded spec.auth.jwt). Nil is
// refused unless the router runs with InsecureNoAuth.
func (r *Router) SetAuth(a *Authenticator) error {
	if a == nil && !r.cfg.InsecureNoAuth {
		return errors.New("tier2: no JWT authentication is configured")
	}
	r.auth.Store(a)
	return nil
}

// Abort ends every request still being relayed: each stream gets an error
// event. Call it when a drain's deadline passes, before closing the
// listeners, so that no stream is cut without one.
func (r *Router) Abort() { r.abort() }

// Apply swaps in a new configuration; on error the running one stays.
func (r *Router) Apply(snap *config.Snapshot) error {
	res, err := rewrite.NewResolver(snap.Rewrites)
	if err != nil {
		return err
	}
	var tn *priority.Tenants
	if old := r.snap.Load(); old != nil {
		tn = old.tenants // shared with the admission gates: update in place
		if err := tn.Update(snap.Tenants); err != nil {
			return err
		}
	} else if tn, err = priority.NewTenants(snap.Tenants, nil); err != nil {
		return err
	}
	if r.cfg.Limiter != nil {
		if err := r.cfg.Limiter.Update(snap.Tenants); err != nil {
			return err
		}
	}
	st := &state{snap: snap, resolver: res, tenants: tn, served: map[string]bool{}}
	for _, g := range snap.Gateways {
		for _, sc := range g.Spec.Schedulers {
			st.served[sc.ModelName] = true
			for _, a := range sc.LoraAdapters {
				st.served[a] = true
			}
		}
	}
	for a := range snap.Adapters {
		st.served[a] = true
	}
	r.snap.Store(st)
	return nil
}

// inferencePaths are the OpenAI endpoints routed by model (request.KindOf).
var inferencePaths = [...]string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}

// Handler returns the front door's routes. Every route but /healthz and
// /readyz authenticates, including the answer to an unrouted path (a 404
// before anything is charged). Every answer carries x-request-id
// (request.ID).
func (r *Router) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, p := range inferencePaths {
		mux.HandleFunc("POST "+p, r.serveInference)
	}
	mux.HandleFunc("GET /v1/models", r.serveModels)
	mux.HandleFunc("GET /v1/models/{model}", r.serveModel)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", r.serveReady)
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		if _, e := r.identify(r.snap.Load(), req); e != nil {
			e.Write(w)
			return
		}
		request.NotFound("not_found", "no route for "+req.Method+" "+req.URL.Path).Write(w)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		n := 0
		for _, vs := range req.Header {
			n += len(vs)
		}
		if n > r.cfg.MaxHeaders {
			request.UseID(req.Header, w.Header())
			(&request.APIError{Status: http.StatusRequestHeaderFieldsTooLarge, Type: "invalid_request_error", Code: "too_many_headers",
				Message: fmt.Sprintf("%d header values, at most %d are accepted", n, r.cfg.MaxHeaders)}).Write(w)
			return
		}
		request.CloseAfterChunked(w, req)
		stripInternal(req.Header)
		if req.Method != http.MethodPost || request.KindOf(req.URL.Path) == 0 {
			request.UseID(req.Header, w.Header()) // serveInference keeps its id in its call
		}
		mux.ServeHTTP(w, req)
	})
}

// stripInternal removes the headers only Meridian may set (x-gateway-*,
// x-meridian-*) from a caller's request: they steer routing and carry
// identity between the tiers. The criticality a caller claims without a
// token (InsecureNoAuth) is kept as x-meridian-criticality's value in
// insecureCriticality.
func stripInternal(h http.Header) {
	for k := range h {
		if len(k) > 2 && (k[0] == 'X' || k[0] == 'x') && k[1] == '-' && (hasFoldPrefix(k[2:], "gateway-") || hasFoldPrefix(k[2:], "meridian-")) {
			if strings.EqualFold(k, "X-Meridian-Criticality") {
				h[insecureCriticality] = h[k]
			}
			delete(h, k)
		}
	}
}

// insecureCriticality is a header key no HTTP parser produces (it is not
// canonical), so only stripInternal can set it.
const insecureCriticality = "x-meridian-criticality"

func hasFoldPrefix(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

func (r *Router) serveReady(w http.ResponseWriter, _ *http.Request) {
	if len(r.cfg.Fleet.Digests().Digests()) == 0 {
		request.Unavailable("not_ready", "no pool-health digest received yet").Write(w)
		return
	}
	w.Write([]byte("ready\n"))
}

// modelObject is a model as OpenAI's /v1/models answers it.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func newModelObject(id string) modelObject {
	return modelObject{ID: id, Object: "model", OwnedBy: "meridian"}
}

// callerModels is modelIDs for the caller of req; when the caller is
// refused, it writes the error and reports false.
func (r *Router) callerModels(w http.ResponseWriter, req *http.Request) ([]string, bool) {
	st := r.snap.Load()
	caller, e := r.identify(st, req)
	if e != nil {
		e.Write(w)
		return nil, false
	}
	return r.modelIDs(st, caller.Tenant), true
}

// serveModel answers one model of the caller's list, or 404.
func (r *Router) serveModel(w http.ResponseWriter, req *http.Request) {
	ids, ok := r.callerModels(w, req)
	if !ok {
		return
	}
	id := req.PathValue("model")
	if !slices.Contains(ids, id) {
		request.NotFound("model_not_found", fmt.Sprintf("the model %q does not exist or is not served", id)).Write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(newModelObject(id))
}

// serveModels lists the models the caller may call that some cluster
// serves with a fresh digest, plus the public names of rewrites.
func (r *Router) serveModels(w http.ResponseWriter, req *http.Request) {
	ids, ok := r.callerModels(w, req)
	if !ok {
		return
	}
	data := make([]modelObject, len(ids))
	for i, id := range ids {
		data[i] = newModelObject(id)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// modelIDs lists, sorted, every model some cluster serves with a fresh
// digest and every public name of a rewrite that tenant may call.
func (r *Router) modelIDs(st *state, tenant string) []string {
	seen := map[string]bool{}
	for _, d := range r.cfg.Fleet.Digests().Digests() {
		if d.ReadyPods > 0 {
			seen[d.Model] = true
			for _, a := range d.Adapters {
				seen[a] = true
			}
		}
	}
	for _, rw := range st.snap.Rewrites {
		for _, rule := range rw.Spec.Rules {
			for _, m := range rule.Matches {
				if m.Model != nil {
					seen[m.Model.Value] = true
				}
			}
		}
	}
	var allowed []string
	if t := st.snap.Tenants[tenant]; t != nil {
		allowed = t.Spec.Models
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		if len(allowed) == 0 || slices.Contains(allowed, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// call is one request as it walks the stages.
type call struct {
	start time.Time
	// id is the request's x-request-id, held in reqID.
	id    string
	reqID request.ID
	kind  request.Kind // the endpoint's
	// status is the answer's (the access log's).
	status int
	// span is the request's server span, upstream its current attempt's
	// (nil: not traced).
	span, upstream trace.Span
	// servedHdr holds the values of X-Meridian-Region and -Cluster
	// (Router.responseHeader).
	servedHdr [2]string
	caller    *Caller
	band      priority.Band
	body      *request.Body
	// promptTokens is the body's prompt estimate, taken once when it is
	// parsed: what is charged when upstream reports no usage, and still
	// known once the prompt itself is released.
	promptTokens int64
	params       request.Params
	raw          []byte
	resolved     rewrite.Resolution
	rl           ratelimit.Decision
	ticket       *priority.Ticket
	spill        bool // admission asked to prefer another Region
	served       regions.Target
	settled      bool // token usage reconciled
	// forwarded: every stage let the request through; it is charged.
	forwarded bool
	// hideUsage, hideContinuous: Tier-2 asked upstream for a final usage
	// chunk, or usage in every chunk, the caller did not request; relay
	// removes them.
	hideUsage, hideContinuous bool
	chargeLabel               string   // tenant label of meridian_tier2_charged_tokens_total
	charged                   int64    // tokens settled (the access log's)
	watch                     watchdog // the current attempt's timeouts
}

func (r *Router) serveInference(w http.ResponseWriter, req *http.Request) {
	c := &call{start: r.cfg.Now(), kind: request.KindOf(req.URL.Path)}
	c.id = c.reqID.Use(req.Header, w.Header())
	if r.cfg.Tracer != nil {
		req = r.traceRequest(c, req)
	}
	defer func() {
		if c.forwarded && !c.settled {
			r.settle(c, 0) // a panic (http.ErrAbortHandler) while relaying
		}
		if c.span != nil {
			if c.upstream != nil { // the relay was aborted
				r.endUpstream(c, 0, "aborted")
			}
			r.endTrace(c)
		}
		if r.cfg.AccessLog != nil {
			r.accessLog(c)
		}
	}()
	// Stages, in order. Each either lets the request through or answers.
	st := r.snap.Load()
	stages := [...]func(*state, *call, http.ResponseWriter, *http.Request) *request.APIError{
		r.authenticate, r.parse, r.resolve, r.admit, r.rateLimit,
	}
	for i, stage := range stages {
		var sp trace.Span
		if c.span != nil && stageSpans[i] != "" {
			_, sp = r.cfg.Tracer.Start(req.Context(), stageSpans[i])
		}
		e := stage(st, c, w, req)
		if sp != nil {
			endSpan(sp, e)
		}
		if e != nil {
			r.reject(st, c, e, w)
			return
		}
	}
	defer c.ticket.Done()
	c.forwarded = true
	r.forward(st, c, w, req)
}

// stageSpans names the span of each stage of serveInference that has one.
var stageSpans = [...]string{3: "tier2.admission", 4: "tier2.rate_limit"}

// traceRequest starts the request's server span, continuing the caller's
// traceparent, and returns req with it in its context.
func (r *Router) traceRequest(c *call, req *http.Request) *http.Request {
	ctx, span := r.cfg.Tracer.Start(tracing.Extract(req.Context(), req.Header), "tier2 "+req.URL.Path,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", req.Method), attribute.String("url.path", req.URL.Path),
			attribute.String("meridian.request_id", c.id), attribute.String("meridian.region", r.cfg.Region)))
	c.span = span
	return req.WithContext(ctx)
}

// endTrace ends the request's server span with what was decided.
func (r *Router) endTrace(c *call) {
	attrs := []attribute.KeyValue{attribute.Int("http.response.status_code", c.status)}
	if c.caller != nil {
		attrs = append(attrs, attribute.String("meridian.tenant", c.caller.Tenant), attribute.String("meridian.band", c.band.String()))
	}
	if c.resolved.Target != "" {
		attrs = append(attrs, attribute.String("gen_ai.request.model", c.resolved.Public), attribute.String("meridian.target_model", c.resolved.Target))
	}
	if c.served.Cluster != "" {
		attrs = append(attrs, attribute.String("meridian.cluster", c.served.Cluster), attribute.String("meridian.served_region", c.served.Region))
	}
	c.span.SetAttributes(attrs...)
	if c.status >= 500 {
		c.span.SetStatus(codes.Error, http.StatusText(c.status))
	}
	c.span.End()
}

// endSpan ends a stage's span, marked failed when the stage refused.
func endSpan(sp trace.Span, e *request.APIError) {
	if e != nil {
		sp.SetAttributes(attribute.Int("http.response.status_code", e.Status), attribute.String("error.type", e.Code))
		sp.SetStatus(codes.Error, e.Message)
	}
	sp.End()
}

// accessLog writes the request's access-log line.
func (r *Router) accessLog(c *call) {
	tenant := ""
	if c.caller != nil {
		tenant = c.caller.Tenant
	}
	r.cfg.AccessLog.Info("request", "request_id", c.id, "endpoint", c.kind.String(), "tenant", tenant, "band", c.band.String(),
		"model", c.resolved.Public, "target", c.resolved.Target, "status", c.status, "region", c.served.Region, "cluster", c.served.Cluster,
		"tokens", c.charged, "duration", r.cfg.Now().Sub(c.start))
}

// reject answers a request a stage refused and counts it.
func (r *Router) reject(st *state, c *call, e *request.APIError, w http.ResponseWriter) {
	c.status = e.Status
	tenant, band := "unknown", c.band.String()
	if c.caller != nil {
		tenant = st.tenantLabel(c.caller.Tenant)
	}
	reason := e.Code
	if reason == "rate_limit_exceeded" {
		reason = "rate_limit_" + e.Type // requests or tokens, as before OpenAI's code
	}
	r.m.rejected.WithLabelValues(tenant, band, reason).Inc()
	model := ""
	if c.body != nil {
		model = st.modelLabel(c.body.Model)
	}
	r.m.request(requestLabels{model, st.modelLabel(c.resolved.Target), "", "", statusLabel(e.Status)}).Inc()
	e.Write(w)
}

func (st *state) tenantLabel(t string) string {
	if _, ok := st.snap.Tenants[t]; ok || t == "anonymous" {
		return t
	}
	return "unknown"
}

func (st *state) modelLabel(m string) string {
	if m == "" {
		return ""
	}
	if st.served[m] {
		return m
	}
	if _, ok := st.resolver.Resolve(rewrite.Request{Model: m}); ok {
		return m
	}
	return "unknown"
}

// Stage 1: authentication.
func (r *Router) authenticate(st *state, c *call, _ http.ResponseWriter, req *http.Request) *request.APIError {
	caller, e := r.identify(st, req)
	if e != nil {
		return e
	}
	c.caller = caller
	c.chargeLabel = st.tenantLabel(caller.Tenant)
	return nil
}

// identify authenticates a request and refuses a tenant the configuration
// does not know (fail closed), unless DefaultTenant names a Tenant whose
// policy such callers get.
func (r *Router) identify(st *state, req *http.Request) (*Caller, *request.APIError) {
	auth := r.auth.Load()
	if auth == nil {
		c := &Caller{Tenant: "anonymous", Subject: "anonymous"}
		if vs := req.Header[insecureCriticality]; len(vs) > 0 {
			c.Band = vs[0]
		}
		return c, nil
	}
	caller, err := auth.Authenticate(req.Context(), req.Header.Get("Authorization"))
	if err != nil {
		return nil, &request.APIError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "unauthenticated", Message: err.Error()}
	}
	return r.knownTenant(st, caller)
}

// knownTenant refuses an authenticated caller whose tenant the
// configuration does not know, or gives it DefaultTenant's policy.
func (r *Router) knownTenant(st *state, caller *Caller) (*Caller, *request.APIError) {
	if _, ok := st.snap.Tenants[caller.Tenant]; !ok {
		if _, ok := st.snap.Tenants[r.cfg.DefaultTenant]; r.cfg.DefaultTenant == "" || !ok {
			return nil, &request.APIError{Status: http.StatusForbidden, Type: "permission_error", Code: "unknown_tenant",
				Message: fmt.Sprintf("tenant %q is not configured: ask the operator to add a Tenant object for it", caller.Tenant)}
		}
		c := *caller
		c.Tenant = r.cfg.DefaultTenant
		caller = &c
	}
	return caller, nil
}

// Stage 2: read the body within BodyReadTimeout, parse it once and
// validate its parameters, before anything is admitted or charged.
func (r *Router) parse(_ *state, c *call, w http.ResponseWriter, req *http.Request) *request.APIError {
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(r.cfg.Now().Add(r.cfg.BodyReadTimeout)) == nil
	var err error
	c.body, c.raw, err = request.ReadSizedAs(req.Body, req.ContentLength, r.cfg.MaxBodyBytes, c.kind)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The deadline stays passed, and the connection closes after the
		// 408: net/http reads what is left of a short body before it
		// answers, and would wait for a stalled one without end.
		w.Header().Set("Connection", "close")
		return r.bodyTimeout()
	}
	if deadline {
		rc.SetReadDeadline(time.Time{})
	}
	return r.parsed(c, err)
}

// bodyTimeout is the answer to a body not received within BodyReadTimeout.
func (r *Router) bodyTimeout() *request.APIError {
	return &request.APIError{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
		Message: fmt.Sprintf("the request body was not received within %s", r.cfg.BodyReadTimeout)}
}

// parsed finishes stage 2 once the body is read (err: reading or parsing
// it failed).
func (r *Router) parsed(c *call, err error) *request.APIError {
	if err == nil {
		c.promptTokens = int64(c.body.EstimateTokens())
		c.params, err = request.ValidateParsed(c.raw, c.body)
	}
	if err != nil {
		return request.BodyError(err)
	}
	return nil
}

// Stage 3: model resolution (canary splits) and the tenant's allowed models.
func (r *Router) resolve(st *state, c *call, _ http.ResponseWriter, req *http.Request) *request.APIError {
	res, _ := st.resolver.Resolve(rewrite.Request{Model: c.body.Model, Tenant: c.caller.Tenant, Header: req.Header})
	if res.Target == "" {
		res = rewrite.Resolution{Public: c.body.Model, Target: c.body.Model}
	}
	c.resolved = res
	if !st.served[res.Target] {
		return request.NotFound("model_not_found", fmt.Sprintf("the model %q does not exist or is not served", c.body.Model))
	}
	if t := st.snap.Tenants[c.caller.Tenant]; t != nil && len(t.Spec.Models) > 0 &&
		!slices.Contains(t.Spec.Models, res.Public) && !slices.Contains(t.Spec.Models, res.Target) {
		return &request.APIError{Status: http.StatusForbidden, Type: "permission_error", Code: "model_not_allowed",
			Message: fmt.Sprintf("tenant %q may not call model %q", c.caller.Tenant, res.Public)}
	}
	r.observeCohort(res)
	return nil
}

// Stage 4: admission by priority band.
func (r *Router) admit(st *state, c *call, _ http.ResponseWriter, req *http.Request) *request.APIError {
	pr, e := r.banded(st, c)
	if e != nil || r.cfg.Priority == nil {
		return e
	}
	tk, spill, err := r.cfg.Priority.Admit(req.Context(), c.resolved.Target, pr)
	return r.admitted(c, tk, spill, err)
}

// banded sets the request's band (the claimed one, lowered to the
// tenant's maxBand) and returns what admission is asked.
func (r *Router) banded(st *state, c *call) (priority.Request, *request.APIError) {
	claimed := priority.Standard
	if c.caller.Band != "" {
		b, err := priority.ParseBand(c.caller.Band)
		if err != nil {
			return priority.Request{}, &request.APIError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "bad_criticality", Message: err.Error()}
		}
		claimed = b
	}
	if r.cfg.Priority == nil {
		c.band = st.tenants.Band(c.caller.Tenant, claimed)
	} else {
		c.band = r.cfg.Priority.Band(st.snap, c.caller.Tenant, claimed) // lowered to maxBand, counted
	}
	return priority.Request{Tenant: c.caller.Tenant, Band: c.band, Bytes: int64(len(c.raw))}, nil
}

// admitted is admission's outcome as the stage's answer.
func (r *Router) admitted(c *call, tk *priority.Ticket, spill bool, err error) *request.APIError {
	if err != nil {
		var rej *priority.Rejection
		if errors.As(err, &rej) {
			return request.TooManyRequests(rej.Code(), fmt.Sprintf("%s request shed: the model %q is at capacity (%s)", c.band, c.resolved.Public, rej.Reason),
				int(math.Ceil(rej.RetryAfter.Seconds())))
		}
		return request.Unavailable("admission", err.Error())
	}
	c.ticket, c.spill = tk, spill
	return nil
}

// Stage 5: global per-tenant rate limits.
func (r *Router) rateLimit(_ *state, c *call, w http.ResponseWriter, _ *http.Request) *request.APIError {
	if r.cfg.Limiter == nil {
		return nil
	}
	mt := c.params.MaxTokens
	switch {
	case c.kind == request.Embedding:
		mt = 0 // no output tokens
	case mt <= 0:
		mt = int64(r.cfg.DefaultMaxTokens)
	}
	est := request.EstimateCharge(c.promptTokens, mt, c.params.N)
	c.rl = r.cfg.Limiter.Allow(ratelimit.Request{Tenant: c.caller.Tenant, Model: c.resolved.Target, Band: c.band.String(), Tokens: est})
	if w != nil { // nil: the caller writes c.rl's headers itself
		c.rl.Headers(headerSetter(w.Header()))
	}
	if !c.rl.Allowed {
		c.settled = true // nothing was charged
		c.ticket.Done()
		// OpenAI's shape: type "requests" or "tokens", code
		// rate_limit_exceeded, param null.
		kind := "requests"
		if strings.Contains(c.rl.Reason, "token") {
			kind = "tokens"
		}
		return &request.APIError{Status: http.StatusTooManyRequests, Type: kind, Code: "rate_limit_exceeded",
			Message:    fmt.Sprintf("Rate limit reached for tenant %q on %s (%s). Please try again in %s.", c.caller.Tenant, kind, c.rl.Reason, c.rl.RetryAfter.Round(time.Millisecond)),
			RetryAfter: int(math.Ceil(c.rl.RetryAfter.Seconds()))}
	}
	return nil
}
