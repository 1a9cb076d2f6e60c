package rewrite

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/meridian-router/meridian/config"
)

func rw(name string, spec config.ModelRewriteSpec) *config.ModelRewrite {
	return &config.ModelRewrite{
		APIVersion: config.GIEXV1Alpha2,
		Kind:       config.KindModelRewrite,
		Metadata:   config.Metadata{Name: name},
		Spec:       spec,
	}
}

func exact(models ...string) []config.RewriteMatch {
	var m []config.RewriteMatch
	for _, v := range models {
		m = append(m, config.RewriteMatch{Model: &config.ModelMatch{Type: "Exact", Value: v}})
	}
	return m
}

func targets(tw ...any) []config.RewriteTarget {
	var ts []config.RewriteTarget
	for i := 0; i < len(tw); i += 2 {
		ts = append(ts, config.RewriteTarget{ModelRewrite: tw[i].(string), Weight: int64(tw[i+1].(int))})
	}
	return ts
}

func rewrites(rs ...*config.ModelRewrite) map[string]*config.ModelRewrite {
	m := map[string]*config.ModelRewrite{}
	for _, r := range rs {
		m[r.Metadata.Name] = r
	}
	return m
}

func mustResolver(t testing.TB, rs ...*config.ModelRewrite) *Resolver {
	t.Helper()
	r, err := NewResolver(rewrites(rs...))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestExactBeatsGeneric(t *testing.T) {
	r := mustResolver(t,
		rw("catch-all", config.ModelRewriteSpec{Rules: []config.RewriteRule{{Targets: targets("fallback", 1)}}}),
		rw("agent", config.ModelRewriteSpec{Rules: []config.RewriteRule{{Matches: exact("support-agent"), Targets: targets("agent-v3", 1)}}}),
	)
	for _, tc := range []struct{ model, target, rewrite string }{
		{"support-agent", "agent-v3", "agent"},
		{"anything-else", "fallback", "catch-all"},
	} {
		res, ok := r.Resolve(Request{Model: tc.model, Tenant: "t"})
		if !ok || res.Target != tc.target || res.Public != tc.model || res.Rewrite != tc.rewrite {
			t.Errorf("Resolve(%q) = %+v, %v; want target %q from %q, public %q", tc.model, res, ok, tc.target, tc.rewrite, tc.model)
		}
	}
}

func TestNoMatchKeepsModel(t *testing.T) {
	r := mustResolver(t, rw("agent", config.ModelRewriteSpec{Rules: []config.RewriteRule{{Matches: exact("a"), Targets: targets("a2", 1)}}}))
	res, ok := r.Resolve(Request{Model: "b"})
	if ok || res.Target != "b" || res.Public != "b" || res.Rewrite != "" {
		t.Fatalf("Resolve(b) = %+v, %v; want unmatched passthrough", res, ok)
	}
	var zero Resolver
	if res, ok := zero.Resolve(Request{Model: "a"}); ok || res.Target != "a" {
		t.Fatalf("zero Resolver: %+v, %v", res, ok)
	}
}

// split resolves n distinct keys and returns each target's share.
func split(r *Resolver, model string, n int) map[string]float64 {
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		res, _ := r.Resolve(Request{Model: model, Tenant: fmt.Sprintf("tenant-%d", i)})
		counts[res.Target]++
	}
	out := map[string]float64{}
	for k, c := range counts {
		out[k] = float64(c) / float64(n)
	}
	return out
}

func TestSplitMatchesWeights(t *testing.T) {
	for _, tc := range []struct {
		name string
		tw   []any
	}{
		{"95/5", []any{"stable", 95, "canary", 5}},
		{"50/50", []any{"stable", 50, "canary", 50}},
		{"three-way", []any{"a", 700_000, "b", 200_000, "c", 100_000}},
		{"extremes", []any{"a", 1_000_000, "b", 10_000}},
		{"one-percent", []any{"a", 99, "b", 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := targets(tc.tw...)
			r := mustResolver(t, rw("m", config.ModelRewriteSpec{
				Rules:      []config.RewriteRule{{Matches: exact("m"), Targets: ts}},
				Stickiness: &config.Stickiness{Salt: "rollout-7"},
			}))
			var total int64
			for _, tg := range ts {
				total += tg.Weight
			}
			got := split(r, "m", 10_000)
			for _, tg := range ts {
				want := float64(tg.Weight) / float64(total)
				if d := math.Abs(got[tg.ModelRewrite] - want); d > 0.01 {
					t.Errorf("%s: share %.4f, want %.4f ± 0.01", tg.ModelRewrite, got[tg.ModelRewrite], want)
				}
			}
		})
	}
}

func TestSticky(t *testing.T) {
	spec := config.ModelRewriteSpec{
		Rules:      []config.RewriteRule{{Matches: exact("m"), Targets: targets("stable", 50, "canary", 50)}},
		Stickiness: &config.Stickiness{Key: "header", Header: "x-session-id", Salt: "s1"},
	}
	r := mustResolver(t, rw("m", spec))
	h := http.Header{}
	// One session, many requests, different tenants: the session decides.
	h.Set("X-Session-Id", "conv-42")
	first, _ := r.Resolve(Request{Model: "m", Tenant: "a", Header: h})
	for i := 0; i < 100; i++ {
		res, _ := r.Resolve(Request{Model: "m", Tenant: fmt.Sprint(i), Header: h})
		if res.Target != first.Target {
			t.Fatalf("request %d of session flipped: %s then %s", i, first.Target, res.Target)
		}
	}
	// An unchanged reload keeps every assignment.
	before := map[string]string{}
	for i := 0; i < 1000; i++ {
		h.Set("X-Session-Id", fmt.Sprint("s", i))
		res, _ := r.Resolve(Request{Model: "m", Header: h})
		before[fmt.Sprint("s", i)] = res.Target
	}
	if err := r.Update(rewrites(rw("m", spec))); err != nil {
		t.Fatal(err)
	}
	for k, want := range before {
		h.Set("X-Session-Id", k)
		if res, _ := r.Resolve(Request{Model: "m", Header: h}); res.Target != want {
			t.Fatalf("session %s moved from %s to %s across an unchanged reload", k, want, res.Target)
		}
	}
	// Without the header the tenant is the key.
	byTenant := map[string]bool{}
	for i := 0; i < 200; i++ {
		res, _ := r.Resolve(Request{Model: "m", Tenant: "tenant-x", Header: http.Header{}})
		byTenant[res.Target] = true
	}
	if len(byTenant) != 1 {
		t.Fatalf("tenant without session header got %d targets", len(byTenant))
	}
}

func TestSaltReshuffles(t *testing.T) {
	mk := func(salt string) *Resolver {
		return mustResolver(t, rw("m", config.ModelRewriteSpec{
			Rules:      []config.RewriteRule{{Matches: exact("m"), Targets: targets("stable", 90, "canary", 10)}},
			Stickiness: &config.Stickiness{Salt: salt},
		}))
	}
	a, b := mk("rollout-1"), mk("rollout-2")
	overlap, canaryA := 0, 0
	for i := 0; i < 10_000; i++ {
		req := Request{Model: "m", Tenant: fmt.Sprint("t", i)}
		ra, _ := a.Resolve(req)
		rb, _ := b.Resolve(req)
		if ra.Target == "canary" {
			canaryA++
			if rb.Target == "canary" {
				overlap++
			}
		}
	}
	// Independent 10% samples overlap on about 10% of the first one.
	if frac := float64(overlap) / float64(canaryA); frac > 0.2 {
		t.Fatalf("a new salt kept %.0f%% of the canary cohort; want a fresh draw", 100*frac)
	}
}

func rollout(status string, step int, steps ...int64) *config.Rollout {
	return &config.Rollout{Stable: "v2", Canary: "v3", Steps: steps, Step: step, Status: status,
		Interval: config.Duration(10 * 60e9), StepStarted: "2026-11-29T10:00:00Z"}
}

func TestRolloutDrivesSplit(t *testing.T) {
	mk := func(ro *config.Rollout) *Resolver {
		// The canary is listed first on purpose: the resolver still gives it
		// the top of the key space, and the targets' weights are overridden.
		return mustResolver(t, rw("agent", config.ModelRewriteSpec{
			Rules: []config.RewriteRule{{Matches: exact("agent"), Targets: []config.RewriteTarget{
				{ModelRewrite: "v3", Weight: 1, Clusters: []string{"us-east-1a"}},
				{ModelRewrite: "v2", Weight: 1},
			}}},
			Stickiness: &config.Stickiness{Salt: "r1"},
			Rollout:    ro,
		}))
	}
	const n = 10_000
	onCanary := func(r *Resolver) map[int]bool {
		m := map[int]bool{}
		for i := 0; i < n; i++ {
			res, _ := r.Resolve(Request{Model: "agent", Tenant: fmt.Sprint(i)})
			if res.Canary != (res.Target == "v3") || res.Stable != (res.Target == "v2") {
				t.Fatalf("Canary %v, Stable %v for target %s", res.Canary, res.Stable, res.Target)
			}
			if res.Canary {
				if len(res.Clusters) != 1 || res.Clusters[0] != "us-east-1a" {
					t.Fatalf("canary clusters = %v", res.Clusters)
				}
				m[i] = true
			}
		}
		return m
	}
	prev := map[int]bool{}
	for step, pct := range []int64{5, 25, 50, 100} {
		got := onCanary(mk(rollout(StatusProgressing, step, 5, 25, 50, 100)))
		if share := float64(len(got)) / n; math.Abs(share-float64(pct)/100) > 0.01 {
			t.Errorf("step %d: canary share %.4f, want %.2f", step, share, float64(pct)/100)
		}
		for k := range prev {
			if !got[k] {
				t.Fatalf("step %d: key %d left the canary as its weight grew", step, k)
			}
		}
		prev = got
	}
	for _, st := range []string{StatusDegraded, StatusAborted} {
		if got := onCanary(mk(rollout(st, 2, 5, 25, 50, 100))); len(got) != 0 {
			t.Errorf("%s: %d keys still on the canary", st, len(got))
		}
	}
	// A manual canary (no steps) uses the targets' weights.
	if got := onCanary(mk(&config.Rollout{Stable: "v2", Canary: "v3"})); math.Abs(float64(len(got))/n-0.5) > 0.01 {
		t.Errorf("manual canary share %.4f, want 0.5", float64(len(got))/n)
	}
}

func TestBuildErrors(t *testing.T) {
	rule := func(ts ...config.RewriteTarget) config.ModelRewriteSpec {
		return config.ModelRewriteSpec{Rules: []config.RewriteRule{{Matches: exact("m"), Targets: ts}}}
	}
	for _, tc := range []struct {
		name string
		rs   []*config.ModelRewrite
		want string
	}{
		{"weight zero", []*config.ModelRewrite{rw("a", rule(config.RewriteTarget{ModelRewrite: "x", Weight: 0}))}, "weight: must be 1..1000000, got 0"},
		{"weight too big", []*config.ModelRewrite{rw("a", rule(config.RewriteTarget{ModelRewrite: "x", Weight: 1_000_001}))}, "got 1000001"},
		{"no targets", []*config.ModelRewrite{rw("a", rule())}, "at least one target"},
		{"empty target", []*config.ModelRewrite{rw("a", rule(config.RewriteTarget{Weight: 1}))}, "modelRewrite: required"},
		{"duplicate target", []*config.ModelRewrite{rw("a", rule(config.RewriteTarget{ModelRewrite: "x", Weight: 1}, config.RewriteTarget{ModelRewrite: "x", Weight: 2}))}, `"x" is also targets[0]`},
		{"same model twice", []*config.ModelRewrite{
			rw("a", rule(config.RewriteTarget{ModelRewrite: "x", Weight: 1})),
			rw("b", rule(config.RewriteTarget{ModelRewrite: "y", Weight: 1})),
		}, `model "m" is already matched by InferenceModelRewrite "a"`},
		{"two generic", []*config.ModelRewrite{
			rw("a", config.ModelRewriteSpec{Rules: []config.RewriteRule{{Targets: targets("x", 1)}}}),
			rw("b", config.ModelRewriteSpec{Rules: []config.RewriteRule{{Targets: targets("y", 1)}}}),
		}, "second rule without model matches"},
		{"regex match", []*config.ModelRewrite{rw("a", config.ModelRewriteSpec{Rules: []config.RewriteRule{{
			Matches: []config.RewriteMatch{{Model: &config.ModelMatch{Type: "RegularExpression", Value: ".*"}}}, Targets: targets("x", 1)}}})},
			`only Exact is supported, got "RegularExpression"`},
		{"bad stickiness", []*config.ModelRewrite{rw("a", config.ModelRewriteSpec{Rules: rule(config.RewriteTarget{ModelRewrite: "x", Weight: 1}).Rules,
			Stickiness: &config.Stickiness{Key: "cookie"}})}, `want tenant or header, got "cookie"`},
		{"header without name", []*config.ModelRewrite{rw("a", config.ModelRewriteSpec{Rules: rule(config.RewriteTarget{ModelRewrite: "x", Weight: 1}).Rules,
			Stickiness: &config.Stickiness{Key: "header"}})}, "stickiness.header: required"},
		{"bad rollout status", []*config.ModelRewrite{rw("a", config.ModelRewriteSpec{
			Rules:   rule(config.RewriteTarget{ModelRewrite: "v2", Weight: 1}, config.RewriteTarget{ModelRewrite: "v3", Weight: 1}).Rules,
			Rollout: &config.Rollout{Stable: "v2", Canary: "v3", Status: "Exploded"}})}, `status "Exploded"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewResolver(rewrites(tc.rs...))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestUpdateErrorKeepsOld(t *testing.T) {
	r := mustResolver(t, rw("a", config.ModelRewriteSpec{Rules: []config.RewriteRule{{Matches: exact("m"), Targets: targets("x", 1)}}}))
	err := r.Update(rewrites(rw("a", config.ModelRewriteSpec{Rules: []config.RewriteRule{{Matches: exact("m"), Targets: targets("y", 0)}}})))
	if err == nil {
		t.Fatal("Update accepted weight 0")
	}
	if res, _ := r.Resolve(Request{Model: "m"}); res.Target != "x" {
		t.Fatalf("after a failed update target = %q; want the old x", res.Target)
	}
	if errors.Is(err, ErrBadRollout) {
		t.Fatalf("weight error classified as a rollout error: %v", err)
	}
}

func TestConcurrentUpdate(t *testing.T) {
	a := rewrites(rw("a", config.ModelRewriteSpec{Rules: []config.RewriteRule{{Matches: exact("m"), Targets: targets("x", 1)}}}))
	b := rewrites(rw("a", config.ModelRewriteSpec{Rules: []config.RewriteRule{{Matches: exact("m"), Targets: targets("y", 1)}}}))
	r, _ := NewResolver(a)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; i < 200; i++ {
			if i%2 == 0 {
				_ = r.Update(b)
			} else {
				_ = r.Update(a)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < 2000; i++ {
			if res, ok := r.Resolve(Request{Model: "m"}); !ok || (res.Target != "x" && res.Target != "y") {
				t.Errorf("mid-swap resolution %+v, %v", res, ok)
				return
			}
		}
	}()
	wg.Wait()
}

func TestResolveAllocationFree(t *testing.T) {
	r := mustResolver(t, rw("a", config.ModelRewriteSpec{
		Rules:      []config.RewriteRule{{Matches: exact("support-agent"), Targets: targets("v2", 95, "v3", 5)}},
		Stickiness: &config.Stickiness{Key: "header", Header: "x-session-id", Salt: "s"},
	}))
	h := http.Header{"X-Session-Id": {"conversation-1234"}}
	req := Request{Model: "support-agent", Tenant: "team-a", Header: h}
	if n := testing.AllocsPerRun(1000, func() { r.Resolve(req) }); n != 0 {
		t.Fatalf("Resolve allocates %.1f times per call; want 0", n)
	}
	req.Model = "unknown"
	if n := testing.AllocsPerRun(1000, func() { r.Resolve(req) }); n != 0 {
		t.Fatalf("unmatched Resolve allocates %.1f times per call; want 0", n)
	}
}

func BenchmarkResolve(b *testing.B) {
	r := mustResolver(b, rw("a", config.ModelRewriteSpec{
		Rules:      []config.RewriteRule{{Matches: exact("support-agent"), Targets: targets("v2", 95, "v3", 5)}},
		Stickiness: &config.Stickiness{Key: "header", Header: "x-session-id", Salt: "s"},
	}))
	b.Run("tenant", func(b *testing.B) {
		req := Request{Model: "support-agent", Tenant: "team-a"}
		b.ReportAllocs()
		for b.Loop() {
			r.Resolve(req)
		}
	})
	b.Run("session-header", func(b *testing.B) {
		req := Request{Model: "support-agent", Tenant: "team-a", Header: http.Header{"X-Session-Id": {"conversation-1234"}}}
		b.ReportAllocs()
		for b.Loop() {
			r.Resolve(req)
		}
	})
	b.Run("unmatched", func(b *testing.B) {
		req := Request{Model: "other", Tenant: "team-a"}
		b.ReportAllocs()
		for b.Loop() {
			r.Resolve(req)
		}
	})
}

func TestRolloutKeepsOtherTargets(t *testing.T) {
	r := mustResolver(t, rw("agent", config.ModelRewriteSpec{
		Rules: []config.RewriteRule{{Matches: exact("agent"), Targets: targets("v1", 500_000, "v2", 250_000, "v3", 250_000)}},
		Rollout: &config.Rollout{Stable: "v2", Canary: "v3", Steps: []int64{20, 100}, Status: StatusProgressing,
			Interval: config.Duration(60e9), StepStarted: "2026-11-29T10:00:00Z"},
	}))
	got := split(r, "agent", 10_000)
	for target, want := range map[string]float64{"v1": 0.5, "v2": 0.4, "v3": 0.1} {
		if math.Abs(got[target]-want) > 0.01 {
			t.Errorf("%s: share %.4f; want %.2f (v1 keeps its half, v2/v3 split the rest 80/20)", target, got[target], want)
		}
	}
}
