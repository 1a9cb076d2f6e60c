package priority

import (
	"context"
	"testing"

	"github.com/meridian-router/meridian/config"
)

func benchGate(b testing.TB) *Gate {
	m, _ := newMetrics(b)
	tn := tenantsOf(b, m, map[string]config.TenantSpec{"team-a": {MaxBand: config.BandCritical, Weight: 2}})
	return &Gate{Pool: "llama", Metrics: m, Tenants: tn}
}

// BenchmarkAdmit measures the admission decision on a pool with headroom
// (admit at once, then Done), for the Gate and the GIE baseline.
func BenchmarkAdmit(b *testing.B) {
	ctx := context.Background()
	req := Request{Tenant: "team-a", Band: Standard, Bytes: 4096}
	admit := func(b *testing.B, g Admitter) {
		g.Observe(Saturation{Value: 0.2, PerRequest: 1e-9, Fresh: 8})
		b.ReportAllocs()
		for b.Loop() {
			tk, err := g.Admit(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			tk.Done()
		}
	}
	b.Run("gate", func(b *testing.B) { admit(b, benchGate(b)) })
	b.Run("gie", func(b *testing.B) {
		m, _ := newMetrics(b)
		admit(b, &GIEGate{Pool: "llama", Metrics: m})
	})
}

// BenchmarkAdmitParallel is BenchmarkAdmit/gate from every P at once: the
// cost of the Gate's one lock under contention.
func BenchmarkAdmitParallel(b *testing.B) {
	ctx := context.Background()
	g := benchGate(b)
	g.Observe(Saturation{Value: 0.2, PerRequest: 1e-9, Fresh: 8})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := Request{Tenant: "team-a", Band: Standard, Bytes: 4096}
		for pb.Next() {
			tk, err := g.Admit(ctx, req)
			if err != nil {
				b.Error(err)
				return
			}
			tk.Done()
		}
	})
}

// BenchmarkShedSheddable measures the reject path of a Sheddable request at
// a saturated pool: the whole time to a 429 decision.
func BenchmarkShedSheddable(b *testing.B) {
	ctx := context.Background()
	req := Request{Tenant: "team-a", Band: Sheddable, Bytes: 4096}
	b.Run("gate", func(b *testing.B) {
		g := benchGate(b)
		g.Observe(Saturation{Value: 1.3, PerRequest: 0.025, Fresh: 8})
		b.ReportAllocs()
		for b.Loop() {
			if _, err := g.Admit(ctx, req); err == nil {
				b.Fatal("admitted")
			}
		}
	})
	b.Run("gie", func(b *testing.B) {
		m, _ := newMetrics(b)
		g := &GIEGate{Pool: "llama", Metrics: m}
		g.Observe(Saturation{Value: 1.3, PerRequest: 0.025, Fresh: 8})
		b.ReportAllocs()
		for b.Loop() {
			if _, err := g.Admit(ctx, req); err == nil {
				b.Fatal("admitted")
			}
		}
	})
}

// BenchmarkQueuedRelease measures a saturated pool working as a
// concurrency limiter: each iteration queues a request behind 100 others
// from 10 tenants, and one finished request releases the fairest waiter.
func BenchmarkQueuedRelease(b *testing.B) {
	g := benchGate(b)
	g.Observe(slots(1))
	tenants := []string{"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9"}
	var held []*Ticket
	keep := func(t *Ticket, err error) {
		if err == nil {
			held = append(held, t)
		}
	}
	g.Submit(Request{Tenant: "team-a", Band: Standard}, keep)
	for i := 0; i < 100; i++ {
		g.Submit(Request{Tenant: tenants[i%10], Band: Standard}, keep)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		g.Submit(Request{Tenant: tenants[i%10], Band: Standard, Bytes: 4096}, keep)
		t := held[len(held)-1]
		held = held[:0]
		t.Done()
		i++
	}
	if g.Len() != 100 {
		b.Fatalf("queue drifted to %d", g.Len())
	}
}

// The Sheddable reject path is the one that must stay cheap under
// overload: pin it at zero allocations.
func TestShedAllocationFree(t *testing.T) {
	g := benchGate(t)
	g.Observe(Saturation{Value: 1.3, PerRequest: 0.025, Fresh: 8})
	req := Request{Tenant: "team-a", Band: Sheddable}
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { g.Admit(ctx, req) }); n != 0 {
		t.Fatalf("Sheddable reject allocates %.1f times; want 0", n)
	}
}

// countingReleaser counts the outcomes SubmitTo delivers to it.
type countingReleaser struct{ n int }

func (c *countingReleaser) Release(t *Ticket, err error) {
	c.n++
	if t != nil {
		t.Done()
	}
}

// SubmitTo on a pool with headroom delivers its outcome once and allocates
// only the Ticket: no closure for the delivery, no cancel function.
func TestSubmitToDecidedAtOnceAllocatesTheTicket(t *testing.T) {
	g := benchGate(t)
	g.Observe(Saturation{Value: 0.2, PerRequest: 1e-9, Fresh: 8})
	req := Request{Tenant: "team-a", Band: Standard, Bytes: 4096}
	rel := &countingReleaser{}
	n := testing.AllocsPerRun(1000, func() {
		if cancel := g.SubmitTo(req, rel); cancel() {
			t.Fatal("cancel of a decided request removed something")
		}
	})
	if rel.n != 1001 {
		t.Fatalf("%d outcomes delivered for 1001 submissions", rel.n)
	}
	if n != 1 {
		t.Fatalf("SubmitTo decided at once allocates %.1f times; want 1 (the Ticket)", n)
	}
}
