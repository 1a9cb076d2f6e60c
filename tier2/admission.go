package tier2

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/loop"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/regions"
)

// Admission is Tier-2's global admission by priority band: one
// priority.Gate per target model, fed with the saturation of the model's
// pools in this Region as their Tier-1s computed it (the digests'
// Saturation, combined over clusters by fresh pods). When the local pools
// are saturated and another Region has headroom, Critical and Standard
// requests are told to spill there instead of queueing.
type Admission struct {
	Region string
	Fleet  *regions.Fleet
	// Thresholds: StaleAfter is the digest age beyond which a cluster's
	// saturation is not believed (zero: 2 s, four 500 ms digest periods);
	// Queue sets the capacity one fresh pod adds (zero: 5 requests), used
	// to account for requests admitted between two digests.
	Thresholds priority.Thresholds
	// Config applies to every Gate (queue bounds, maximum waits).
	Config priority.Config
	// ClusterQueueTime is the work Tier-2 leaves waiting in each
	// cluster's own Gate (zero: DefaultClusterQueueTime; negative: none).
	ClusterQueueTime time.Duration
	Metrics          *priority.Metrics
	// Tenants gives fair-queueing weights; set by the router on reload.
	Tenants func() *priority.Tenants

	// set is Config and Thresholds with the Topology's
	// spec.routing.admission laid over them (Configure); nil until then.
	set atomic.Pointer[admissionSettings]

	mu       sync.Mutex
	gates    map[string]*priority.Gate
	seen     map[string]uint64 // by model: digests last observed (see observeLocked)
	claims   *priority.Tenants // counts downgrades (see Band)
	claimsOf *config.Snapshot
}

type admissionSettings struct {
	gate      priority.Config
	th        priority.Thresholds
	queueTime time.Duration // ClusterQueueTime in force; 0: none
}

// DefaultClusterQueueTime is how much work Tier-2 leaves waiting in each
// cluster's own Gate, unless the configuration says otherwise: what that
// Gate lets into its pool in half a second (its AdmitRate), and at least
// MinClusterBacklog requests per pod.
//
// Past the limits, holding a request at Tier-2 buys the choice of
// cluster at release; leaving it in a cluster's Gate buys a release timed
// on 50 ms metrics, where Tier-2's digests are up to a digest period
// (500 ms) older. Within about one digest period Tier-2 knows no better
// than the cluster, so that much is the cluster's. With none, Tier-2's
// Gate and Tier-1's held Standard requests at the same saturation and
// Tier-2's decided alone: in bench/latency at 200 B (pods answering in
// milliseconds, every request held once) Tier-2 reached 0.91–0.93×
// nginx's throughput with a TTFB p99 above nginx's, against 0.98× and
// within 1–3 ms of it when the clusters' Gates held the wait
// (docs/BENCHMARKS.md, eleventh session).
const DefaultClusterQueueTime = 500 * time.Millisecond

// MinClusterBacklog is the waiting requests per pod Tier-2 leaves to a
// cluster's Gate whatever its admission rate (while ClusterQueueTime is
// not zero): a Gate that has admitted nothing yet gets a queue to measure.
const MinClusterBacklog = 2

// settings are the Gate configuration and thresholds in force.
func (a *Admission) settings() admissionSettings {
	if s := a.set.Load(); s != nil {
		return *s
	}
	return admissionSettings{a.Config, a.Thresholds, queueTime(a.ClusterQueueTime)}
}

// queueTime is d with zero meaning DefaultClusterQueueTime and negative
// none.
func queueTime(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return DefaultClusterQueueTime
	case d < 0:
		return 0
	}
	return d
}

// Configure applies the configuration's admission settings (the
// Topology's spec.routing.admission; nil means none) over Config and
// Thresholds, live: every Gate takes the new bounds and waits for the
// requests that arrive from now on.
func (a *Admission) Configure(c *config.Admission) {
	gc, th := priority.Overlay(a.Config, a.Thresholds, c)
	qt := queueTime(a.ClusterQueueTime)
	if c != nil && c.ClusterQueueTime != nil {
		qt = max(0, c.ClusterQueueTime.D())
	}
	old := a.settings()
	a.set.Store(&admissionSettings{gc, th, qt})
	a.mu.Lock()
	defer a.mu.Unlock()
	for m, g := range a.gates {
		g.SetConfig(gc)
		if old.th != th || old.queueTime != qt {
			// The same digests mean another saturation now.
			delete(a.seen, m)
			a.observeLocked(m, g)
		}
	}
}

// Band returns the band a tenant's request gets under snap's tenant
// policies: its claim lowered to the tenant's maxBand, the downgrade
// counted in meridian_priority_downgrades_total.
func (a *Admission) Band(snap *config.Snapshot, tenant string, claimed priority.Band) priority.Band {
	a.mu.Lock()
	if a.claimsOf != snap {
		if a.claims == nil {
			a.claims, _ = priority.NewTenants(nil, a.Metrics)
		}
		if err := a.claims.Update(snap.Tenants); err == nil {
			a.claimsOf = snap
		}
	}
	t := a.claims
	a.mu.Unlock()
	return t.Band(tenant, claimed)
}

func (a *Admission) gate(model string) *priority.Gate {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gates == nil {
		a.gates = map[string]*priority.Gate{}
	}
	g := a.gates[model]
	if g == nil {
		g = &priority.Gate{Pool: model, Metrics: a.Metrics}
		if a.Tenants != nil {
			g.Tenants = a.Tenants()
		}
		g.SetConfig(a.settings().gate)
		a.gates[model] = g
		a.observeLocked(model, g)
	}
	return g
}

// Admit admits r for model. spill reports that the local pools are
// saturated and another Region has headroom: the caller should prefer it.
//
// A Critical request is never queued or refused here while some eligible
// cluster has headroom: when the home Region's pools are saturated taken
// together but one of its clusters is not, it is admitted at once and
// cluster choice (which ranks by load) sends it there.
func (a *Admission) Admit(ctx context.Context, model string, r priority.Request) (t *priority.Ticket, spill bool, err error) {
	g, r, at := a.pre(model, r)
	if at != nil {
		return at, false, nil
	}
	t, err = g.Admit(ctx, r)
	return spilled(r, t, err)
}

// Submit is Admit without blocking (priority.Gate.Submit): release is
// called once with the outcome, from Submit itself when it is immediate
// or later from another goroutine; cancel removes a request still waiting
// and reports whether it did (release is then not called).
func (a *Admission) Submit(model string, r priority.Request, release func(t *priority.Ticket, spill bool, err error)) (cancel func() bool) {
	g, r, at := a.pre(model, r)
	if at != nil {
		release(at, false, nil)
		return func() bool { return false }
	}
	return g.Submit(r, func(t *priority.Ticket, err error) { release(spilled(r, t, err)) })
}

// SubmitTo is Submit for a caller that keeps its request's state in rel:
// rel gets the Gate's outcome, and spilled(r, t, err) turns it into
// Submit's. A request decided at once allocates nothing for its delivery.
func (a *Admission) SubmitTo(model string, r priority.Request, rel priority.Releaser) (cancel func() bool) {
	g, r, at := a.pre(model, r)
	if at != nil {
		rel.Release(at, nil)
		return func() bool { return false }
	}
	return g.SubmitTo(r, rel)
}

// pre is what Admit decides before model's Gate: a ticket for a Critical
// request a local cluster has headroom for, or r as the Gate sees it.
func (a *Admission) pre(model string, r priority.Request) (*priority.Gate, priority.Request, *priority.Ticket) {
	g := a.gate(model)
	if r.Band != priority.Sheddable {
		// Spilling is decided on the limits themselves: a Region with
		// headroom beats a wait in one of this Region's cluster Gates.
		gc := a.settings().gate
		if local := a.saturation(model, a.Region, true); local.Known() && local.Value >= gc.Limit(r.Band, local.WithoutBacklog()) {
			switch {
			case a.otherRegionHasHeadroom(model, gc, r.Band):
				// The Gate admits r if the home Region still has room
				// for it after all, and tells it to spill otherwise.
				r.MaySpill = true
			case r.Band == priority.Critical && a.localClusterHasHeadroom(model):
				return g, r, &priority.Ticket{Band: r.Band}
			}
		}
	}
	return g, r, nil
}

// spilled turns the Gate's ErrSpill into a ticket that prefers another
// Region.
func spilled(r priority.Request, t *priority.Ticket, err error) (*priority.Ticket, bool, error) {
	if errors.Is(err, priority.ErrSpill) {
		return &priority.Ticket{Band: r.Band}, true, nil
	}
	return t, false, err
}

// saturation combines the digests of model's pools: in region when local,
// elsewhere when not (to find headroom for a spill).
func (a *Admission) saturation(model, region string, local bool) priority.Saturation {
	s, _ := a.saturationVersion(model, region, local)
	return s
}

// saturationVersion is saturation plus a value that changes whenever a
// digest it was computed from is replaced or goes stale.
func (a *Admission) saturationVersion(model, region string, local bool) (priority.Saturation, uint64) {
	set := a.settings()
	th := set.th.WithDefaults()
	now := time.Now()
	var buf [8]priority.Saturation
	pools := buf[:0]
	var version uint64
	a.Fleet.EachDigest(model, func(d *regions.Digest) {
		if (d.Region == region) != local {
			return
		}
		s := th.Digest(digestSaturation(d, th, set.queueTime), now.Sub(d.Produced))
		version = version*31 + uint64(d.Produced.UnixNano()) + d.Version
		if !s.Known() {
			version++
		}
		pools = append(pools, s)
	})
	return priority.Combine(pools...), version
}

func (a *Admission) thresholds() priority.Thresholds {
	return a.settings().th.WithDefaults()
}

// observeLocked hands model's local saturation to its Gate when a digest
// it depends on changed since the last time. Observing an unchanged digest
// again would reset the Gate's count of requests admitted since that
// digest was produced, and let a burst through on old numbers.
func (a *Admission) observeLocked(model string, g *priority.Gate) {
	s, v := a.saturationVersion(model, a.Region, true)
	if a.seen == nil {
		a.seen = map[string]uint64{}
	}
	if last, ok := a.seen[model]; ok && last == v {
		return
	}
	a.seen[model] = v
	g.Observe(s)
}

// otherRegionHasHeadroom reports whether the other Regions' pools of the
// model, taken together, have headroom for band b under gc.
func (a *Admission) otherRegionHasHeadroom(model string, gc priority.Config, b priority.Band) bool {
	s := a.saturation(model, a.Region, false)
	return s.Known() && s.Value < gc.Limit(b, s.WithoutBacklog())
}

// localClusterHasHeadroom reports whether one of this Region's clusters
// serving model is, on its own, not saturated.
func (a *Admission) localClusterHasHeadroom(model string) bool {
	th := a.thresholds()
	now := time.Now()
	headroom := false
	a.Fleet.EachDigest(model, func(d *regions.Digest) {
		if d.Region != a.Region || headroom {
			return
		}
		if s := th.Digest(digestSaturation(d, th, 0), now.Sub(d.Produced)); s.Known() && !s.Saturated() {
			headroom = true
		}
	})
	return headroom
}

// digestSaturation is a pool's saturation from its digest: what its Tier-1
// computed from live pod metrics when the digest carries it (FreshPods >
// 0). A digest without it (a Tier-1 that predates the field, or a pool
// with no fresh pod) is approximated from the pool's mean queue per ready
// pod against the queue threshold, or its mean KV use against the KV
// threshold, whichever is fuller. Either way the requests waiting in
// Tier-1's Gate count as waiting on the pods: they hold no pod yet, but
// are the cluster's to serve before anything Tier-2 sends now. Its
// Backlog is what the cluster's Gate lets in over queueTime, and at least
// MinClusterBacklog per pod (none when queueTime is zero), but never more
// than half of what that Gate holds waiting (its maxQueued; 1000, the
// default, when the digest does not say): past its bound it would refuse
// what Tier-2 could have queued.
func digestSaturation(d *regions.Digest, th priority.Thresholds, queueTime time.Duration) priority.Saturation {
	var s priority.Saturation
	switch {
	case d.FreshPods > 0:
		s = priority.Saturation{Value: d.Saturation, PerRequest: 1 / (float64(d.FreshPods) * th.Queue),
			Fresh: d.FreshPods, Stale: d.StalePods}
	case d.ReadyPods > 0:
		s = priority.Saturation{PerRequest: 1 / (float64(d.ReadyPods) * th.Queue), Fresh: d.ReadyPods}
		s.Value = max(float64(d.QueueTotal)/float64(d.ReadyPods)/th.Queue, d.KVMean/th.KVCache)
	default:
		return priority.Saturation{Stale: d.TotalPods}
	}
	s.Value += float64(d.GateWaiting) * s.PerRequest
	if queueTime > 0 {
		bound := d.GateMaxQueued
		if bound <= 0 {
			bound = priority.DefaultConfig().MaxQueued
		}
		n := max(MinClusterBacklog*float64(s.Fresh), d.AdmitRate*queueTime.Seconds())
		s.Backlog = min(n, float64(bound)/2) * s.PerRequest
	}
	return s
}

// Run hands every gate its saturation whenever a digest changed, checking
// every interval (zero: 200 ms), until ctx ends.
func (a *Admission) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = 200 * time.Millisecond
	}
	loop.Every(ctx, every, func() {
		a.mu.Lock()
		for m, g := range a.gates {
			a.observeLocked(m, g)
		}
		a.mu.Unlock()
	})
}
