package priority

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
)

func TestParseBand(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Band
		err  bool
	}{
		{"", Standard, false},
		{"Critical", Critical, false},
		{"critical", Critical, false},
		{"STANDARD", Standard, false},
		{"Sheddable", Sheddable, false},
		{"urgent", Standard, true},
		{"Critical ", Standard, true},
	} {
		got, err := ParseBand(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseBand(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
		if err != nil && !errors.Is(err, ErrUnknownBand) {
			t.Errorf("ParseBand(%q) error %v does not match ErrUnknownBand", tc.in, err)
		}
	}
	for b := Sheddable; b <= Critical; b++ {
		if got, err := ParseBand(b.String()); err != nil || got != b {
			t.Errorf("round trip of %v: %v, %v", b, got, err)
		}
		if got := BandFromPriority(b.Priority()); got != b {
			t.Errorf("BandFromPriority(%v.Priority()) = %v", b, got)
		}
	}
}

func TestParseObjective(t *testing.T) {
	objectives := map[string]int{"chat-interactive": 10, "batch-eval": -5, "default": 0, "7": -1}
	for _, tc := range []struct {
		in   string
		want Band
		err  bool
	}{
		{"", Standard, false},
		{"chat-interactive", Critical, false},
		{"batch-eval", Sheddable, false},
		{"default", Standard, false},
		{"7", Sheddable, false}, // a named objective wins over the integer reading
		{"1", Critical, false},
		{"-1", Sheddable, false},
		{"0", Standard, false},
		{"no-such-objective", Standard, true},
	} {
		got, err := ParseObjective(tc.in, objectives)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseObjective(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestTenantsDowngrade(t *testing.T) {
	m, _ := newMetrics(t)
	tn := tenantsOf(t, m, map[string]config.TenantSpec{
		"payments": {MaxBand: config.BandCritical},
		"search":   {}, // Standard by default
		"batch":    {MaxBand: config.BandSheddable},
	})
	for _, tc := range []struct {
		tenant string
		claim  Band
		want   Band
	}{
		{"payments", Critical, Critical},
		{"search", Critical, Standard},
		{"search", Sheddable, Sheddable},
		{"batch", Standard, Sheddable},
		{"batch", Critical, Sheddable},
		{"unknown", Critical, Standard},
	} {
		if got := tn.Band(tc.tenant, tc.claim); got != tc.want {
			t.Errorf("Band(%s, %s) = %s; want %s", tc.tenant, tc.claim, got, tc.want)
		}
	}
	for _, c := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"search", "Critical", "Standard"}, 1},
		{[]string{"batch", "Standard", "Sheddable"}, 1},
		{[]string{"batch", "Critical", "Sheddable"}, 1},
		{[]string{UnknownTenant, "Critical", "Standard"}, 1},
		{[]string{"payments", "Critical", "Critical"}, 0},
	} {
		if got := testkit.Value(t, m.downgrades.WithLabelValues(c.labels...)); got != c.want {
			t.Errorf("downgrades%v = %v; want %v", c.labels, got, c.want)
		}
	}
	// A live change of maxBand applies to the next claim.
	if err := tn.Update(map[string]*config.Tenant{"search": {Spec: config.TenantSpec{MaxBand: config.BandCritical}}}); err != nil {
		t.Fatal(err)
	}
	if got := tn.Band("search", Critical); got != Critical {
		t.Errorf("after raising search's maxBand: %s", got)
	}
	// A bad update is refused and changes nothing.
	if err := tn.Update(map[string]*config.Tenant{"search": {Spec: config.TenantSpec{MaxBand: "Gold"}}}); err == nil {
		t.Error("maxBand Gold accepted")
	}
	if err := tn.Update(map[string]*config.Tenant{"search": {Spec: config.TenantSpec{Weight: -1}}}); err == nil {
		t.Error("weight -1 accepted")
	}
	if got := tn.Band("search", Critical); got != Critical {
		t.Errorf("a refused update changed the policy: %s", got)
	}
	var none *Tenants
	if none.Band("x", Critical) != Standard || none.Weight("x") != 1 {
		t.Error("nil Tenants does not give the defaults")
	}
}

func TestPoolSaturation(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		th   Thresholds
		pods []PodLoad
		want Saturation
	}{
		{"empty", Thresholds{}, nil, Saturation{}},
		{"idle", Thresholds{}, []PodLoad{{}, {}}, Saturation{Value: 0, PerRequest: 0.1, Fresh: 2}},
		{"queue bound", Thresholds{}, []PodLoad{{Queue: 5, KVCache: 0.4}, {Queue: 0, KVCache: 0.4}},
			Saturation{Value: 0.75, PerRequest: 0.1, Fresh: 2}},
		{"kv bound", Thresholds{}, []PodLoad{{Queue: 1, KVCache: 0.8}, {Queue: 1, KVCache: 1.2}},
			Saturation{Value: 1.25, PerRequest: 0.1, Fresh: 2}},
		{"stale left out", Thresholds{}, []PodLoad{{Queue: 2.5, Age: 300 * ms}, {Queue: 50, Age: 3 * time.Second}},
			Saturation{Value: 0.5, PerRequest: 0.2, Fresh: 1, Stale: 1}},
		{"all stale is unknown", Thresholds{}, []PodLoad{{Age: time.Minute}, {Age: time.Minute}}, Saturation{Stale: 2}},
		{"custom thresholds", Thresholds{Queue: 2, KVCache: 0.5, StaleAfter: 100 * ms}, []PodLoad{{Queue: 1}, {KVCache: 0.25, Age: 150 * ms}},
			Saturation{Value: 0.5, PerRequest: 0.5, Fresh: 1, Stale: 1}},
		{"GIE: 300 ms is stale and saturated", GIEThresholds(), []PodLoad{{Queue: 0, Age: 300 * ms}, {Queue: 0, Age: 10 * ms}},
			Saturation{Value: 0.5, PerRequest: 0.1, Fresh: 2, Stale: 1}},
		{"GIE: empty pool is saturated", GIEThresholds(), nil, Saturation{Value: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.th.Pool(tc.pods)
			if !near(got.Value, tc.want.Value) || !near(got.PerRequest, tc.want.PerRequest) || got.Fresh != tc.want.Fresh || got.Stale != tc.want.Stale {
				t.Fatalf("Pool = %+v; want %+v", got, tc.want)
			}
		})
	}
}

func near(a, b float64) bool { d := a - b; return d < 1e-9 && d > -1e-9 }

func TestCombine(t *testing.T) {
	a := Saturation{Value: 1.5, PerRequest: 0.1, Fresh: 2}   // 2 pods, Queue 5
	b := Saturation{Value: 0.25, PerRequest: 0.05, Fresh: 4} // 4 pods
	c := Saturation{Stale: 3}                                // blind cluster
	got := Combine(a, b, c)
	// (1.5×2 + 0.25×4)/6 = 4/6; PerRequest 1/(10+20).
	if !near(got.Value, 4.0/6) || !near(got.PerRequest, 1.0/30) || got.Fresh != 6 || got.Stale != 3 {
		t.Fatalf("Combine = %+v", got)
	}
	if Combine(c).Known() {
		t.Fatal("a blind cluster alone is known")
	}
}

func TestGIEGate(t *testing.T) {
	ctx := context.Background()
	g := &GIEGate{}
	// Before any metrics GIE fails closed for negative priority.
	if _, err := g.Admit(ctx, Request{Band: Sheddable}); !errors.Is(err, ErrShed) {
		t.Fatalf("no metrics yet: %v", err)
	}
	g.Observe(GIEThresholds().Pool([]PodLoad{{Queue: 10}, {Queue: 0, Age: time.Second}}))
	if _, err := g.Admit(ctx, Request{Band: Sheddable}); !errors.Is(err, ErrShed) {
		t.Fatalf("saturated: Sheddable admitted (%v)", err)
	}
	// Standard and Critical are never queued or refused, however saturated.
	for i := 0; i < 1000; i++ {
		if _, err := g.Admit(ctx, Request{Tenant: "heavy", Band: Standard}); err != nil {
			t.Fatalf("Standard refused: %v", err)
		}
	}
	g.Observe(GIEThresholds().Pool([]PodLoad{{Queue: 1}, {Queue: 1}}))
	if tk, err := g.Admit(ctx, Request{Band: Sheddable}); err != nil {
		t.Fatalf("headroom: Sheddable refused: %v", err)
	} else {
		tk.Done()
	}
	var _ Admitter = g
	var _ Admitter = &Gate{}
}

func TestDigestAge(t *testing.T) {
	s := Saturation{Value: 0.4, PerRequest: 0.05, Fresh: 4, Stale: 1}
	th := Thresholds{StaleAfter: 3 * time.Second}
	if got := th.Digest(s, 2*time.Second); got != s {
		t.Fatalf("fresh digest changed: %+v", got)
	}
	if got := th.Digest(s, 4*time.Second); got.Known() || got.Stale != 5 {
		t.Fatalf("old digest %+v; want unknown with 5 stale pods", got)
	}
	if got := GIEThresholds().Digest(s, time.Second); !got.Saturated() {
		t.Fatalf("GIE rule: a 1 s old digest %+v should count as saturated", got)
	}
}
