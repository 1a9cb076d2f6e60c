package rewrite

import (
	"fmt"
	"strings"
	"testing"

	"github.com/meridian-router/meridian/config"
)

func TestCohortSampleCounts(t *testing.T) {
	for _, c := range []struct {
		name        string
		keys        int
		tolerance   float64 // relative, on the distinct count
		wantKeysPct float64 // keys whose index is divisible by 10 are on the canary
	}{
		{"few keys are counted exactly", 5, 0, 20},
		{"below the sample size exactly", CohortSampleSize - 1, 0, 10},
		{"beyond it estimated", 20_000, 0.10, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s CohortSample
			for range 2 { // repeats change nothing
				for i := range c.keys {
					s.Add(fmt.Sprint("key-", i), i%10 == 0)
				}
			}
			keys, canary := s.Keys()
			if d := float64(keys-int64(c.keys)) / float64(c.keys); d > c.tolerance || d < -c.tolerance {
				t.Fatalf("%d distinct keys counted as %d", c.keys, keys)
			}
			if got := 100 * float64(canary) / float64(keys); got < c.wantKeysPct-3 || got > c.wantKeysPct+3 {
				t.Fatalf("canary share of keys %.1f%%, want %.0f%%", got, c.wantKeysPct)
			}
			if len(s.Hashes()) > CohortSampleSize {
				t.Fatalf("sample holds %d entries", len(s.Hashes()))
			}
		})
	}
}

func TestCohortSampleMerge(t *testing.T) {
	// Two instances see overlapping halves of 3,000 keys; merged, the
	// count is of the union.
	var a, b CohortSample
	for i := range 2000 {
		a.Add(fmt.Sprint("k", i), false)
		b.Add(fmt.Sprint("k", i+1000), false)
	}
	a.Merge(SampleOf(b.Hashes()))
	if keys, _ := a.Keys(); keys < 2700 || keys > 3300 {
		t.Fatalf("union of 3000 keys counted as %d", keys)
	}
	var few CohortSample
	few.Add("x", true)
	few.Merge(SampleOf([]uint64{}))
	if keys, canary := few.Keys(); keys != 1 || canary != 1 {
		t.Fatalf("one canary key counted as %d (%d on canary)", keys, canary)
	}
}

func TestCohortObserveCountsOnlyThePair(t *testing.T) {
	var c Cohort
	c.Observe(Resolution{Key: "a", Canary: true})
	c.Observe(Resolution{Key: "a", Canary: true})
	c.Observe(Resolution{Key: "b", Stable: true})
	c.Observe(Resolution{Key: "c"}) // another target of the rule
	req, canary, s := c.Counts()
	keys, onCanary := s.Keys()
	if req != 3 || canary != 2 || keys != 2 || onCanary != 1 {
		t.Fatalf("requests %d (canary %d), keys %d (canary %d); want 3 (2), 2 (1)", req, canary, keys, onCanary)
	}
}

func TestCohortWarning(t *testing.T) {
	for _, c := range []struct {
		name           string
		pct            float64
		keys, requests int64
		warn           bool
	}{
		{"5 tenants at 5%", 5, 5, 100, true},
		{"19 keys at 5%", 5, 19, 100, true},
		{"20 keys at 5%", 5, 20, 100, false},
		{"1000 sessions at 5%", 5, 1000, 1000, false},
		{"few requests of many keys so far", 5, 10, 10, false},
		{"5 tenants at 50%", 50, 5, 100, false},
		{"no traffic", 5, 0, 0, false},
		{"aborted", 0, 5, 100, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := CohortWarning(c.pct, c.keys, c.requests)
			if (w != "") != c.warn || (w != "" && !strings.Contains(w, fmt.Sprint(c.keys, " distinct"))) {
				t.Fatalf("CohortWarning(%v, %d, %d) = %q, want warning %v", c.pct, c.keys, c.requests, w, c.warn)
			}
		})
	}
}

// BenchmarkCohortObserve is Tier-2's per-request cost of measuring a
// rollout's cohort, against Resolve itself, over 100,000 session keys
// (past the sample size, the common case).
func BenchmarkCohortObserve(b *testing.B) {
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprint("session-", i)
	}
	b.Run("resolve", func(b *testing.B) {
		r := benchResolver(b)
		h := &singleHeader{}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			h.v = keys[i%len(keys)]
			r.Resolve(Request{Model: "m", Header: h})
		}
	})
	b.Run("resolve+observe", func(b *testing.B) {
		r := benchResolver(b)
		h := &singleHeader{}
		var c Cohort
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			h.v = keys[i%len(keys)]
			res, _ := r.Resolve(Request{Model: "m", Header: h})
			c.Observe(res)
		}
	})
}

type singleHeader struct{ v string }

func (h *singleHeader) Get(string) string { return h.v }

func benchResolver(b *testing.B) *Resolver {
	b.Helper()
	ro := &config.Rollout{Stable: "stable", Canary: "canary", Steps: []int64{5}, Status: StatusProgressing}
	r, err := NewResolver(map[string]*config.ModelRewrite{"m": {Metadata: config.Metadata{Name: "m"}, Spec: config.ModelRewriteSpec{
		Rules:      []config.RewriteRule{{Matches: exact("m"), Targets: targets("stable", 1, "canary", 1)}},
		Stickiness: &config.Stickiness{Key: "header", Header: "x-session-id", Salt: "s"}, Rollout: ro}}})
	if err != nil {
		b.Fatal(err)
	}
	return r
}
