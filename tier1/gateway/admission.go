package gateway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/trust"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/request"
)

// Admission configures Tier-1's per-pool flow control by priority band
// (docs/priority.md). Every pool has one priority.Gate; a request waits in
// it, if its pool is saturated, before the scheduler picks its pod, so the
// pod is chosen when the request leaves the queue (late binding).
type Admission struct {
	// Off turns admission off: every request is scheduled at once, as
	// GIE does for non-negative priorities. Zero (false) means on.
	Off bool
	// Gate applies to every pool's Gate: queue bounds in requests and
	// bytes, maximum waits, the Critical reserve and Retry-After. The zero
	// Config is priority's defaults (1,000 requests, 256 MiB, 10 s for
	// Standard, 30 s for Critical, reserve 0.65, Retry-After 1 s).
	Gate priority.Config
	// Thresholds turn pod metrics into a pool's saturation. Zero fields
	// take priority.DefaultThresholds: 5 waiting requests per pod, KV use
	// 0.8, metrics older than 2 s left out (not counted as saturated).
	Thresholds priority.Thresholds
	// Objectives maps InferenceObjective names, as sent in
	// x-gateway-inference-objective, to their spec.priority. A value that
	// names none and is an integer is taken as the priority itself. Nil
	// means integers only.
	Objectives map[string]int
	// Interval is how often each pool's saturation is recomputed from its
	// endpoints' last scrapes and in-flight counts and handed to its Gate.
	// Zero means the scrape interval (50 ms by default): observing faster
	// sees nothing new; slower leaves the Gate on its own in-flight
	// accounting for longer.
	Interval time.Duration
}

// Band reads a request's tenant and band from its headers: the tenant
// from x-meridian-tenant (set by Tier-2) or GIE's
// x-gateway-inference-fairness-id; the claimed band from x-meridian-band
// (a band name, set by Tier-2) or GIE's x-gateway-inference-objective (an
// InferenceObjective name or an integer priority, negative = Sheddable).
// No header means Standard. With a Tier2Key, an unsigned objective cannot
// claim more than Standard. The claim is lowered to the tenant's maxBand
// and the downgrade counted. An unreadable header is a 400.
func (g *Gateway) Band(h http.Header) (tenant string, band priority.Band, err error) {
	tenant = h.Get(HeaderTenant)
	if tenant == "" {
		tenant = h.Get(HeaderFairnessID)
	}
	claim := priority.Standard
	if v := h.Get(HeaderBand); v != "" {
		claim, err = priority.ParseBand(v)
	} else {
		claim, err = priority.ParseObjective(h.Get(HeaderObjective), g.table.Load().objectives)
		// Behind a Tier-2 (Tier2Key set), a band comes signed in
		// x-meridian-band; an objective nobody signed may lower the
		// request's priority but not raise it above Standard.
		if g.cfg.Tier2Key != nil && claim > priority.Standard {
			claim = priority.Standard
		}
	}
	if err != nil {
		return tenant, priority.Standard, request.BadRequest("bad_priority", err.Error())
	}
	return tenant, g.tenants.Band(tenant, claim), nil
}

// trusted checks that x-meridian-tenant and x-meridian-band, when a
// request carries them, were set by a Tier-2 holding Config.Tier2Key.
func (g *Gateway) trusted(h http.Header) error {
	if g.cfg.Tier2Key == nil {
		return nil
	}
	tenant, band := h.Values(HeaderTenant), h.Values(HeaderBand)
	if len(tenant) == 0 && len(band) == 0 {
		return nil
	}
	err := errors.New("more than one x-meridian-tenant or x-meridian-band")
	if len(tenant) <= 1 && len(band) <= 1 {
		err = trust.Verify(g.cfg.Tier2Key, h.Get(trust.Header), h.Get(HeaderTenant), h.Get(HeaderBand), g.cfg.Now())
	}
	if err != nil {
		g.metrics.rejected.WithLabelValues("", "untrusted_identity").Inc()
		return &request.APIError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "untrusted_identity", Message: err.Error()}
	}
	return nil
}

// Route admits a parsed request into its pool by band and then decides
// its pod, like Decide. While the pool is saturated it waits (Standard and
// Critical, Critical first, fair between tenants) or is refused at once
// (Sheddable); the pod is picked only once it leaves the queue. A refusal
// is a *request.APIError 429 with RetryAfter; ctx ending while it waits
// returns ctx's error. Call Decision.Release once the request has ended,
// however it ended, so that the capacity goes to the next waiter.
func (g *Gateway) Route(ctx context.Context, body *request.Body, meta Meta) (*Decision, error) {
	if err := g.trusted(meta.Header); err != nil {
		return nil, err
	}
	r, target, adapter, err := g.resolve(body, meta)
	if err != nil {
		return nil, err
	}
	var tk *priority.Ticket
	if !g.cfg.Admission.Off {
		tenant, band, err := g.Band(meta.Header)
		if err != nil {
			g.metrics.rejected.WithLabelValues(r.state.name, "bad_request").Inc()
			return nil, err
		}
		tk, err = r.state.gate.Admit(ctx, priority.Request{Tenant: tenant, Band: band, Bytes: meta.Bytes})
		if err != nil {
			return nil, g.admissionError(r.state.name, target, err)
		}
	}
	d, err := g.decide(r, body, meta, target, adapter)
	if err != nil {
		tk.Done()
		return nil, err
	}
	d.ticket = tk
	if tk != nil {
		// Admitted but on no endpoint's in-flight count until Dispatch:
		// counted apart so that an observation in between sees it. Until
		// Seen, the Gate counts it itself (ObservePools).
		r.state.pending.Add(1)
		d.pending.Store(true)
		tk.Seen()
	}
	return d, nil
}

// Release ends the decision's hold on its pool's admission capacity. It is
// idempotent, and a no-op for a decision made without admission (Decide).
func (d *Decision) Release() {
	d.dispatched()
	d.ticket.Done()
}

// dispatched ends the decision's count as admitted and not yet sent.
func (d *Decision) dispatched() {
	if d.pending.CompareAndSwap(true, false) {
		d.state.pending.Add(-1)
	}
}

func (g *Gateway) admissionError(pool, model string, err error) error {
	var rej *priority.Rejection
	if !errors.As(err, &rej) {
		return err // the caller went away while waiting
	}
	code := rej.Code()
	g.metrics.rejected.WithLabelValues(pool, code).Inc()
	return request.TooManyRequests(code,
		fmt.Sprintf("%s request shed: the pool serving %q is at capacity (%s)", rej.Band, model, rej.Reason),
		int(math.Ceil(rej.RetryAfter.Seconds())))
}

// observeLoop hands every pool's saturation to its Gate every interval
// until ctx ends.
func (g *Gateway) observeLoop(ctx context.Context) {
	every := g.cfg.Admission.Interval
	if every <= 0 {
		every = g.cfg.Scrape.Interval
	}
	if every <= 0 {
		every = 50 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		g.ObservePools()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ObservePools computes every pool's saturation now and hands it to the
// pool's Gate. Start runs it every Admission.Interval; tests call it to
// apply fresh metrics at once.
//
// The mark is taken first: a request the Gate admitted that is not yet
// counted as pending (between Admit and decide's end) or was admitted
// while the saturation was computed is not in it, and the Gate keeps
// counting it (priority.Gate.ObserveSince). Resetting the Gate's count
// instead let such requests through uncounted until the next scrape
// showed them on the pod: under load, 7 of 8 requests reached a pod the
// Gate should have held at 5 (bench/priority TestOverloadThroughBothTiers).
func (g *Gateway) ObservePools() {
	now := g.cfg.Now()
	for _, v := range g.Pools() {
		mark := v.state.gate.Mark()
		v.state.gate.ObserveSince(v.Saturation(now, v.Thresholds()), mark)
	}
}

// Waiting is the number of requests waiting in the pool's admission Gate.
func (v PoolView) Waiting() int {
	if v.state == nil {
		return 0
	}
	return v.state.gate.Len()
}

// MaxQueued is the most requests the pool's Gate holds waiting.
func (v PoolView) MaxQueued() int {
	if v.state == nil {
		return 0
	}
	return v.state.gate.Config().MaxQueued
}

// AdmitRate is the requests per second the pool's Gate let in lately
// (priority.Gate.AdmitRate).
func (v PoolView) AdmitRate() float64 {
	if v.state == nil {
		return 0
	}
	return v.state.gate.AdmitRate()
}

// Thresholds are the pool's saturation thresholds in force.
func (v PoolView) Thresholds() priority.Thresholds {
	if v.state != nil {
		if th := v.state.thresholds.Load(); th != nil {
			return *th
		}
	}
	return priority.Thresholds{}
}

// forPool is a's Gate configuration and thresholds with a pool's
// admission settings laid over them: a field the configuration sets wins.
func (a Admission) forPool(c *config.Admission) (priority.Config, priority.Thresholds) {
	return priority.Overlay(a.Gate, a.Thresholds, c)
}

// objectives are the configuration's InferenceObjectives over a's.
func (a Admission) objectives(snap *config.Snapshot) map[string]int {
	out := snap.ObjectivePriorities()
	for name, p := range a.Objectives {
		if _, ok := out[name]; !ok {
			out[name] = p
		}
	}
	return out
}

// Saturation is the pool's saturation at now under th
// (priority.Thresholds.Pool): over its ready endpoints, each pod's load is
// its scraped waiting requests plus the requests in flight to it beyond
// what the scrape showed (so a burst sent since the last scrape counts),
// and its KV-cache use; endpoints whose metrics are older than
// th.StaleAfter are left out. Requests admitted and not yet sent to a pod
// count as waiting requests spread over the pool. The health feed ships
// the same value.
func (v PoolView) Saturation(now time.Time, th priority.Thresholds) priority.Saturation {
	// Pending first: a request dispatched meanwhile joins its endpoint's
	// in-flight count before it leaves pending, so it is counted once or
	// twice, never missed.
	var pending int64
	if v.state != nil {
		pending = max(0, v.state.pending.Load())
	}
	eps := v.Pool.Endpoints()
	loads := make([]priority.PodLoad, 0, len(eps))
	for _, ep := range eps {
		m := ep.Metrics()
		if !ep.Ready() || m == nil {
			continue
		}
		queue := m.Waiting + int(max(0, ep.InFlight()-int64(m.Waiting+m.Running)))
		loads = append(loads, priority.PodLoad{Queue: float64(queue), KVCache: min(1, max(0, m.KVCacheUsage)), Age: now.Sub(m.ScrapedAt)})
	}
	s := th.Pool(loads)
	if v.state != nil && s.Known() {
		s.Value += float64(pending) * s.PerRequest
	}
	return s
}

// Gate returns the pool's admission Gate (nil for an unknown pool), for
// tests and for callers that drive admission themselves.
func (g *Gateway) Gate(pool string) *priority.Gate {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ps := g.pools[pool]; ps != nil {
		return ps.gate
	}
	return nil
}
