package priority

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// GIEGate reproduces the Gateway API Inference Extension's admission, as a
// baseline for benchmarks: when the pool's saturation (GIEThresholds) is 1
// or more, or unknown, requests of negative priority (Sheddable) are
// rejected; everything else is admitted at once, with no queue, no order
// between bands beyond that, and no fairness between tenants. It keeps no
// count of what it admitted between observations.
type GIEGate struct {
	// Pool names the pool in metrics.
	Pool string
	// Metrics records decisions like a Gate's. Nil records nothing.
	Metrics *Metrics
	// RetryAfter is the delay sent with a rejection. Zero means 1s.
	RetryAfter time.Duration

	once sync.Once
	m    *poolMetrics
	mu   sync.Mutex
	obs  Saturation
	seen bool
}

// Observe records the pool's saturation.
func (g *GIEGate) Observe(s Saturation) {
	g.init()
	g.mu.Lock()
	g.obs, g.seen = s, true
	g.mu.Unlock()
	g.m.observe(s)
}

func (g *GIEGate) init() { g.once.Do(func() { g.m = g.Metrics.pool(g.Pool) }) }

// Admit admits r at once unless it is Sheddable and the pool is saturated.
// It never waits; the Ticket's Done is a no-op.
func (g *GIEGate) Admit(ctx context.Context, r Request) (*Ticket, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !r.Band.valid() {
		return nil, fmt.Errorf("priority: invalid band %d", r.Band)
	}
	g.init()
	g.mu.Lock()
	saturated := !g.seen || !g.obs.Known() || g.obs.Value >= 1
	g.mu.Unlock()
	if r.Band == Sheddable && saturated {
		g.m.rejected(r.Band, ReasonSaturated)
		ra := g.RetryAfter
		if ra <= 0 {
			ra = time.Second
		}
		return nil, &Rejection{Band: r.Band, Reason: ReasonSaturated, RetryAfter: ra}
	}
	g.m.admitted(r.Band, UnknownTenant, 0)
	return &Ticket{Band: r.Band}, nil
}
