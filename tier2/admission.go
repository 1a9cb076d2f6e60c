package tier2

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/regions"
)

// Admission is Tier-2's global admission by priority band: one
// priority.Gate per target model, fed with the saturation of the model's
// pools in this Region (from pool-health digests). When the local pools are
// saturated and another Region has headroom, Critical and Standard requests
// are told to spill there instead of queueing.
type Admission struct {
	Region     string
	Fleet      *regions.Fleet
	Thresholds priority.Thresholds
	// Config applies to every Gate (queue bounds, maximum waits).
	Config  priority.Config
	Metrics *priority.Metrics
	// Tenants gives fair-queueing weights; set by the router on reload.
	Tenants func() *priority.Tenants

	mu    sync.Mutex
	gates map[string]*priority.Gate
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
		g.SetConfig(a.Config)
		g.Observe(a.saturation(model, a.Region, true))
		a.gates[model] = g
	}
	return g
}

// Admit admits r for model. spill reports that the local pools are
// saturated and another Region has headroom: the caller should prefer it.
func (a *Admission) Admit(ctx context.Context, model string, r priority.Request) (t *priority.Ticket, spill bool, err error) {
	g := a.gate(model)
	if r.Band != priority.Sheddable && a.saturation(model, a.Region, true).Saturated() && a.otherRegionHasHeadroom(model) {
		r.MaySpill = true
	}
	t, err = g.Admit(ctx, r)
	if errors.Is(err, priority.ErrSpill) {
		return &priority.Ticket{Band: r.Band}, true, nil
	}
	return t, false, err
}

// saturation combines the digests of model's pools: in region when local,
// elsewhere when not (to find headroom for a spill).
func (a *Admission) saturation(model, region string, local bool) priority.Saturation {
	th := a.Thresholds
	if th.Queue <= 0 {
		th = priority.DefaultThresholds()
	}
	now := time.Now()
	var pools []priority.Saturation
	for _, d := range a.Fleet.Digests().Digests() {
		if (d.Region == region) != local || !servesModel(d, model) {
			continue
		}
		s := digestSaturation(d, th)
		pools = append(pools, th.Digest(s, now.Sub(d.Produced)))
	}
	return priority.Combine(pools...)
}

// otherRegionHasHeadroom reports whether some other Region's pools of the
// model are not saturated.
func (a *Admission) otherRegionHasHeadroom(model string) bool {
	s := a.saturation(model, a.Region, false)
	return s.Known() && !s.Saturated()
}

func servesModel(d regions.Digest, model string) bool {
	if d.Model == model {
		return true
	}
	for _, ad := range d.Adapters {
		if ad == model {
			return true
		}
	}
	return false
}

// digestSaturation approximates a pool's saturation from its digest: the
// mean queue per ready pod against the queue threshold, or the mean KV use
// against the KV threshold, whichever is fuller.
func digestSaturation(d regions.Digest, th priority.Thresholds) priority.Saturation {
	if d.ReadyPods <= 0 {
		return priority.Saturation{Stale: d.TotalPods}
	}
	q := float64(d.QueueTotal) / float64(d.ReadyPods) / th.Queue
	kv := d.KVMean / th.KVCache
	return priority.Saturation{Value: max(q, kv), PerRequest: 1 / (float64(d.ReadyPods) * th.Queue), Fresh: d.ReadyPods}
}

// Run refreshes every gate's saturation until ctx ends.
func (a *Admission) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = 200 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		gates := make(map[string]*priority.Gate, len(a.gates))
		for m, g := range a.gates {
			gates[m] = g
		}
		a.mu.Unlock()
		for m, g := range gates {
			g.Observe(a.saturation(m, a.Region, true))
		}
	}
}
