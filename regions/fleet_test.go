package regions

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
)

// pool is a healthy, idle digest for cluster region/name serving model.
func pool(region, name, model string) Digest {
	return Digest{Region: region, Cluster: name, Pool: model + "-pool", Model: model,
		ReadyPods: 4, TotalPods: 4, Headroom: 1, Version: 1, Produced: time.Now()}
}

func newFleet(t testing.TB, cfg Config, digests ...Digest) *Fleet {
	t.Helper()
	if cfg.LocalRegion == "" {
		cfg.LocalRegion = "us-east-1"
	}
	if cfg.Clusters == nil {
		seen := map[[2]string]bool{}
		for _, d := range digests {
			k := [2]string{d.Region, d.Cluster}
			if !seen[k] {
				seen[k] = true
				cfg.Clusters = append(cfg.Clusters, Cluster{Region: d.Region, Name: d.Cluster, Tier1: "http://" + d.Cluster})
			}
		}
	}
	f, err := NewFleet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range digests {
		if ok, err := f.Digests().Put(d); !ok || err != nil {
			t.Fatalf("Put(%s) = %v, %v", d.Key(), ok, err)
		}
	}
	return f
}

func names(ts []Target) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Cluster
	}
	return out
}

func TestSelectPrefersNearRegion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t, Config{RTTs: []RegionRTT{{"us-east-1", "eu-west-1", 80 * time.Millisecond}}},
			pool("eu-west-1", "euw1-a", "llama"),
			pool("us-east-1", "use1-a", "llama"),
		)
		got := f.Select(nil, Request{Model: "llama"})
		if fmt.Sprint(names(got)) != "[use1-a euw1-a]" {
			t.Fatalf("Select = %v, want the local cluster first and the remote one as fallback", names(got))
		}
		// The first fallback is in another Region: failures within a
		// Region are correlated.
		f3 := newFleet(t, Config{RTTs: []RegionRTT{{"us-east-1", "eu-west-1", 80 * time.Millisecond}}},
			pool("eu-west-1", "euw1-a", "llama"), pool("us-east-1", "use1-a", "llama"), pool("us-east-1", "use1-b", "llama"))
		if got := fmt.Sprint(names(f3.Select(nil, Request{Model: "llama"}))); got != "[use1-a euw1-a use1-b]" {
			t.Errorf("Select = %v, want [use1-a euw1-a use1-b]", got)
		}

		// Prefix affinity never trades proximity for a distant home.
		for p := range uint64(500) {
			if got := f.Select(nil, Request{Model: "llama", PrefixHash: p*0x9E3779B97F4A7C15 | 1}); got[0].Cluster != "use1-a" {
				t.Fatalf("prefix %d went to %s", p, got[0].Cluster)
			}
		}
		if rtt, src := f.RTT("eu-west-1"); rtt != 80*time.Millisecond || src != RTTConfigured {
			t.Errorf("RTT(eu-west-1) = %v (%v), want the configured 80ms", rtt, src)
		}

		// Measured round trips override configuration: ap-south-1 is
		// configured far but measured near, so it beats eu-west-1.
		f2 := newFleet(t, Config{RTTs: []RegionRTT{{"us-east-1", "eu-west-1", 80 * time.Millisecond}, {"ap-south-1", "us-east-1", 200 * time.Millisecond}}},
			pool("eu-west-1", "euw1-a", "llama"),
			pool("ap-south-1", "aps1-a", "llama"),
		)
		if got := names(f2.Select(nil, Request{Model: "llama"})); got[0] != "euw1-a" {
			t.Fatalf("by configuration: %v, want euw1-a first", got)
		}
		f2.ObserveRTT("ap-south-1", 10*time.Millisecond)
		if got := names(f2.Select(nil, Request{Model: "llama"})); got[0] != "aps1-a" {
			t.Errorf("after measuring ap-south-1 at 10ms: %v, want aps1-a first", got)
		}
		// A measurement goes stale and the configuration is used again.
		time.Sleep(3 * time.Minute)
		if _, src := f2.RTT("ap-south-1"); src != RTTConfigured {
			t.Errorf("after 3 min without probes the RTT source is %v, want configured", src)
		}
	})
}

func TestSelectPrefersHeadroom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		busy := pool("us-east-1", "busy", "llama")
		busy.KVMean, busy.QueueTotal = 0.95, 40
		idle := pool("us-east-1", "idle", "llama")
		failing := pool("us-east-1", "failing", "llama")
		failing.ErrorRate = 0.3
		f := newFleet(t, Config{}, busy, idle, failing)
		got := names(f.Select(nil, Request{Model: "llama"}))
		if fmt.Sprint(got) != "[idle failing busy]" && fmt.Sprint(got) != "[idle busy failing]" {
			t.Errorf("Select = %v, want idle first", got)
		}

		// Load far away beats a saturated, erroring local cluster.
		local := pool("us-east-1", "local", "llama")
		local.KVMean, local.QueueTotal, local.ErrorRate = 1, 200, 0.3
		remote := pool("eu-west-1", "remote", "llama")
		f = newFleet(t, Config{}, local, remote)
		if got := names(f.Select(nil, Request{Model: "llama"})); got[0] != "remote" {
			t.Errorf("Select = %v, want the healthy remote cluster first", got)
		}
	})
}

func TestSelectCandidates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		noPods := pool("us-east-1", "empty", "llama")
		noPods.ReadyPods = 0
		other := pool("us-east-1", "other", "mistral")
		stray := pool("us-east-1", "unlisted", "llama")
		withAdapter := pool("eu-west-1", "lora", "llama")
		withAdapter.Adapters = []string{"sql-gen"}
		f := newFleet(t, Config{Clusters: []Cluster{
			{Region: "us-east-1", Name: "empty"}, {Region: "us-east-1", Name: "other"}, {Region: "eu-west-1", Name: "lora"},
		}}, noPods, other, stray, withAdapter)

		for _, c := range []struct{ model, want string }{
			{"llama", "[lora]"},    // no ready pods and not in the config: not candidates
			{"sql-gen", "[lora]"},  // an adapter routes to its pool's clusters
			{"mistral", "[other]"}, // only clusters serving the model
			{"unknown", "[]"},      // nothing serves it
		} {
			if got := fmt.Sprint(names(f.Select(nil, Request{Model: c.model}))); got != c.want {
				t.Errorf("Select(%s) = %v, want %v", c.model, got, c.want)
			}
		}

		// A request restricted to some clusters gets only those.
		if got := fmt.Sprint(names(f.Select(nil, Request{Model: "mistral", Clusters: []string{"lora"}}))); got != "[]" {
			t.Errorf("Select(mistral, only lora) = %v, want []", got)
		}
		if got := fmt.Sprint(names(f.Select(nil, Request{Model: "llama", Clusters: []string{"x", "lora"}}))); got != "[lora]" {
			t.Errorf("Select(llama, only x or lora) = %v, want [lora]", got)
		}

		// A digest that is not refreshed stops its cluster being chosen.
		time.Sleep(5*time.Second + time.Nanosecond)
		if got := f.Select(nil, Request{Model: "llama"}); len(got) != 0 {
			t.Errorf("after the digests went stale Select = %v, want none", names(got))
		}
	})
}

// A cluster whose ready pods all have stale metrics (a Tier-1 that missed
// its scrapes: a CPU-starved host) stays a candidate, behind any cluster
// with fresh evidence; one with no ready pods at all does not.
func TestBlindClusterStaysCandidate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		blind := pool("us-east-1", "blind", "llama")
		blind.ReadyPods, blind.StalePods, blind.Headroom = 0, 4, 0
		f := newFleet(t, Config{}, blind)
		if got := fmt.Sprint(names(f.Select(nil, Request{Model: "llama"}))); got != "[blind]" {
			t.Errorf("only a blind cluster: Select = %v, want [blind]", got)
		}

		// A fresh cluster in the same Region comes first.
		f = newFleet(t, Config{}, blind, pool("us-east-1", "seen", "llama"))
		if got := names(f.Select(nil, Request{Model: "llama"})); len(got) != 2 || got[0] != "seen" {
			t.Errorf("blind and fresh: Select = %v, want [seen blind]", got)
		}

		down := blind
		down.Cluster, down.StalePods = "down", 0
		f = newFleet(t, Config{}, down)
		if got := f.Select(nil, Request{Model: "llama"}); len(got) != 0 {
			t.Errorf("no ready pods: Select = %v, want none", names(got))
		}
	})
}

func TestSelectMaxTargets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ds []Digest
		for i := range 6 {
			ds = append(ds, pool("us-east-1", fmt.Sprintf("c%d", i), "llama"))
		}
		f := newFleet(t, Config{MaxTargets: 4}, ds...)
		if got := f.Select(nil, Request{Model: "llama", PrefixHash: 42}); len(got) != 4 {
			t.Errorf("Select returned %d targets, want MaxTargets=4", len(got))
		}
	})
}

// equalClusters returns n equally good clusters of one Region with the given
// ready pods each.
func equalClusters(pods ...int) []Digest {
	var ds []Digest
	for i, p := range pods {
		d := pool("us-east-1", fmt.Sprintf("c%d", i), "llama")
		d.ReadyPods, d.TotalPods = p, p
		ds = append(ds, d)
	}
	return ds
}

func TestPrefixStickiness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ds := equalClusters(4, 4, 4, 4)
		a := newFleet(t, Config{}, ds...)
		b := newFleet(t, Config{}, ds...) // another Tier-2 instance
		homes := map[string]int{}
		for range 2000 {
			prefix := rand.Uint64() | 1
			ta := a.Select(nil, Request{Model: "llama", PrefixHash: prefix})
			tb := b.Select(nil, Request{Model: "llama", PrefixHash: prefix})
			if ta[0].Cluster != tb[0].Cluster {
				t.Fatalf("prefix %x: two Tier-2s chose %s and %s", prefix, ta[0].Cluster, tb[0].Cluster)
			}
			// With no load, the same prefix always lands on its home.
			a.Begin(ta[0])
			again := a.Select(nil, Request{Model: "llama", PrefixHash: prefix})
			a.End(ta[0], Success)
			if again[0].Cluster != ta[0].Cluster {
				// One request in flight is within the load floor: the
				// prefix stays home.
				t.Errorf("prefix %x moved from %s to %s", prefix, ta[0].Cluster, again[0].Cluster)
			}
			homes[ta[0].Cluster]++
		}
		// Consistent hashing spreads distinct prefixes over all clusters.
		for _, d := range ds {
			if n := homes[d.Cluster]; n < 2000/4/2 {
				t.Errorf("cluster %s is home to %d of 2000 prefixes; want about 500", d.Cluster, n)
			}
		}
		t.Logf("homes of 2000 random prefixes over 4 clusters: %v", homes)
	})
}

func TestPrefixMovesMinimallyWhenAClusterLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ds := equalClusters(4, 4, 4, 4, 4)
		before := newFleet(t, Config{}, ds...)
		after := newFleet(t, Config{}, ds[:4]...) // c4 gone
		moved := 0
		for range 2000 {
			p := rand.Uint64() | 1
			hb := before.Select(nil, Request{Model: "llama", PrefixHash: p})[0].Cluster
			ha := after.Select(nil, Request{Model: "llama", PrefixHash: p})[0].Cluster
			if hb != ha {
				if hb != "c4" {
					t.Fatalf("prefix %x moved from %s to %s though %s is still there", p, hb, ha, hb)
				}
				moved++
			}
		}
		t.Logf("%d of 2000 prefixes moved when 1 of 5 clusters left", moved)
	})
}

// TestBoundedLoadNeverExceeded sends a skewed stream (one hot system prompt
// takes half of all requests) to clusters of unequal size, keeping requests
// in flight, and checks after every assignment that no cluster holds more
// than ⌈(1+ε)·L·c/C⌉ of the L requests in flight.
func TestBoundedLoadNeverExceeded(t *testing.T) {
	for _, c := range []struct{ lf, floor float64 }{{1.1, -1}, {1.25, -1}, {2, -1}, {1.25, 0}, {1.1, 4}} {
		lf, floor := c.lf, max(0, c.floor)
		if c.floor == 0 {
			floor = 1 // the default
		}
		t.Run(fmt.Sprintf("loadFactor=%v/floor=%v", lf, floor), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ds := equalClusters(2, 4, 4, 8, 2)
				f := newFleet(t, Config{LoadFactor: lf, LoadFloor: c.floor}, ds...)
				capOf := map[string]float64{}
				var total float64
				for _, d := range ds {
					capOf[d.Cluster] = float64(d.ReadyPods)
					total += float64(d.ReadyPods)
				}
				rng := rand.New(rand.NewPCG(1, 2))
				load := map[string]int{}
				var inflight []Target
				hotHome := ""
				onHome := 0
				for i := range 3000 {
					prefix := rng.Uint64() | 1
					if rng.IntN(2) == 0 {
						prefix = 0xC0FFEE // the shared system prompt
					}
					ts := f.Select(nil, Request{Model: "llama", PrefixHash: prefix})
					f.Begin(ts[0])
					inflight = append(inflight, ts[0])
					load[ts[0].Cluster]++
					if prefix == 0xC0FFEE {
						if hotHome == "" {
							hotHome = ts[0].Cluster
						}
						if ts[0].Cluster == hotHome {
							onHome++
						}
					}
					L := float64(len(inflight))
					for name, n := range load {
						limit := max(math.Ceil(lf*L*capOf[name]/total), floor*capOf[name])
						if float64(n) > limit {
							t.Fatalf("after %d assignments %s holds %d, above max(⌈%v·%v·%v/%v⌉, %v·%v) = %v",
								i+1, name, n, lf, L, capOf[name], total, floor, capOf[name], limit)
						}
					}
					// Requests finish at random, so loads go down as well as up.
					if len(inflight) > 200 {
						j := rng.IntN(len(inflight))
						done := inflight[j]
						inflight = append(inflight[:j], inflight[j+1:]...)
						f.End(done, Success)
						load[done.Cluster]--
					}
				}
				t.Logf("the hot prefix's home %s took %d of its requests; final loads %v", hotHome, onHome, load)
				if onHome == 0 {
					t.Error("the hot prefix never reached its home")
				}
			})
		})
	}
}

func TestEjectionAndGradualReadmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// "a" sorts first, so whenever it is admitted it is the primary.
		f := newFleet(t, Config{Weights: Weights{KVHeadroom: 1}},
			pool("us-east-1", "a", "llama"), pool("us-east-1", "b", "llama"))
		refresh := func() {
			for _, n := range []string{"a", "b"} {
				d := pool("us-east-1", n, "llama")
				d.Version = uint64(time.Now().UnixNano())
				f.Digests().Put(d)
			}
		}
		fail := func(n int) {
			for range n {
				ts := f.Select(nil, Request{Model: "llama"})
				for _, tg := range ts {
					if tg.Cluster == "a" {
						f.Begin(tg)
						f.End(tg, Failure)
					}
				}
			}
		}
		primaryShare := func() float64 {
			n := 0
			for range 1000 {
				if f.Select(nil, Request{Model: "llama"})[0].Cluster == "a" {
					n++
				}
			}
			return float64(n) / 1000
		}

		fail(4)
		if st := f.Status()[0]; st.Ejected {
			t.Fatal("ejected after 4 consecutive failures; threshold is 5")
		}
		fail(1)
		st := f.Status()[0]
		if !st.Ejected || st.Ejections != 1 {
			t.Fatalf("after 5 consecutive failures: %+v, want ejected once", st)
		}
		if got := names(f.Select(nil, Request{Model: "llama"})); fmt.Sprint(got) != "[b]" {
			t.Errorf("while ejected Select = %v, want [b]", got)
		}

		time.Sleep(2 * time.Second) // BaseEjection: the ramp starts at 10%
		rampStart := time.Now()
		for _, c := range []struct {
			after time.Duration
			want  float64
		}{{0, 0.1}, {time.Second, 0.2}, {2 * time.Second, 0.4}, {3 * time.Second, 0.8}, {4 * time.Second, 1}} {
			time.Sleep(time.Until(rampStart.Add(c.after)))
			refresh()
			if got := primaryShare(); math.Abs(got-c.want) > 0.01 {
				t.Errorf("%v into readmission: share = %.3f, want %.2f", c.after, got, c.want)
			}
		}
		if st := f.Status()[0]; st.Ejected || st.ReadmitShare != 1 {
			t.Errorf("after the ramp: %+v, want fully readmitted", st)
		}

		// Ejected again: the backoff doubles, and a failure during the ramp
		// ejects at once.
		fail(5)
		time.Sleep(4*time.Second - time.Nanosecond)
		refresh()
		if st := f.Status()[0]; !st.Ejected {
			t.Errorf("second ejection ended before 2×BaseEjection: %+v", st)
		}
		time.Sleep(time.Nanosecond)
		if st := f.Status()[0]; st.Ejected || st.Ejections != 2 {
			t.Errorf("second ejection: %+v, want over after 4s", st)
		}
		ts := f.Select(nil, Request{Model: "llama"})
		a := ts[len(ts)-1] // on the ramp "a" is usually behind "b"
		if a.Cluster != "a" {
			a = ts[0]
		}
		f.Begin(a)
		f.End(a, Failure)
		if st := f.Status()[0]; !st.Ejected || st.Ejections != 3 || time.Until(st.EjectedUntil) != 8*time.Second {
			t.Errorf("one failure on the ramp: %+v, want a third ejection of 8s", st)
		}

		// The backoff is forgotten after EjectionMemory without ejections.
		time.Sleep(8*time.Second + 6*time.Minute)
		refresh()
		fail(5)
		if st := f.Status()[0]; time.Until(st.EjectedUntil) != 2*time.Second {
			t.Errorf("after 6 quiet minutes the ejection lasts %v, want BaseEjection 2s again", time.Until(st.EjectedUntil))
		}
	})
}

func TestEjectionByFailureRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t, Config{}, pool("us-east-1", "a", "llama"), pool("us-east-1", "b", "llama"))
		var a Target
		for _, tg := range f.Select(nil, Request{Model: "llama"}) {
			if tg.Cluster == "a" {
				a = tg
			}
		}
		// Alternate failures and successes: never 5 in a row, but half
		// fail; after MinRequests (20) the rate threshold (0.5) ejects.
		for i := range 19 {
			f.Begin(a)
			f.End(a, Result(i%2))
		}
		if f.Status()[0].Ejected {
			t.Fatal("ejected before MinRequests")
		}
		f.Begin(a)
		f.End(a, Failure)
		if !f.Status()[0].Ejected {
			t.Fatalf("10 of 20 failed and not ejected: %+v", f.Status()[0])
		}

		// 429s say nothing about health.
		g := newFleet(t, Config{}, pool("us-east-1", "a", "llama"))
		ga := g.Select(nil, Request{Model: "llama"})[0]
		for range 100 {
			g.Begin(ga)
			g.End(ga, Overloaded)
		}
		if g.Status()[0].Ejected {
			t.Error("ejected for 429s")
		}
		if g.Status()[0].InFlight != 0 {
			t.Errorf("in flight = %d after balanced Begin/End", g.Status()[0].InFlight)
		}
	})
}

func TestAllEjectedStillServes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t, Config{}, pool("us-east-1", "a", "llama"), pool("eu-west-1", "b", "llama"))
		for _, tg := range f.Select(nil, Request{Model: "llama"}) {
			for range 5 {
				f.Begin(tg)
				f.End(tg, Failure)
			}
		}
		got := names(f.Select(nil, Request{Model: "llama"}))
		if fmt.Sprint(got) != "[a b]" {
			t.Errorf("with every cluster ejected Select = %v, want both as a last resort, nearest first", got)
		}
	})
}

func TestRetryBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t, Config{})
		b := f.Retries()
		for range 100 {
			b.Request()
		}
		allowed := 0
		for range 100 {
			if b.Retry() {
				allowed++
			}
		}
		if allowed != 23 { // 20% of 100, plus MinRetries 3
			t.Errorf("allowed %d retries after 100 requests, want 23", allowed)
		}
		// The window slides: ten seconds later the old requests and
		// retries no longer count.
		time.Sleep(10 * time.Second)
		if !b.Retry() {
			t.Error("no retry allowed in a fresh window (MinRetries)")
		}
		for range 3 {
			b.Retry()
		}
		if b.Retry() {
			t.Error("more than MinRetries allowed with no requests")
		}
		// Half the window later, half the buckets have rolled over.
		for range 50 {
			b.Request()
		}
		time.Sleep(5 * time.Second)
		for range 50 {
			b.Request()
		}
		n := 0
		for b.Retry() {
			n++
		}
		// The window now holds 100 requests and the 3 earlier retries:
		// 20% of 100 + 3 − 3 = 20 more.
		if n != 20 {
			t.Errorf("retries allowed in the mixed window: %d, want 20", n)
		}
	})
}

func TestUpdateKeepsClusterState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{LocalRegion: "us-east-1", Clusters: []Cluster{{Region: "us-east-1", Name: "a", Tier1: "http://a"}}}
		f, err := NewFleet(cfg)
		if err != nil {
			t.Fatal(err)
		}
		f.Digests().Put(pool("us-east-1", "a", "llama"))
		a := f.Select(nil, Request{Model: "llama"})[0]
		f.Begin(a)
		cfg.Weights = Weights{QueueDepth: 1}
		cfg.Clusters = append(cfg.Clusters, Cluster{Region: "us-east-1", Name: "b", Tier1: "http://b"})
		if err := f.Update(cfg); err != nil {
			t.Fatal(err)
		}
		if st := f.Status(); len(st) != 2 || st[0].InFlight != 1 {
			t.Errorf("after Update: %+v, want a's in-flight request kept and b added", st)
		}
		// A shorter age bound applies to the digests already held.
		time.Sleep(3 * time.Second)
		if len(f.Select(nil, Request{Model: "llama"})) != 1 {
			t.Fatal("3 s old digest not usable under the default 5 s bound")
		}
		cfg.DigestMaxAge = 2 * time.Second
		if err := f.Update(cfg); err != nil {
			t.Fatal(err)
		}
		if got := f.Select(nil, Request{Model: "llama"}); len(got) != 0 {
			t.Errorf("3 s old digest still used after DigestMaxAge became 2 s: %v", names(got))
		}
		if _, ok := f.Digests().Get(Key{"us-east-1", "a", "llama-pool"}); ok {
			t.Error("store still serves the digest beyond the new age bound")
		}
		if err := f.Update(Config{LocalRegion: "x", LoadFactor: 0.5}); err == nil {
			t.Error("Update accepted a load factor below 1")
		}
	})
}

func TestConfigErrors(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no local region":   {},
		"load factor < 1":   {LocalRegion: "r", LoadFactor: 0.9},
		"negative weight":   {LocalRegion: "r", Weights: Weights{KVHeadroom: -1}},
		"NaN weight":        {LocalRegion: "r", Weights: Weights{ErrorRate: math.NaN()}},
		"duplicate cluster": {LocalRegion: "r", Clusters: []Cluster{{Region: "r", Name: "a"}, {Region: "r", Name: "a"}}},
		"unnamed cluster":   {LocalRegion: "r", Clusters: []Cluster{{Region: "r"}}},
		"readmit share > 1": {LocalRegion: "r", Outlier: OutlierConfig{ReadmitShare: 2}},
		"max < base":        {LocalRegion: "r", Outlier: OutlierConfig{BaseEjection: time.Minute, MaxEjection: time.Second}},
		"bad rtt":           {LocalRegion: "r", RTTs: []RegionRTT{{A: "r", RTT: time.Second}}},
	} {
		if _, err := NewFleet(cfg); err == nil {
			t.Errorf("%s: NewFleet succeeded", name)
		}
	}
}

func TestSelectDoesNotAllocate(t *testing.T) {
	f := benchFleet(t, 12)
	dst := make([]Target, 0, 3) // MaxTargets: enough whatever the clusters
	req := Request{Model: "llama", PrefixHash: 0x1234}
	if n := testing.AllocsPerRun(1000, func() {
		req.PrefixHash++
		dst = f.Select(dst, req)
		f.Begin(dst[0])
		f.End(dst[0], Success)
	}); n != 0 {
		t.Errorf("Select+Begin+End allocates %v times per call", n)
	}
}

// benchFleet has n clusters over three Regions, all serving "llama" with
// varied load, digests fresh for an hour of real time.
func benchFleet(tb testing.TB, n int) *Fleet {
	regions := []string{"us-east-1", "eu-west-1", "ap-south-1"}
	var ds []Digest
	for i := range n {
		d := pool(regions[i%3], fmt.Sprintf("c%02d", i), "llama")
		d.QueueTotal, d.KVMean = i%5, float64(i%7)/10
		ds = append(ds, d)
	}
	return newFleet(tb, Config{DigestMaxAge: time.Hour, RTTs: []RegionRTT{
		{"us-east-1", "eu-west-1", 80 * time.Millisecond}, {"us-east-1", "ap-south-1", 190 * time.Millisecond}}}, ds...)
}

func BenchmarkSelect(b *testing.B) {
	for _, n := range []int{6, 30} {
		for _, prefix := range []bool{true, false} {
			b.Run(fmt.Sprintf("clusters=%d/prefix=%v", n, prefix), func(b *testing.B) { benchSelect(b, n, prefix, true) })
		}
	}
}

// benchSelect measures Select over benchFleet(n), with a new prefix hash
// for every request when prefix, each choice begun and ended when settle.
func benchSelect(b *testing.B, n int, prefix, settle bool) {
	f := benchFleet(b, n)
	dst := make([]Target, 0, 3)
	req := Request{Model: "llama"}
	b.ReportAllocs()
	cpu0 := testkit.CPUTime()
	for i := 0; b.Loop(); i++ {
		if prefix {
			req.PrefixHash = uint64(i)*0x9E3779B97F4A7C15 | 1
		}
		dst = f.Select(dst, req)
		if settle {
			f.Begin(dst[0])
			f.End(dst[0], Success)
		}
	}
	reportCPU(b, cpu0)
}

// BenchmarkSelectOnly is Select alone (no Begin/End): one clock read, the
// view lookup, admission, the home set and the ring walk.
func BenchmarkSelectOnly(b *testing.B) {
	for _, n := range []int{6, 30} {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) { benchSelect(b, n, true, false) })
	}
}

func BenchmarkSelectParallel(b *testing.B) {
	f := benchFleet(b, 6)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]Target, 0, 8)
		req := Request{Model: "llama"}
		i := uint64(0)
		for pb.Next() {
			i++
			req.PrefixHash = i*0x9E3779B97F4A7C15 | 1
			dst = f.Select(dst, req)
			f.Begin(dst[0])
			f.End(dst[0], Success)
		}
	})
}

// BenchmarkClock is the baseline for BenchmarkSelect: Select and End each
// read the clock once, and on some virtual machines that read dominates.
func BenchmarkClock(b *testing.B) {
	var sink int64
	cpu0 := testkit.CPUTime()
	for b.Loop() {
		sink += time.Now().UnixNano()
	}
	reportCPU(b, cpu0)
	_ = sink
}

// reportCPU adds the process CPU time per operation since cpu0.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	if c := testkit.CPUTime(); c > 0 && b.N > 0 {
		b.ReportMetric(float64(c-cpu0)/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkPutDigest is the background cost of one digest from a Tier-1
// feed or a peer: validate, encode, store, publish hook, and the rebuild of
// Select's view, with 50 clusters × 3 models known.
func BenchmarkPutDigest(b *testing.B) {
	regions := []string{"us-east-1", "eu-west-1", "ap-south-1"}
	var ds []Digest
	for i := range 50 {
		for _, m := range []string{"llama", "mistral", "qwen"} {
			ds = append(ds, pool(regions[i%3], fmt.Sprintf("c%02d", i), m))
		}
	}
	f := newFleet(b, Config{DigestMaxAge: time.Hour}, ds...)
	b.ReportAllocs()
	cpu0 := testkit.CPUTime()
	for i := 0; b.Loop(); i++ {
		d := ds[i%len(ds)]
		d.Version = uint64(i + 2)
		d.QueueTotal = i % 9
		if ok, err := f.Digests().Put(d); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
	reportCPU(b, cpu0)
}

func TestOwnErrorRateLowersScore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// "a" sorts first and wins ties; this Tier-2 sees 30% of its
		// requests to "a" fail (below the ejection rate), which Tier-1's
		// digest does not show.
		f := newFleet(t, Config{}, pool("us-east-1", "a", "llama"), pool("us-east-1", "b", "llama"))
		a := f.Select(nil, Request{Model: "llama"})[0]
		if a.Cluster != "a" {
			t.Fatalf("primary %s, want a", a.Cluster)
		}
		for i := range 20 {
			f.Begin(a)
			r := Success
			if i%10 < 3 {
				r = Failure
			}
			f.End(a, r)
		}
		if f.Status()[0].Ejected {
			t.Fatal("30% failures ejected the cluster")
		}
		d := pool("us-east-1", "a", "llama")
		d.Version = 2
		f.Digests().Put(d)
		got := f.Select(nil, Request{Model: "llama"})
		if got[0].Cluster != "b" || got[1].Score >= got[0].Score {
			t.Errorf("after 30%% own failures on a: %v (scores %.3f, %.3f), want b first", names(got), got[0].Score, got[1].Score)
		}
	})
}

// TestRegionOutageFailover drives 200 requests/s through Select, failover
// and the retry budget while every cluster of the local Region fails (connect
// errors before the first byte) after a second of normal traffic. No
// request may fail while the other Region serves, and within 100 ms new
// requests must stop choosing the dead Region as primary, except the
// readmission probes after each ejection.
func TestRegionOutageFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ds []Digest
		for _, c := range []struct{ region, name string }{
			{"us-east-1", "use1-a"}, {"us-east-1", "use1-b"}, {"eu-west-1", "euw1-a"}, {"eu-west-1", "euw1-b"},
		} {
			ds = append(ds, pool(c.region, c.name, "llama"))
		}
		f := newFleet(t, Config{RTTs: []RegionRTT{{"us-east-1", "eu-west-1", 80 * time.Millisecond}}}, ds...)
		refresh := func() { // the feeds keep digests fresh (a dead Tier-1's feed would stop)
			for _, d := range ds {
				d.Produced, d.Version = time.Now(), uint64(time.Now().UnixNano())
				f.Digests().Put(d)
			}
		}
		outage := false
		dead := func(region string) bool { return outage && region == "us-east-1" }
		var failed, deadPrimaries, probes int
		buf := make([]Target, 0, 3)
		var start time.Time
		for i := range 2200 { // 1 s healthy, then 10 s of outage, at 200 requests/s
			if i%100 == 0 {
				refresh()
			}
			if i == 200 {
				outage, start = true, time.Now()
			}
			elapsed := time.Since(start)
			f.Retries().Request()
			ts := f.Select(buf, Request{Model: "llama", PrefixHash: uint64(i)*0x9E3779B97F4A7C15 | 1})
			if dead(ts[0].Region) && outage && elapsed > 100*time.Millisecond {
				if st := f.Status(); st[2].ReadmitShare < 1 || st[3].ReadmitShare < 1 {
					probes++ // a readmitted cluster's share
				} else {
					deadPrimaries++
				}
			}
			served := false
			for j, tg := range ts {
				if j > 0 && !f.Retries().Retry() {
					break
				}
				f.Begin(tg)
				if dead(tg.Region) {
					f.End(tg, Failure)
					continue
				}
				f.End(tg, Success)
				served = true
				break
			}
			if !served {
				failed++
			}
			time.Sleep(5 * time.Millisecond)
		}
		if failed != 0 {
			t.Errorf("%d requests failed although eu-west-1 was healthy", failed)
		}
		if deadPrimaries != 0 {
			t.Errorf("%d requests chose the dead Region as primary after 100 ms outside readmission probes", deadPrimaries)
		}
		st := f.Status()
		t.Logf("readmission probes to the dead Region over 10 s: %d of 2000 requests; ejections of use1-a, use1-b: %d, %d",
			probes, st[2].Ejections, st[3].Ejections)
	})
}

// EachDigest lists what Digests lists of one model's pools (by base model
// or adapter, clusters outside the topology and pools without pods
// included), in the same order, and stops listing a digest when the store
// would stop holding it fresh, without a rebuild.
func TestEachDigestMatchesDigests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lora := pool("eu-west-1", "b", "llama")
		lora.Adapters = []string{"claims"}
		empty := pool("us-east-1", "c", "llama")
		empty.ReadyPods, empty.TotalPods = 0, 0
		stranger := pool("ap-south-1", "z", "llama") // no such cluster in the topology
		f := newFleet(t, Config{Clusters: []Cluster{{Region: "us-east-1", Name: "a", Tier1: "http://a"},
			{Region: "eu-west-1", Name: "b", Tier1: "http://b"}, {Region: "us-east-1", Name: "c", Tier1: "http://c"}}},
			pool("us-east-1", "a", "llama"), lora, empty, pool("us-east-1", "a", "mistral"))
		if ok, err := f.Digests().Put(stranger); !ok || err != nil {
			t.Fatalf("Put(stranger) = %v, %v", ok, err)
		}
		each := func(model string) []string {
			var out []string
			f.EachDigest(model, func(d *Digest) { out = append(out, d.Key().String()) })
			return out
		}
		listed := func(model string) []string {
			var out []string
			for _, d := range f.Digests().Digests() {
				if d.Model == model || slices.Contains(d.Adapters, model) {
					out = append(out, d.Key().String())
				}
			}
			return out
		}
		for _, m := range []string{"llama", "claims", "mistral", "none"} {
			if got, want := each(m), listed(m); !slices.Equal(got, want) {
				t.Errorf("EachDigest(%q) = %v, Digests lists %v", m, got, want)
			}
		}
		if n := len(each("llama")); n != 4 {
			t.Fatalf("EachDigest(llama) lists %d pools, want 4", n)
		}
		time.Sleep(5*time.Second + time.Nanosecond) // past DigestMaxAge: every digest goes stale
		if got := each("llama"); len(got) != 0 {
			t.Errorf("after DigestMaxAge, EachDigest(llama) = %v, want none (Digests lists %v)", got, listed("llama"))
		}
	})
}

// BenchmarkModelDigests is how admission reads one model's pools per
// request: EachDigest against filtering Digests (which copies and sorts
// every pool of every model), for 30 clusters serving 10 models.
func BenchmarkModelDigests(b *testing.B) {
	regions := []string{"us-east-1", "eu-west-1", "ap-south-1"}
	var ds []Digest
	for i := range 30 {
		for m := range 10 {
			ds = append(ds, pool(regions[i%3], fmt.Sprintf("c%02d", i), fmt.Sprintf("model-%d", m)))
		}
	}
	f := newFleet(b, Config{DigestMaxAge: time.Hour}, ds...)
	b.Run("EachDigest", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n := 0
			f.EachDigest("model-3", func(d *Digest) { n += d.ReadyPods })
			if n != 30*4 {
				b.Fatalf("%d ready pods", n)
			}
		}
	})
	b.Run("Digests", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n := 0
			for _, d := range f.Digests().Digests() {
				if d.Model == "model-3" || slices.Contains(d.Adapters, "model-3") {
					n += d.ReadyPods
				}
			}
			if n != 30*4 {
				b.Fatalf("%d ready pods", n)
			}
		}
	})
}

// A cluster whose pods are known not to serve a request is never chosen
// for it, not even as a fallback: an adapter its pods have not registered,
// a request longer than every ready pod's max_model_len. Pods that say
// nothing (MaxModelLen 0) are taken at the configuration's word; and a
// request no cluster takes is sent anyway, for the pods to answer.
func TestSelectServesOnlyWhatPodsCan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		full := pool("us-east-1", "full", "llama")
		full.Adapters, full.ServedAdapters, full.MaxModelLen = []string{"a1", "a2"}, []string{"a1", "a2"}, 131072
		lost := pool("us-east-1", "lost", "llama") // lost a2, shorter context, and the most headroom
		lost.Adapters, lost.ServedAdapters, lost.MaxModelLen = []string{"a1", "a2"}, []string{"a1"}, 32768
		unknown := pool("eu-west-1", "unknown", "llama")
		unknown.Adapters = []string{"a1", "a2"}
		full.Headroom, unknown.Headroom = 0.5, 0.4
		f := newFleet(t, Config{}, full, lost, unknown)
		for _, tc := range []struct {
			name string
			req  Request
			want []string
		}{
			{"base model, short", Request{Model: "llama", Tokens: 1000}, []string{"lost", "unknown", "full"}},
			{"adapter some pods lost", Request{Model: "a2"}, []string{"full", "unknown"}},
			{"adapter all have", Request{Model: "a1"}, []string{"lost", "unknown", "full"}},
			{"longer than one cluster takes", Request{Model: "llama", Tokens: 40000}, []string{"full", "unknown"}},
			{"longer than any known takes", Request{Model: "llama", Tokens: 200000}, []string{"unknown"}},
		} {
			got := names(f.Select(nil, tc.req))
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(got, want) {
				t.Errorf("%s: Select = %v, want the clusters %v", tc.name, got, want)
			}
		}
		f = newFleet(t, Config{}, full, lost)
		if got := names(f.Select(nil, Request{Model: "llama", Tokens: 200000})); len(got) != 2 {
			t.Errorf("a request no cluster takes: Select = %v, want both clusters (the pods answer)", got)
		}
	})
}
