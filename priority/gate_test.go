package priority

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
)

// slots is a saturation with room for exactly n requests when nothing is in
// flight: each admitted request raises the estimate by 1/n.
func slots(n int) Saturation {
	return Saturation{Value: 0, PerRequest: 1 / float64(n), Fresh: 1}
}

// full is a saturated pool where each finished request frees one slot.
var full = Saturation{Value: 1, PerRequest: 1, Fresh: 1}

func newMetrics(t testing.TB) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func tenantsOf(t testing.TB, m *Metrics, specs map[string]config.TenantSpec) *Tenants {
	t.Helper()
	ts := map[string]*config.Tenant{}
	for name, s := range specs {
		ts[name] = &config.Tenant{Kind: config.KindTenant, Metadata: config.Metadata{Name: name}, Spec: s}
	}
	tn, err := NewTenants(ts, m)
	if err != nil {
		t.Fatal(err)
	}
	return tn
}

// outcome records what Submit released.
type outcome struct {
	mu  sync.Mutex
	got map[string]error // name → nil (admitted) or the error
	seq []string         // admission order
	tk  map[string]*Ticket
}

func newOutcome() *outcome {
	return &outcome{got: map[string]error{}, tk: map[string]*Ticket{}}
}

func (o *outcome) submit(g *Gate, name string, r Request) func() bool {
	return g.Submit(r, func(t *Ticket, err error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.got[name] = err
		if err == nil {
			o.seq = append(o.seq, name)
			o.tk[name] = t
		}
	})
}

func (o *outcome) result(name string) (error, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	err, ok := o.got[name]
	return err, ok
}

func (o *outcome) reason(t *testing.T, name string) Reason {
	t.Helper()
	err, ok := o.result(name)
	var rej *Rejection
	if !ok || !errors.As(err, &rej) {
		t.Fatalf("%s: got (%v, released=%v); want a Rejection", name, err, ok)
	}
	return rej.Reason
}

func TestStrictBandOrder(t *testing.T) {
	g := &Gate{}
	g.Observe(slots(1))
	o := newOutcome()
	o.submit(g, "hold", Request{Tenant: "x", Band: Standard})
	o.submit(g, "std-1", Request{Tenant: "a", Band: Standard})
	o.submit(g, "std-2", Request{Tenant: "b", Band: Standard})
	o.submit(g, "crit-1", Request{Tenant: "a", Band: Critical})
	o.submit(g, "shed", Request{Tenant: "c", Band: Sheddable})
	o.submit(g, "crit-2", Request{Tenant: "c", Band: Critical})
	if r := o.reason(t, "shed"); r != ReasonSaturated {
		t.Fatalf("Sheddable at a saturated pool: reason %s; want saturated", r)
	}
	for i := 0; i < 5; i++ {
		o.tk[o.seq[len(o.seq)-1]].Done()
	}
	want := []string{"hold", "crit-1", "crit-2", "std-1", "std-2"}
	if fmt.Sprint(o.seq) != fmt.Sprint(want) {
		t.Fatalf("admission order %v; want %v", o.seq, want)
	}
	if g.Len() != 0 {
		t.Fatalf("%d still queued", g.Len())
	}
}

func TestSheddableRejectedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &Gate{}
		g.SetConfig(Config{RetryAfter: 3 * time.Second})
		g.Observe(Saturation{Value: 1.4, PerRequest: 0.1, Fresh: 4})
		start := time.Now()
		_, err := g.Admit(context.Background(), Request{Tenant: "batch", Band: Sheddable})
		var rej *Rejection
		if !errors.As(err, &rej) || !errors.Is(err, ErrShed) {
			t.Fatalf("err = %v; want a Rejection matching ErrShed", err)
		}
		if rej.Reason != ReasonSaturated || rej.RetryAfter != 3*time.Second || rej.Band != Sheddable {
			t.Fatalf("rejection %+v", rej)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("Sheddable rejection took %s of virtual time; want 0", waited)
		}
		// With headroom (below 1 − the default 0.65 reserve) it is served.
		g.Observe(Saturation{Value: 0.3, PerRequest: 0.1, Fresh: 4})
		if tk, err := g.Admit(context.Background(), Request{Tenant: "batch", Band: Sheddable}); err != nil {
			t.Fatalf("Sheddable with headroom: %v", err)
		} else {
			tk.Done()
		}
	})
}

func TestBlindPool(t *testing.T) {
	for _, tc := range []struct {
		name string
		obs  *Saturation
	}{
		{"never observed", nil},
		{"all pods stale", &Saturation{Stale: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &Gate{}
			if tc.obs != nil {
				g.Observe(*tc.obs)
			}
			o := newOutcome()
			for i := 0; i < 50; i++ {
				o.submit(g, fmt.Sprint("std-", i), Request{Tenant: "a", Band: Standard})
			}
			o.submit(g, "shed", Request{Tenant: "a", Band: Sheddable})
			if len(o.seq) != 50 || g.Len() != 0 {
				t.Fatalf("blind pool admitted %d of 50 Standard, queued %d; want all admitted", len(o.seq), g.Len())
			}
			if r := o.reason(t, "shed"); r != ReasonNoMetrics {
				t.Fatalf("Sheddable at a blind pool: %s; want no_metrics", r)
			}
		})
	}
}

func TestLateBinding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &Gate{}
		g.SetConfig(Config{CriticalReserve: -1}) // Standard may fill the pool
		g.Observe(Saturation{Value: 1.2, PerRequest: 0.25, Fresh: 1})
		var (
			mu     sync.Mutex
			best   = "pod-a" // what a scheduler would pick right now
			picked []string
		)
		var wg sync.WaitGroup
		for i := 0; i < 3; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk, err := g.Admit(context.Background(), Request{Tenant: "a", Band: Standard})
				if err != nil {
					t.Errorf("Admit: %v", err)
					return
				}
				mu.Lock()
				picked = append(picked, best) // the pod is chosen only now
				mu.Unlock()
				_ = tk
			}()
		}
		synctest.Wait()
		if g.Len() != 3 || len(picked) != 0 {
			t.Fatalf("saturated: %d queued, %d picked; want 3 queued", g.Len(), len(picked))
		}
		mu.Lock()
		best = "pod-b" // a pod freed up while they waited
		mu.Unlock()
		// 0.5 + 2×0.25 reaches 1: exactly two are let in.
		g.Observe(Saturation{Value: 0.5, PerRequest: 0.25, Fresh: 1})
		synctest.Wait()
		if len(picked) != 2 || picked[0] != "pod-b" || picked[1] != "pod-b" {
			t.Fatalf("after headroom for two: picked %v; want [pod-b pod-b]", picked)
		}
		g.Observe(Saturation{Value: 0, PerRequest: 0.25, Fresh: 1})
		wg.Wait()
	})
}

func TestTicketDoneFreesSlot(t *testing.T) {
	g := &Gate{}
	// Standard is admitted below 1 − 0.45: two of the two slots' worth.
	g.SetConfig(Config{CriticalReserve: 0.45})
	g.Observe(slots(2))
	o := newOutcome()
	for i := 0; i < 4; i++ {
		o.submit(g, fmt.Sprint(i), Request{Tenant: "a", Band: Standard})
	}
	if len(o.seq) != 2 || g.Len() != 2 {
		t.Fatalf("admitted %d, queued %d; want 2 and 2", len(o.seq), g.Len())
	}
	o.tk["0"].Done()
	o.tk["0"].Done() // idempotent: frees one slot, not two
	if len(o.seq) != 3 || g.Len() != 1 {
		t.Fatalf("after one Done (twice): admitted %d, queued %d; want 3 and 1", len(o.seq), g.Len())
	}
	// A new observation replaces the estimate: the pool says it is full.
	g.Observe(Saturation{Value: 1, PerRequest: 0.5, Fresh: 1})
	o.tk["1"].Done()
	if len(o.seq) != 4 || g.Len() != 0 {
		t.Fatalf("a Done lowering the estimate to 0.5 should let the last one in; admitted %d, queued %d", len(o.seq), g.Len())
	}
}

// TestObserveSinceKeepsUnseenAdmissions: an observation computed while
// admitted requests were not yet visible to it (Tier-1: between Admit and
// being counted as pending) must not forget them. Observe resets the
// Gate's count of admitted requests, and let two more in than the pool has
// room for here; ObserveSince keeps counting those not Seen by the mark.
func TestObserveSinceKeepsUnseenAdmissions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		since bool
		want  int // admitted of 6, with room for 4
	}{{"Observe forgets them", false, 6}, {"ObserveSince keeps them", true, 4}} {
		t.Run(tc.name, func(t *testing.T) {
			g := &Gate{}
			g.Observe(slots(4))
			o := newOutcome()
			mark := g.Mark()
			o.submit(g, "a", Request{Tenant: "t", Band: Critical})
			o.submit(g, "b", Request{Tenant: "t", Band: Critical})
			// The observer computed slots(4) before a and b were counted
			// anywhere it looks.
			if tc.since {
				g.ObserveSince(slots(4), mark)
			} else {
				g.Observe(slots(4))
			}
			for _, n := range []string{"c", "d", "e", "f"} {
				o.submit(g, n, Request{Tenant: "t", Band: Critical})
			}
			if len(o.seq) != tc.want {
				t.Fatalf("admitted %v, want %d", o.seq, tc.want)
			}
			if !tc.since {
				return
			}
			// a and b are now counted by the observer (Seen); c and d are
			// not yet: an observation that includes a and b only still
			// counts c and d, so the pool stays full.
			o.tk["a"].Seen()
			o.tk["b"].Seen()
			o.tk["b"].Seen() // idempotent
			mark = g.Mark()
			g.ObserveSince(Saturation{Value: 0.5, PerRequest: 0.25, Fresh: 1}, mark)
			if len(o.seq) != 4 || g.Len() != 2 {
				t.Fatalf("after a and b were seen: admitted %v, %d queued; want 4 and 2", o.seq, g.Len())
			}
			// A ticket done before it was seen counts as seen: c finishing
			// frees its slot, and the next observation does not count it.
			o.tk["c"].Done()
			if len(o.seq) != 5 {
				t.Fatalf("after c finished: admitted %v, want e let in", o.seq)
			}
			o.tk["d"].Seen()
			o.tk["e"].Seen()
			mark = g.Mark()
			g.ObserveSince(Saturation{Value: 1, PerRequest: 0.25, Fresh: 1}, mark) // a, b, d, e
			if len(o.seq) != 5 || g.Len() != 1 {
				t.Fatalf("full again: admitted %v, %d queued; want 5 and 1", o.seq, g.Len())
			}
		})
	}
}

func TestTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &Gate{}
		g.SetConfig(Config{StandardMaxWait: 4 * time.Second, CriticalMaxWait: 9 * time.Second, RetryAfter: 2 * time.Second})
		g.Observe(full)
		var wg sync.WaitGroup
		for _, b := range []Band{Standard, Critical} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				_, err := g.Admit(context.Background(), Request{Tenant: "a", Band: b})
				var rej *Rejection
				if !errors.As(err, &rej) || rej.Reason != ReasonTimeout || rej.RetryAfter != 2*time.Second {
					t.Errorf("%s: err = %v; want a timeout rejection", b, err)
				}
				want := 4 * time.Second
				if b == Critical {
					want = 9 * time.Second
				}
				if waited := time.Since(start); waited != want {
					t.Errorf("%s waited %s; want %s", b, waited, want)
				}
			}()
		}
		wg.Wait()
		if g.Len() != 0 {
			t.Fatalf("%d left in the queue", g.Len())
		}
	})
}

func TestContextCancelRemovesWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, _ := newMetrics(t)
		g := &Gate{Pool: "p", Metrics: m, Tenants: tenantsOf(t, m, map[string]config.TenantSpec{"a": {}})}
		g.Observe(full)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := g.Admit(ctx, Request{Tenant: "a", Band: Standard, Bytes: 100})
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrShed) {
			t.Fatalf("err = %v; want the context's error, not a shed", err)
		}
		if g.Len() != 0 {
			t.Fatalf("cancelled waiter still queued")
		}
		if v := testkit.Value(t, m.queued.WithLabelValues("p", "Standard", "a")); v != 0 {
			t.Fatalf("queued gauge %v after cancel; want 0", v)
		}
		// The freed room is really free: the byte count went back too.
		g.SetConfig(Config{MaxQueuedBytes: 100})
		o := newOutcome()
		o.submit(g, "fits", Request{Tenant: "a", Band: Standard, Bytes: 100})
		if _, released := o.result("fits"); released || g.Len() != 1 {
			t.Fatalf("a 100-byte request did not queue in 100 bytes of room")
		}
		g.Observe(slots(1))
	})
}

func TestSpill(t *testing.T) {
	m, _ := newMetrics(t)
	g := &Gate{Pool: "p", Metrics: m}
	g.Observe(full)
	_, err := g.Admit(context.Background(), Request{Tenant: "a", Band: Critical, MaySpill: true})
	if !errors.Is(err, ErrSpill) || errors.Is(err, ErrShed) {
		t.Fatalf("err = %v; want ErrSpill", err)
	}
	if v := testkit.Value(t, m.spilled.WithLabelValues("p", "Critical")); v != 1 {
		t.Fatalf("spilled_total = %v; want 1", v)
	}
	// Without a Region to spill to, the same request waits here.
	o := newOutcome()
	o.submit(g, "crit", Request{Tenant: "a", Band: Critical})
	if _, released := o.result("crit"); released || g.Len() != 1 {
		t.Fatal("Critical without spill was not queued")
	}
	// With headroom, MaySpill changes nothing.
	g.Observe(slots(4))
	if tk, err := g.Admit(context.Background(), Request{Tenant: "b", Band: Critical, MaySpill: true}); err != nil {
		t.Fatalf("with headroom: %v", err)
	} else {
		tk.Done()
	}
}

func TestOverflowShedsLowestFirst(t *testing.T) {
	g := &Gate{}
	g.SetConfig(Config{MaxQueued: 3})
	g.Observe(full)
	o := newOutcome()
	for i := 1; i <= 3; i++ {
		o.submit(g, fmt.Sprint("heavy-", i), Request{Tenant: "heavy", Band: Standard})
	}
	// A light tenant's arrival pushes out the heavy tenant's latest.
	o.submit(g, "light-1", Request{Tenant: "light", Band: Standard})
	if r := o.reason(t, "heavy-3"); r != ReasonEvicted {
		t.Fatalf("heavy-3: %s; want evicted", r)
	}
	// The heavy tenant cannot push out someone ahead of it in fair order.
	o.submit(g, "heavy-4", Request{Tenant: "heavy", Band: Standard})
	if r := o.reason(t, "heavy-4"); r != ReasonQueueFull {
		t.Fatalf("heavy-4: %s; want queue_full", r)
	}
	// Critical arrivals evict Standard, latest fair tag first.
	o.submit(g, "crit-1", Request{Tenant: "c", Band: Critical})
	if r := o.reason(t, "heavy-2"); r != ReasonEvicted {
		t.Fatalf("heavy-2: %s; want evicted by crit-1", r)
	}
	o.submit(g, "crit-2", Request{Tenant: "c", Band: Critical})
	o.submit(g, "crit-3", Request{Tenant: "c", Band: Critical})
	for _, n := range []string{"heavy-1", "light-1"} {
		if r := o.reason(t, n); r != ReasonEvicted {
			t.Fatalf("%s: %s; want evicted", n, r)
		}
	}
	// Full of Critical: the next Critical from the same tenant is refused.
	o.submit(g, "crit-4", Request{Tenant: "c", Band: Critical})
	if r := o.reason(t, "crit-4"); r != ReasonQueueFull {
		t.Fatalf("crit-4: %s; want queue_full", r)
	}
	if g.Len() != 3 {
		t.Fatalf("queue holds %d; want 3", g.Len())
	}
}

func TestOverflowBytes(t *testing.T) {
	g := &Gate{}
	g.SetConfig(Config{MaxQueuedBytes: 1000})
	g.Observe(full)
	o := newOutcome()
	o.submit(g, "huge", Request{Tenant: "a", Band: Critical, Bytes: 1001})
	if r := o.reason(t, "huge"); r != ReasonQueueFull {
		t.Fatalf("huge: %s; want queue_full", r)
	}
	o.submit(g, "std-600", Request{Tenant: "a", Band: Standard, Bytes: 600})
	o.submit(g, "std-300", Request{Tenant: "b", Band: Standard, Bytes: 300})
	o.submit(g, "crit-500", Request{Tenant: "c", Band: Critical, Bytes: 500})
	// 600+300+500 > 1000: one Standard must go; the later tag is std-300's
	// (same tag as std-600 but later), which frees too little, so both go.
	for _, n := range []string{"std-600", "std-300"} {
		if r := o.reason(t, n); r != ReasonEvicted {
			t.Fatalf("%s: %s; want evicted", n, r)
		}
	}
	if _, released := o.result("crit-500"); released || g.Len() != 1 {
		t.Fatalf("crit-500 not queued alone (len %d)", g.Len())
	}
	// A Standard that does not fit and cannot evict a Critical is refused
	// without evicting anything.
	o.submit(g, "std-600b", Request{Tenant: "d", Band: Standard, Bytes: 600})
	if r := o.reason(t, "std-600b"); r != ReasonQueueFull {
		t.Fatalf("std-600b: %s; want queue_full", r)
	}
	if _, released := o.result("crit-500"); released {
		t.Fatal("a Standard arrival evicted a Critical waiter")
	}
}

func TestWeightedShares(t *testing.T) {
	m, _ := newMetrics(t)
	tn := tenantsOf(t, m, map[string]config.TenantSpec{"big": {Weight: 3}, "small": {}})
	g := &Gate{Tenants: tn}
	g.Observe(full)
	o := newOutcome()
	for i := 0; i < 40; i++ {
		o.submit(g, fmt.Sprint("big-", i), Request{Tenant: "big", Band: Standard})
		o.submit(g, fmt.Sprint("small-", i), Request{Tenant: "small", Band: Standard})
	}
	count := func() (big, small int) {
		for _, n := range o.seq {
			if n[0] == 'b' {
				big++
			} else {
				small++
			}
		}
		return
	}
	for i := 0; i < 40; i++ {
		g.done() // one slot frees
	}
	if big, small := count(); big != 30 || small != 10 {
		t.Fatalf("weights 3:1 served %d:%d of 40; want 30:10", big, small)
	}
	// Live weight change: equal weights from now on.
	if err := tn.Update(map[string]*config.Tenant{"big": {Metadata: config.Metadata{Name: "big"}}, "small": {Metadata: config.Metadata{Name: "small"}}}); err != nil {
		t.Fatal(err)
	}
	g2 := &Gate{Tenants: tn}
	g2.Observe(full)
	o = newOutcome()
	for i := 0; i < 20; i++ {
		o.submit(g2, fmt.Sprint("big-", i), Request{Tenant: "big", Band: Standard})
		o.submit(g2, fmt.Sprint("small-", i), Request{Tenant: "small", Band: Standard})
	}
	for i := 0; i < 20; i++ {
		g2.done()
	}
	if big, small := count(); big != 10 || small != 10 {
		t.Fatalf("after the weight change served %d:%d of 20; want 10:10", big, small)
	}
}

func TestLateArrivalNotStarved(t *testing.T) {
	g := &Gate{}
	g.Observe(full)
	o := newOutcome()
	for i := 0; i < 500; i++ {
		o.submit(g, fmt.Sprint("heavy-", i), Request{Tenant: "heavy", Band: Standard})
	}
	g.done()
	g.done()
	o.submit(g, "light", Request{Tenant: "light", Band: Standard})
	g.done()
	g.done()
	// The light tenant's one request goes out within two releases, not
	// after the heavy tenant's 498 others.
	if i := indexOf(o.seq, "light"); i < 0 || i > 3 {
		t.Fatalf("light admitted at position %d of %v", i, o.seq)
	}
}

func indexOf(s []string, x string) int {
	for i, v := range s {
		if v == x {
			return i
		}
	}
	return -1
}

func TestLiveConfigShrink(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &Gate{}
		g.Observe(full)
		o := newOutcome()
		for i := 0; i < 5; i++ {
			o.submit(g, fmt.Sprint("std-", i), Request{Tenant: fmt.Sprint("t", i), Band: Standard})
		}
		o.submit(g, "crit", Request{Tenant: "c", Band: Critical})
		g.SetConfig(Config{MaxQueued: 2})
		if g.Len() != 2 {
			t.Fatalf("after shrinking to 2: %d queued", g.Len())
		}
		if _, released := o.result("crit"); released {
			t.Fatal("shrinking evicted the Critical waiter before Standard ones")
		}
		evicted := 0
		for i := 0; i < 5; i++ {
			if err, ok := o.result(fmt.Sprint("std-", i)); ok && errors.Is(err, ErrShed) {
				evicted++
			}
		}
		if evicted != 4 {
			t.Fatalf("%d Standard evicted; want 4", evicted)
		}
		// A shorter wait applies to new arrivals, not to those already in.
		g.SetConfig(Config{MaxQueued: 10, StandardMaxWait: time.Second})
		o.submit(g, "new", Request{Tenant: "n", Band: Standard})
		time.Sleep(time.Second)
		synctest.Wait()
		if r := o.reason(t, "new"); r != ReasonTimeout {
			t.Fatalf("new: %s; want timeout after the new 1s wait", r)
		}
		if _, released := o.result("std-0"); released {
			t.Fatal("a waiter from before the change timed out on the new wait")
		}
		g.Observe(slots(10))
	})
}

func TestInvalidBand(t *testing.T) {
	g := &Gate{}
	if _, err := g.Admit(context.Background(), Request{Band: 7}); err == nil {
		t.Fatal("band 7 admitted")
	}
	if _, err := g.Admit(context.Background(), Request{Band: Standard, Bytes: -1}); err == nil {
		t.Fatal("negative size admitted")
	}
	if _, err := (&GIEGate{}).Admit(context.Background(), Request{Band: -2}); err == nil {
		t.Fatal("GIE gate admitted band -2")
	}
}

func TestMetrics(t *testing.T) {
	m, reg := newMetrics(t)
	tn := tenantsOf(t, m, map[string]config.TenantSpec{"team-a": {MaxBand: config.BandStandard}})
	g := &Gate{Pool: "llama", Metrics: m, Tenants: tn}
	withBacklog := full
	withBacklog.Backlog = 0.5
	g.Observe(withBacklog)
	if v := testkit.Value(t, m.backlog.WithLabelValues("llama")); v != 0.5 {
		t.Errorf("backlog = %v; want 0.5", v)
	}
	g.Observe(full)
	o := newOutcome()
	o.submit(g, "q1", Request{Tenant: "team-a", Band: tn.Band("team-a", Critical)})
	o.submit(g, "q2", Request{Tenant: "stranger", Band: Standard})
	o.submit(g, "s", Request{Tenant: "team-a", Band: Sheddable})
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"queued team-a", testkit.Value(t, m.queued.WithLabelValues("llama", "Standard", "team-a")), 1},
		{"queued other", testkit.Value(t, m.queued.WithLabelValues("llama", "Standard", UnknownTenant)), 1},
		{"shed", testkit.Value(t, m.shed.WithLabelValues("llama", "Sheddable", "saturated")), 1},
		{"downgrades", testkit.Value(t, m.downgrades.WithLabelValues("team-a", "Critical", "Standard")), 1},
		{"saturation", testkit.Value(t, m.saturation.WithLabelValues("llama")), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v; want %v", c.name, c.got, c.want)
		}
	}
	g.Observe(slots(10))
	if n := testkit.Series(m.wait); n != 2 {
		t.Errorf("wait histogram has %d series; want 2 (team-a and other)", n)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Error("registering twice succeeded")
	}
}

// manualClock is a virtual clock a discrete-event simulator would supply:
// time moves only when the test says, and due timers then run in order.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

type manualTimer struct {
	at      time.Time
	f       func()
	stopped bool
}

func (t *manualTimer) Stop() bool { was := !t.stopped; t.stopped = true; return was }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*manualTimer
	rest := c.timers[:0]
	for _, t := range c.timers {
		if !t.stopped && !t.at.After(c.now) {
			due = append(due, t)
		} else if !t.stopped {
			rest = append(rest, t)
		}
	}
	c.timers = rest
	c.mu.Unlock()
	for _, t := range due {
		t.stopped = true
		t.f()
	}
}

func TestInjectedClock(t *testing.T) {
	clk := &manualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	g := &Gate{Clock: clk}
	g.SetConfig(Config{StandardMaxWait: 5 * time.Second})
	g.Observe(full)
	o := newOutcome()
	o.submit(g, "served", Request{Tenant: "a", Band: Standard})
	o.submit(g, "expires", Request{Tenant: "b", Band: Standard})
	clk.advance(3 * time.Second)
	g.done()
	if tk := o.tk["served"]; tk == nil || tk.Waited != 3*time.Second {
		t.Fatalf("served ticket %+v; want Waited 3s on the injected clock", tk)
	}
	clk.advance(2*time.Second - time.Nanosecond)
	if _, released := o.result("expires"); released {
		t.Fatal("timed out before 5s")
	}
	clk.advance(time.Nanosecond)
	if r := o.reason(t, "expires"); r != ReasonTimeout {
		t.Fatalf("expires: %s; want timeout at 5s", r)
	}
	if len(clk.timers) != 0 {
		t.Fatalf("%d timers left pending; the served waiter's timer was not stopped", len(clk.timers))
	}
}

func TestCriticalReserve(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reserve  float64
		standard int // Standard admitted before the pool is full for them
	}{
		{"default 0.65", 0, 7},
		{"a quarter", 0.25, 15},
		{"none", -1, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &Gate{}
			g.SetConfig(Config{CriticalReserve: tc.reserve})
			g.Observe(Saturation{Value: 0, PerRequest: 0.05, Fresh: 4}) // 20 requests' worth
			o := newOutcome()
			for i := 0; i < 25; i++ {
				o.submit(g, fmt.Sprint("std-", i), Request{Tenant: "a", Band: Standard})
			}
			if len(o.seq) != tc.standard {
				t.Fatalf("Standard admitted %d; want %d", len(o.seq), tc.standard)
			}
			o.submit(g, "shed", Request{Tenant: "b", Band: Sheddable})
			if r := o.reason(t, "shed"); r != ReasonSaturated {
				t.Fatalf("Sheddable: %s", r)
			}
			// The reserve takes Critical requests at once, up to the full pool.
			for i := 0; i < 20-tc.standard; i++ {
				o.submit(g, fmt.Sprint("crit-", i), Request{Tenant: "c", Band: Critical})
			}
			if len(o.seq) != 20 {
				t.Fatalf("%d admitted after Critical arrivals; want the full 20", len(o.seq))
			}
			o.submit(g, "crit-wait", Request{Tenant: "c", Band: Critical})
			if _, released := o.result("crit-wait"); released {
				t.Fatal("Critical admitted beyond the full pool")
			}
			// A finished request goes to the waiting Critical, not Standard.
			o.tk["std-0"].Done()
			if o.seq[len(o.seq)-1] != "crit-wait" {
				t.Fatalf("after one Done admitted %s; want crit-wait", o.seq[len(o.seq)-1])
			}
			g.check(t)
		})
	}
}

// An observation's Backlog lets Critical and Standard requests past the
// limits by that much (the Gates behind hold them); Sheddable ones and
// those that may spill are judged on the limits themselves.
func TestBacklog(t *testing.T) {
	g := &Gate{}
	g.Observe(Saturation{Value: 0, PerRequest: 0.05, Fresh: 4, Backlog: 0.4}) // 20 requests' worth; the backlog adds 8
	o := newOutcome()
	for i := 0; i < 20; i++ {
		o.submit(g, fmt.Sprint("std-", i), Request{Tenant: "a", Band: Standard})
	}
	if len(o.seq) != 7+8 {
		t.Fatalf("Standard admitted %d; want 7 below the reserve and 8 of backlog", len(o.seq))
	}
	o.submit(g, "shed", Request{Tenant: "b", Band: Sheddable})
	if r := o.reason(t, "shed"); r != ReasonSaturated {
		t.Fatalf("Sheddable past the limit, within the backlog: %s", r)
	}
	if _, err := g.Admit(context.Background(), Request{Tenant: "c", Band: Standard, MaySpill: true}); !errors.Is(err, ErrSpill) {
		t.Fatalf("Standard that may spill at 0.75: %v; want ErrSpill (0.35 is its limit without backlog)", err)
	}
	for i := 0; i < 20+8-15; i++ {
		o.submit(g, fmt.Sprint("crit-", i), Request{Tenant: "c", Band: Critical})
	}
	if len(o.seq) != 28 {
		t.Fatalf("%d admitted after Critical arrivals; want the full 20 and 8 of backlog", len(o.seq))
	}
	o.submit(g, "crit-wait", Request{Tenant: "c", Band: Critical})
	if _, released := o.result("crit-wait"); released {
		t.Fatal("Critical admitted beyond the pool and its backlog")
	}
	g.check(t)
}

// AdmitRate follows what the Gate lets in, observation to observation.
func TestAdmitRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &Gate{}
		g.Observe(slots(1000))
		if r := g.AdmitRate(); r != 0 {
			t.Fatalf("rate %v before any admission", r)
		}
		// 100 admissions every 50 ms for 10 s: 2,000 a second.
		for range 200 {
			for range 100 {
				tk, err := g.Admit(context.Background(), Request{Tenant: "a", Band: Standard})
				if err != nil {
					t.Fatal(err)
				}
				tk.Done()
			}
			time.Sleep(50 * time.Millisecond)
			g.Observe(slots(1000))
		}
		if r := g.AdmitRate(); math.Abs(r-2000) > 20 {
			t.Fatalf("rate %v; want about 2000 a second", r)
		}
		// Nothing for 10 s (five time constants): under 1% remains.
		for range 200 {
			time.Sleep(50 * time.Millisecond)
			g.Observe(slots(1000))
		}
		if r := g.AdmitRate(); r > 20 {
			t.Fatalf("rate %v after 10 s without admissions; want under 20", r)
		}
	})
}
