package tier1

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/request"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// newPool returns a pool with one endpoint per Metrics, named p0, p1, …,
// scraped at t0 unless ScrapedAt is set.
func newPool(ms ...Metrics) (*Pool, []*Endpoint) {
	pool := NewPool()
	eps := make([]*Endpoint, len(ms))
	for i, m := range ms {
		eps[i] = pool.Add(fmt.Sprintf("p%d", i), fmt.Sprintf("10.0.0.%d:8000", i))
		if m.ScrapedAt.IsZero() {
			m.ScrapedAt = t0
		}
		eps[i].SetMetrics(&m)
	}
	return pool, eps
}

// seeded returns a deterministic Rand for Options.
func seeded(seed uint64) func() uint64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed))
	return func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Uint64()
	}
}

func newSched(t testing.TB, pool *Pool, scoring string, w config.Weights, picker string) *Scheduler {
	t.Helper()
	p := config.DefaultPolicy()
	p.Weights, p.Scoring = w, scoring
	if picker != "" {
		p.Picker = picker
	}
	s, err := NewScheduler(pool, config.Scheduler{Name: "s", ModelName: "llama"}, p, Options{Rand: seeded(1)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func parts(t *testing.T, s *Scheduler, req *Request, scorer int) []float64 {
	t.Helper()
	scores, err := s.Explain(req, t0)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(scores))
	for i, sc := range scores {
		out[i] = sc.Parts[scorer]
	}
	return out
}

func near(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-9 {
			return false
		}
	}
	return true
}

// TestGIEScorers checks GIE mode against GIE's own scorer semantics and
// test vectors (queue_test.go, kvcache, lora_affinity, prefix plugin).
func TestGIEScorers(t *testing.T) {
	all := config.Weights{Queue: 1, KVCache: 1, Prefix: 1, LoraAffinity: 1, RunningRequests: 1}
	tests := []struct {
		name   string
		pods   []Metrics
		req    Request
		scorer int
		want   []float64
	}{
		{"queue different", []Metrics{{Waiting: 10}, {Waiting: 5}, {Waiting: 0}}, Request{}, Queue, []float64{0, 0.5, 1}},
		{"queue same", []Metrics{{Waiting: 5}, {Waiting: 5}}, Request{}, Queue, []float64{1, 1}},
		{"queue zero", []Metrics{{}, {}}, Request{}, Queue, []float64{1, 1}},
		{"running", []Metrics{{Running: 40}, {Running: 10}, {Running: 20}}, Request{}, RunningRequests, []float64{0, 1, 2.0 / 3}},
		{"kv", []Metrics{{KVCacheUsage: 0.2}, {KVCacheUsage: 0.9}, {KVCacheUsage: 1}}, Request{}, KVCache, []float64{0.8, 0.1, 0}},
		{"lora steps", []Metrics{
			{RunningAdapters: []string{"a"}, MaxLoRA: 1},                                      // running
			{RunningAdapters: []string{"b"}, MaxLoRA: 4},                                      // free slot
			{RunningAdapters: []string{"b", "c"}, WaitingAdapters: []string{"a"}, MaxLoRA: 3}, // waiting, full
			{RunningAdapters: []string{"b", "c"}, MaxLoRA: 2},                                 // must evict
		}, Request{Model: "llama", Adapter: "a"}, LoraAffinity, []float64{1, 0.8, 0.6, 0}},
		{"lora base model", []Metrics{{MaxLoRA: 2}, {MaxLoRA: 0}}, Request{Model: "llama"}, LoraAffinity, []float64{0.8, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool, _ := newPool(tt.pods...)
			s := newSched(t, pool, config.ScoringGIE, all, "")
			if got := parts(t, s, &tt.req, tt.scorer); !near(got, tt.want) {
				t.Fatalf("%s = %v, want %v", ScorerNames[tt.scorer], got, tt.want)
			}
		})
	}
}

func TestGIEPrefixScorer(t *testing.T) {
	pool, eps := newPool(Metrics{}, Metrics{}, Metrics{})
	s := newSched(t, pool, config.ScoringGIE, config.GIEWeights(), "")
	body, err := request.Parse([]byte(`{"model":"llama","prompt":"`+strings.Repeat("abcdefgh", 64)+`"}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	full := &Request{Model: "llama"}
	s.Prepare(full, body)
	if len(full.Hashes) != 8 {
		t.Fatalf("%d hashes for 512 characters, want 8", len(full.Hashes))
	}
	half := &Request{Model: "llama", Hashes: full.Hashes[:4]}
	s.Dispatch(eps[0], half, t0)
	s.Dispatch(eps[1], full, t0)
	if got := parts(t, s, full, Prefix); !near(got, []float64{0.5, 1, 0}) {
		t.Fatalf("prefix = %v, want [0.5 1 0]", got)
	}
	// GIE seeds with the target model: an adapter's prompt matches nothing
	// the base model was sent.
	ad := &Request{Model: "llama", Adapter: "a"}
	s.Prepare(ad, body)
	if got := parts(t, s, ad, Prefix); !near(got, []float64{0, 0, 0}) {
		t.Fatalf("adapter prefix = %v, want zeros", got)
	}
}

func TestGIEBlockSizeAutoTune(t *testing.T) {
	pool, _ := newPool(Metrics{BlockSize: 32})
	s := newSched(t, pool, config.ScoringGIE, config.GIEWeights(), "")
	body, _ := request.Parse([]byte(`{"model":"llama","prompt":"`+strings.Repeat("x", 1024)+`"}`), 0)
	req := &Request{Model: "llama"}
	s.Prepare(req, body)
	if len(req.Hashes) != 8 { // 32 tokens × 4 characters = 128-character blocks
		t.Fatalf("GIE: %d blocks, want 8", len(req.Hashes))
	}
	m := newSched(t, pool, config.ScoringMeridian, config.DefaultWeights(), "")
	m.Prepare(req, body)
	if len(req.Hashes) != 16 { // the configured 64
		t.Fatalf("Meridian: %d blocks, want 16", len(req.Hashes))
	}
}

func TestMeridianScorers(t *testing.T) {
	all := config.Weights{Queue: 1, KVCache: 1, Prefix: 1, LoraAffinity: 1, RunningRequests: 1, PredictedLatency: 1, LRU: 1}
	tests := []struct {
		name   string
		pods   []Metrics
		scorer int
		want   []float64
	}{
		// 1/(1+w/4): absolute, so one pod's value does not depend on the others.
		{"queue", []Metrics{{Waiting: 0}, {Waiting: 4}, {Waiting: 12}}, Queue, []float64{1, 0.5, 0.25}},
		{"queue alone", []Metrics{{Waiting: 4}}, Queue, []float64{0.5}},
		{"running", []Metrics{{Running: 0}, {Running: 64}}, RunningRequests, []float64{1, 0.5}},
		{"kv convex", []Metrics{{KVCacheUsage: 0}, {KVCacheUsage: 0.5}, {KVCacheUsage: 1}}, KVCache, []float64{1, 0.75, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool, _ := newPool(tt.pods...)
			s := newSched(t, pool, config.ScoringMeridian, all, "")
			if got := parts(t, s, &Request{Model: "llama"}, tt.scorer); !near(got, tt.want) {
				t.Fatalf("%s = %v, want %v", ScorerNames[tt.scorer], got, tt.want)
			}
		})
	}
}

func TestMeridianAccountsForDispatchesSinceScrape(t *testing.T) {
	pool, eps := newPool(Metrics{Waiting: 0, GPUBlocks: 1000, BlockSize: 16}, Metrics{Waiting: 0, GPUBlocks: 1000, BlockSize: 16})
	s := newSched(t, pool, config.ScoringMeridian, config.DefaultWeights(), "")
	req := &Request{Model: "llama", PromptTokens: 4000}
	for range 4 {
		s.Dispatch(eps[0], req, t0)
	}
	q := parts(t, s, req, Queue)
	kv := parts(t, s, req, KVCache)
	if !(q[0] < q[1]) || !(kv[0] < kv[1]) {
		t.Fatalf("4 dispatches since the scrape do not lower pod 0: queue %v kv %v", q, kv)
	}
	// A new scrape replaces the estimate.
	eps[0].SetMetrics(&Metrics{ScrapedAt: t0, GPUBlocks: 1000, BlockSize: 16})
	if q := parts(t, s, req, Queue); q[0] != q[1] {
		t.Fatalf("after a scrape: queue %v, want equal", q)
	}
}

// TestLoadScoresMonotone: more load never raises a load score.
func TestLoadScoresMonotone(t *testing.T) {
	all := config.Weights{Queue: 1, KVCache: 1, Prefix: 1, LoraAffinity: 1, RunningRequests: 1, PredictedLatency: 1, LRU: 1}
	r := rand.New(rand.NewPCG(5, 6))
	for _, mode := range []string{config.ScoringMeridian, config.ScoringGIE} {
		for trial := range 200 {
			base := Metrics{Waiting: r.IntN(20), Running: r.IntN(100), KVCacheUsage: r.Float64() * 0.9, GPUBlocks: 2000, BlockSize: 16, ScrapedAt: t0}
			more := base
			switch trial % 3 {
			case 0:
				more.Waiting += 1 + r.IntN(5)
			case 1:
				more.Running += 1 + r.IntN(20)
			case 2:
				more.KVCacheUsage = min(1, more.KVCacheUsage+0.01+r.Float64()*0.1)
			}
			// A third pod keeps GIE's min–max range from collapsing.
			pool, eps := newPool(base, more, Metrics{Waiting: 40, Running: 200, KVCacheUsage: 1})
			s := newSched(t, pool, mode, all, "")
			req := &Request{Model: "llama", PromptTokens: 500, Hashes: seq(1, 8)}
			s.Dispatch(eps[0], &Request{Model: "llama", Hashes: seq(1, 8)}, t0.Add(-time.Hour))
			s.Dispatch(eps[1], &Request{Model: "llama", Hashes: seq(1, 8)}, t0.Add(-time.Hour))
			eps[0].SetMetrics(&base)
			eps[1].SetMetrics(&more)
			scores, err := s.Explain(req, t0)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range []int{Queue, RunningRequests, KVCache, Prefix, PredictedLatency} {
				if scores[1].Parts[k] > scores[0].Parts[k]+1e-12 {
					t.Fatalf("%s: %s rose with load: %v → %v (%+v vs %+v)", mode, ScorerNames[k],
						scores[0].Parts[k], scores[1].Parts[k], base, more)
				}
			}
		}
	}
}

// TestZeroWeightRemovesInfluence: the total is the weighted sum of the
// other scorers whatever the zero-weighted one says, and giving it a weight
// does change some total (so the check can fail).
func TestZeroWeightRemovesInfluence(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, mode := range []string{config.ScoringMeridian, config.ScoringGIE} {
		for k := range numScorers {
			changed := false
			for range 20 {
				ms := make([]Metrics, 4)
				for i := range ms {
					ms[i] = Metrics{Waiting: r.IntN(10), Running: r.IntN(50), KVCacheUsage: r.Float64(),
						RunningAdapters: []string{fmt.Sprint("a", r.IntN(3))}, MaxLoRA: 1 + r.IntN(2), LoRAReported: true}
				}
				pool, eps := newPool(ms...)
				w := config.Weights{Queue: 1 + r.Float64(), KVCache: r.Float64(), Prefix: 2, LoraAffinity: r.Float64(),
					RunningRequests: r.Float64(), PredictedLatency: r.Float64(), LRU: r.Float64()}
				ws := [numScorers]*float64{&w.Queue, &w.KVCache, &w.Prefix, &w.LoraAffinity, &w.RunningRequests, &w.PredictedLatency, &w.LRU}
				with := *ws[k]
				*ws[k] = 0
				s := newSched(t, pool, mode, w, "")
				for i := range eps {
					s.Dispatch(eps[i], &Request{Model: "llama", Hashes: seq(1, r.IntN(8))}, t0.Add(time.Duration(r.IntN(100))*time.Second))
				}
				req := &Request{Model: "llama", Adapter: "a1", Hashes: seq(1+100*r.IntN(2), 8), PromptTokens: 300}
				scores, err := s.Explain(req, t0.Add(time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				for _, sc := range scores {
					want := 0.0
					for j, v := range sc.Parts {
						want += *ws[j] * v
					}
					if math.Abs(sc.Total-want) > 1e-9 {
						t.Fatalf("%s: weight %s = 0: total %v, want %v", mode, ScorerNames[k], sc.Total, want)
					}
					if sc.Parts[k] != scores[0].Parts[k] && with > 0 {
						changed = true
					}
				}
			}
			if !changed {
				t.Errorf("%s: scorer %s never varied; the property was not exercised", mode, ScorerNames[k])
			}
		}
	}
}

func TestFullPrefixHitBeatsNone(t *testing.T) {
	for _, mode := range []string{config.ScoringMeridian, config.ScoringGIE} {
		for _, w := range []config.Weights{config.DefaultWeights(), {Prefix: 1}, {Prefix: 1, Queue: 1, KVCache: 1, RunningRequests: 1, PredictedLatency: 1, LRU: 1, LoraAffinity: 1}} {
			m := Metrics{Waiting: 1, Running: 5, KVCacheUsage: 0.3}
			pool, eps := newPool(m, m, m, m)
			s := newSched(t, pool, mode, w, "")
			req := &Request{Model: "llama", Hashes: seq(1, 16), PromptTokens: 256}
			s.Dispatch(eps[2], req, t0.Add(-time.Minute))
			for _, ep := range eps {
				ep.SetMetrics(&Metrics{Waiting: 1, Running: 5, KVCacheUsage: 0.3, ScrapedAt: t0})
			}
			for range 20 {
				got, err := s.Schedule(req, t0, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got[0] != eps[2] {
					t.Fatalf("%s %+v: picked %s, want p2 (full prefix hit)", mode, w, got[0].ID)
				}
			}
		}
	}
}

// TestNoHerdingBetweenScrapes: a burst arriving between two scrapes, when
// one pod looked idle at the last scrape. GIE sends the whole burst there;
// Meridian spreads it once the idle pod has its share.
func TestNoHerdingBetweenScrapes(t *testing.T) {
	run := func(mode string) map[string]int {
		ms := []Metrics{{Waiting: 0, Running: 10, KVCacheUsage: 0.3}}
		for range 3 {
			ms = append(ms, Metrics{Waiting: 2, Running: 10, KVCacheUsage: 0.3})
		}
		pool, _ := newPool(ms...)
		w := config.DefaultWeights()
		if mode == config.ScoringGIE {
			w = config.GIEWeights()
		}
		s := newSched(t, pool, mode, w, "")
		got := map[string]int{}
		for i := range 24 {
			req := &Request{Model: "llama", Hashes: []uint64{uint64(1000 + i)}, PromptTokens: 200}
			eps, err := s.Schedule(req, t0, nil)
			if err != nil {
				t.Fatal(err)
			}
			s.Dispatch(eps[0], req, t0)
			got[eps[0].ID]++
		}
		return got
	}
	gie, mer := run(config.ScoringGIE), run(config.ScoringMeridian)
	if gie["p0"] != 24 {
		t.Errorf("GIE baseline: %v, expected the whole burst on p0", gie)
	}
	if mer["p0"] > 9 || len(mer) != 4 {
		t.Errorf("Meridian herded: %v", mer)
	}
}

func TestFilters(t *testing.T) {
	stale := t0.Add(-10 * time.Second)
	tests := []struct {
		name    string
		pods    []Metrics
		unready []int
		req     Request
		want    []string // acceptable primaries
		err     error
		caps    []*Capabilities // by pod; nil entries unknown
	}{
		{"stale avoided", []Metrics{{ScrapedAt: stale}, {Waiting: 30}}, nil, Request{}, []string{"p1"}, nil, nil},
		{"all stale fail open", []Metrics{{ScrapedAt: stale, Waiting: 9}, {ScrapedAt: stale}}, nil, Request{}, []string{"p1"}, nil, nil},
		{"unready never", []Metrics{{}, {Waiting: 30}}, []int{0}, Request{}, []string{"p1"}, nil, nil},
		{"none ready", []Metrics{{}}, []int{0}, Request{}, nil, ErrNoEndpoints, nil},
		{"subset", []Metrics{{}, {Waiting: 30}, {}}, nil, Request{Subset: []string{"10.0.0.1:8000"}}, []string{"p1"}, nil, nil},
		{"empty subset", []Metrics{{}}, nil, Request{Subset: []string{}}, nil, ErrNoEndpoints, nil},
		{"subset of nothing known", []Metrics{{}}, nil, Request{Subset: []string{"10.9.9.9:1"}}, nil, ErrNoEndpoints, nil},
		{"adapter needs lora", []Metrics{{LoRAReported: true, MaxLoRA: 0}, {LoRAReported: true, MaxLoRA: 2, Waiting: 30}}, nil,
			Request{Adapter: "a"}, []string{"p1"}, nil, nil},
		{"adapter nowhere", []Metrics{{LoRAReported: true, MaxLoRA: 0}}, nil, Request{Adapter: "a"}, nil, ErrNoCapableEndpoint, nil},
		{"adapter unknown support", []Metrics{{}}, nil, Request{Adapter: "a"}, []string{"p0"}, nil, nil},
		// /v1/models lists registered adapters, not only running ones: the
		// idle pod without the adapter loses to a busy one that has it.
		{"adapter registered elsewhere", []Metrics{{LoRAReported: true, MaxLoRA: 4}, {LoRAReported: true, MaxLoRA: 4, Waiting: 30}}, nil,
			Request{Adapter: "a"}, []string{"p1"}, nil,
			[]*Capabilities{{Models: []string{"llama"}, Adapters: []string{"b"}}, {Models: []string{"llama"}, Adapters: []string{"a"}}}},
		{"adapter registered nowhere", []Metrics{{LoRAReported: true, MaxLoRA: 4}}, nil, Request{Adapter: "a"}, nil, ErrNoCapableEndpoint,
			[]*Capabilities{{Models: []string{"llama"}, Adapters: []string{"b"}}}},
		{"model not served", []Metrics{{}, {Waiting: 30}}, nil, Request{}, []string{"p1"}, nil,
			[]*Capabilities{{Models: []string{"qwen"}}, {Models: []string{"llama"}}}},
		{"too long for the short context", []Metrics{{}, {Waiting: 30}}, nil, Request{PromptTokens: 30000, MaxTokens: 4000}, []string{"p1"}, nil,
			[]*Capabilities{{MaxModelLen: 32768}, {MaxModelLen: 131072}}},
		{"fits the short context", []Metrics{{}, {Waiting: 30}}, nil, Request{PromptTokens: 30000, MaxTokens: 2000}, []string{"p0"}, nil,
			[]*Capabilities{{MaxModelLen: 32768}, {MaxModelLen: 131072}}},
		{"too long everywhere", []Metrics{{}, {}}, nil, Request{PromptTokens: 40000}, nil, ErrContextLength,
			[]*Capabilities{{MaxModelLen: 32768}, {MaxModelLen: 32768}}},
		{"too long beats stale fail-open", []Metrics{{ScrapedAt: stale}, {}}, nil, Request{PromptTokens: 40000}, []string{"p0"}, nil,
			[]*Capabilities{{MaxModelLen: 131072}, {MaxModelLen: 32768}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool, eps := newPool(tt.pods...)
			for _, i := range tt.unready {
				eps[i].SetReady(false)
			}
			for i, c := range tt.caps {
				eps[i].SetCapabilities(c)
			}
			s := newSched(t, pool, config.ScoringMeridian, config.DefaultWeights(), "")
			tt.req.Model = "llama"
			got, err := s.Schedule(&tt.req, t0, nil)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got[0].ID != tt.want[0] {
				t.Fatalf("picked %s, want %v", got[0].ID, tt.want)
			}
		})
	}
	if _, err := newSched(t, NewPool(), config.ScoringMeridian, config.DefaultWeights(), "").Schedule(&Request{}, t0, nil); !errors.Is(err, ErrNoEndpoints) {
		t.Fatalf("empty pool: %v", err)
	}
}

// queueRanking is the decision, as "primary,fallback,…", of a scheduler
// weighing only the queue over pods p0, p1, … with metrics ms.
func queueRanking(t *testing.T, ms ...Metrics) string {
	t.Helper()
	pool, _ := newPool(ms...)
	s := newSched(t, pool, config.ScoringMeridian, config.Weights{Queue: 1}, "")
	got, err := s.Schedule(&Request{Model: "llama"}, t0, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ep := range got {
		ids = append(ids, ep.ID)
	}
	return strings.Join(ids, ",")
}

func TestFallbacksOrdered(t *testing.T) {
	if got := queueRanking(t, Metrics{Waiting: 8}, Metrics{Waiting: 0}, Metrics{Waiting: 4}, Metrics{Waiting: 2}); got != "p1,p3,p2" {
		t.Fatalf("picked %s, want primary p1 then fallbacks p3,p2", got)
	}
}

// TestStaleEndpointsAreLastFallbacks: endpoints avoided for stale metrics
// follow the fresh ones among the fallbacks, so a fresh primary that fails
// is retried on a ready pod. With only the fresh pod as a candidate, a 5xx
// from it reached the caller (tier1/proxy TestFallbackOnFailingPod under
// load: the two good pods had missed a scrape, the failing one had not).
func TestStaleEndpointsAreLastFallbacks(t *testing.T) {
	stale := t0.Add(-10 * time.Second)
	for _, tc := range []struct {
		name string
		pods []Metrics
		want string
	}{
		{"one fresh", []Metrics{{ScrapedAt: stale}, {Waiting: 3}, {ScrapedAt: stale}}, "p1,p0,p2"},
		{"fresh fill the fallbacks", []Metrics{{ScrapedAt: stale}, {Waiting: 3}, {Waiting: 1}, {}, {ScrapedAt: stale}}, "p3,p2,p1"},
		{"two fresh", []Metrics{{ScrapedAt: stale}, {Waiting: 3}, {Waiting: 1}}, "p2,p1,p0"},
		{"all stale", []Metrics{{ScrapedAt: stale, Waiting: 3}, {ScrapedAt: stale}}, "p1,p0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := queueRanking(t, tc.pods...); got != tc.want {
				t.Fatalf("picked %s, want %s", got, tc.want)
			}
		})
	}
}

func TestPickers(t *testing.T) {
	// Ties break at random.
	pool, _ := newPool(Metrics{}, Metrics{}, Metrics{}, Metrics{})
	s := newSched(t, pool, config.ScoringGIE, config.GIEWeights(), config.PickerMaxScore)
	seen := map[string]int{}
	for range 400 {
		got, _ := s.Schedule(&Request{Model: "llama"}, t0, nil)
		seen[got[0].ID]++
	}
	for _, id := range []string{"p0", "p1", "p2", "p3"} {
		if seen[id] < 60 {
			t.Errorf("max-score tie-break: %v, want each of 4 near 100", seen)
		}
	}
	// Weighted random follows the totals: queue scores 1 and 1/3 (waiting
	// 0 and 8 at QueueHalf 4) → 75% and 25%.
	pool, _ = newPool(Metrics{}, Metrics{Waiting: 8})
	s = newSched(t, pool, config.ScoringMeridian, config.Weights{Queue: 1}, config.PickerWeightedRandom)
	if f := p0Share(t, s); f < 0.72 || f > 0.78 {
		t.Errorf("weighted-random: p0 share %.3f, want 0.75", f)
	}
	s = newSched(t, pool, config.ScoringMeridian, config.Weights{Queue: 1}, config.PickerRandom)
	if f := p0Share(t, s); f < 0.47 || f > 0.53 {
		t.Errorf("random: p0 share %.3f, want 0.5", f)
	}
}

// p0Share is the share of 4,000 decisions of s over two pods that put p0
// first; each decision must rank both pods, each once.
func p0Share(t *testing.T, s *Scheduler) float64 {
	t.Helper()
	n0 := 0
	for range 4000 {
		got, _ := s.Schedule(&Request{Model: "llama"}, t0, nil)
		if len(got) != 2 || got[0] == got[1] {
			t.Fatalf("%v, want both pods once", got)
		}
		if got[0].ID == "p0" {
			n0++
		}
	}
	return float64(n0) / 4000
}

func TestLatencyModelLearnsSlowerPod(t *testing.T) {
	m := Metrics{Waiting: 1, Running: 8}
	pool, eps := newPool(m, m)
	s := newSched(t, pool, config.ScoringMeridian, config.Weights{PredictedLatency: 1}, "")
	learnTTFTs(s, eps, 9, func(pod, tokens int) float64 {
		// Pod 1 is a card half as fast: the same work takes twice as long.
		return (0.03 + float64(tokens)/8000) * float64(1+pod)
	})
	req := &Request{Model: "llama", PromptTokens: 2000}
	x := latencyFeatures(1, 8, 2000, 0)
	p0, p1 := eps[0].latency.Load().predict(&x, true), eps[1].latency.Load().predict(&x, true)
	want0 := 0.03 + 2000.0/8000
	if math.Abs(p0-want0) > 0.05 || math.Abs(p1-2*want0) > 0.1 {
		t.Fatalf("predicted %.3fs and %.3fs, want about %.3fs and %.3fs", p0, p1, want0, 2*want0)
	}
	got, err := s.Schedule(req, t0, nil)
	if err != nil || got[0] != eps[0] {
		t.Fatalf("picked %v (%v), want the faster p0", got, err)
	}
	if n := eps[0].latency.Load().observations(); n != 300 {
		t.Fatalf("%d observations, want 300", n)
	}
}

// learnTTFTs dispatches 300 rounds of one request to each pod of eps, with
// prompts of 200 to 3,199 tokens drawn from seed, each answered after
// ttft(pod, tokens) seconds (pod indexes eps), the pods staying at 1
// waiting and 8 running.
func learnTTFTs(s *Scheduler, eps []*Endpoint, seed uint64, ttft func(pod, tokens int) float64) {
	r := rand.New(rand.NewPCG(seed, seed))
	for range 300 {
		for j, ep := range eps {
			tokens := 200 + r.IntN(3000)
			tk := s.Dispatch(ep, &Request{Model: "llama", PromptTokens: tokens}, t0)
			tk.FirstToken(time.Duration(ttft(j, tokens) * float64(time.Second)))
			tk.Done()
			ep.SetMetrics(&Metrics{Waiting: 1, Running: 8, ScrapedAt: t0})
		}
	}
}

// TestPrefillSecondsNeverFree: a pod whose TTFTs happened to be shorter
// for longer prompts (noise on a loaded host) learns a negative prefill
// coefficient; PrefillSeconds prices its prefill with the prior's instead
// of as free, and a pod that learned a positive one with its own. On a
// loaded machine the hygiene report of cmd/meridian's
// TestDiagnosePromptsEndToEnd priced 40,336 lost tokens at 0 s this way.
func TestPrefillSecondsNeverFree(t *testing.T) {
	m := Metrics{Waiting: 1, Running: 8}
	pool, eps := newPool(m, m)
	s := newSched(t, pool, config.ScoringMeridian, config.Weights{PredictedLatency: 1}, "")
	learnTTFTs(s, eps, 3, func(pod, tokens int) float64 {
		if pod == 0 {
			return 0.5 - float64(tokens)/10000 // pod 0: faster the longer the prompt
		}
		return 0.03 + float64(tokens)/8000 // pod 1: 8k tokens/s prefill
	})
	if c := eps[0].latency.Load().coef.Load(); c == nil || c[3] >= 0 {
		t.Fatalf("pod 0 learned %v, want a negative prefill coefficient", c)
	}
	if got, want := PrefillSeconds(eps[:1], 1000), latencyPrior[3]; got != want {
		t.Errorf("pod 0 prices 1000 tokens at %.4fs, want the prior's %.4fs", got, want)
	}
	own := PrefillSeconds(eps[1:], 1000)
	if math.Abs(own-0.125) > 0.01 {
		t.Errorf("pod 1 prices 1000 tokens at %.4fs, want its learned 0.125s", own)
	}
	if got, want := PrefillSeconds(eps, 1000), (latencyPrior[3]+own)/2; math.Abs(got-want) > 1e-12 {
		t.Errorf("the pool prices 1000 tokens at %.4fs, want the mean %.4fs", got, want)
	}
}

// TestLatencyModelQueueNeverSpeedsUp feeds a model TTFTs that fall as the
// queue and the prefill backlog grow (what a fit over collinear features
// can make of noisy ones): the learned coefficients of waiting and backlog
// stay non-negative, so sending a pod more never makes it look faster and
// a burst cannot herd onto it.
func TestLatencyModelQueueNeverSpeedsUp(t *testing.T) {
	var m latencyModel
	r := rand.New(rand.NewPCG(4, 4))
	for range 500 {
		waiting, backlog := float64(r.IntN(9)), float64(r.IntN(20000))
		x := latencyFeatures(waiting, 8, 1000, backlog)
		m.observe(&x, max(0.05, 3-0.3*waiting-backlog/10000))
	}
	c := m.coef.Load()
	if c == nil || c[1] < 0 || c[4] < 0 {
		t.Fatalf("learned %v, want waiting (θ1) and backlog (θ4) coefficients ≥ 0", c)
	}
	idle, queued := latencyFeatures(0, 8, 1000, 0), latencyFeatures(8, 8, 1000, 20000)
	if p0, p1 := m.predict(&idle, true), m.predict(&queued, true); p1 < p0 {
		t.Errorf("predicted %.3fs behind 8 requests and 20k tokens, %.3fs with none ahead: want no less", p1, p0)
	}
}

func TestMeridianLoraAffinity(t *testing.T) {
	pool, eps := newPool(
		Metrics{LoRAReported: true, MaxLoRA: 2, RunningAdapters: []string{"hot1", "hot2"}}, // must evict a hot one
		Metrics{LoRAReported: true, MaxLoRA: 2, RunningAdapters: []string{"hot1"}},         // free slot
		Metrics{LoRAReported: true, MaxLoRA: 2, RunningAdapters: []string{"hot2", "cold"}}, // must evict, a cold one
		Metrics{LoRAReported: true, MaxLoRA: 2, RunningAdapters: []string{"tail", "hot1"}}, // running
	)
	s := newSched(t, pool, config.ScoringMeridian, config.Weights{LoraAffinity: 1}, "")
	_ = eps
	for i := range 100 {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		s.pool.lora.record("hot1", now.UnixNano())
		s.pool.lora.record("hot2", now.UnixNano())
		if i%50 == 0 {
			s.pool.lora.record("cold", now.UnixNano())
			s.pool.lora.record("tail", now.UnixNano())
		}
	}
	got := parts(t, s, &Request{Model: "llama", Adapter: "tail"}, LoraAffinity)
	if !(got[3] == 1 && got[1] == 0.8 && got[2] > 0 && got[2] <= 0.4 && got[0] == 0) {
		t.Fatalf("loraAffinity = %v, want running 1 > free 0.8 > evict-cold (0, 0.4] > evict-hot 0", got)
	}
	// A dispatch since the scrape takes the free slot.
	s.Dispatch(eps[1], &Request{Model: "llama", Adapter: "other"}, t0)
	if got := parts(t, s, &Request{Model: "llama", Adapter: "tail"}, LoraAffinity); got[1] >= 0.8 {
		t.Fatalf("free slot still free after a dispatch of another adapter: %v", got)
	}
	if got := parts(t, s, &Request{Model: "llama", Adapter: "other"}, LoraAffinity); got[1] != 0.9 {
		t.Fatalf("adapter dispatched since the scrape: %v, want 0.9 on p1", got)
	}
	if got := parts(t, s, &Request{Model: "llama"}, LoraAffinity); !near(got, []float64{1, 1, 1, 1}) {
		t.Fatalf("base model: %v, want no preference", got)
	}
}

func TestLRUSpreadsColdPrompts(t *testing.T) {
	pool, eps := newPool(Metrics{}, Metrics{}, Metrics{})
	s := newSched(t, pool, config.ScoringMeridian, config.Weights{LRU: 1}, "")
	for i, ep := range eps {
		s.Dispatch(ep, &Request{Model: "llama"}, t0.Add(time.Duration(i)*time.Second))
	}
	if got := parts(t, s, &Request{Model: "llama", Hashes: seq(50, 4)}, LRU); !near(got, []float64{1, 0.5, 0}) {
		t.Fatalf("cold prompt: lru = %v, want [1 0.5 0]", got)
	}
	s.Dispatch(eps[2], &Request{Model: "llama", Hashes: seq(50, 4)}, t0.Add(time.Minute))
	if got := parts(t, s, &Request{Model: "llama", Hashes: seq(50, 4)}, LRU); !near(got, []float64{1, 1, 1}) {
		t.Fatalf("prompt with a hit: lru = %v, want neutral", got)
	}
}

func TestPrefixEventsBetweenReplicas(t *testing.T) {
	// Two replicas, each with its own pool for the same pods.
	poolA, epsA := newPool(Metrics{}, Metrics{})
	poolB, _ := newPool(Metrics{}, Metrics{})
	a := newSched(t, poolA, config.ScoringMeridian, config.DefaultWeights(), "")
	b := newSched(t, poolB, config.ScoringMeridian, config.DefaultWeights(), "")
	req := &Request{Model: "llama", Hashes: seq(1, 10)}
	a.Dispatch(epsA[1], req, t0)
	ev := PrefixEvent{Endpoint: epsA[1].ID, Stamp: t0.UnixNano(), Hashes: req.Hashes}
	for range 2 { // idempotent
		if !b.ApplyPrefixEvent(ev) {
			t.Fatal("event for a known endpoint dropped")
		}
	}
	if got := parts(t, b, req, Prefix); !near(got, []float64{0, 1}) {
		t.Fatalf("replica B prefix = %v, want [0 1]", got)
	}
	if b.ApplyPrefixEvent(PrefixEvent{Endpoint: "gone", Hashes: req.Hashes}) {
		t.Fatal("event for an unknown endpoint applied")
	}
	if !a.SharesPrefixIndex() || newSched(t, poolA, config.ScoringGIE, config.GIEWeights(), "").SharesPrefixIndex() {
		t.Fatal("SharesPrefixIndex: want Meridian true, GIE false")
	}
}

func TestNewSchedulerRejectsBadPolicy(t *testing.T) {
	p := config.DefaultPolicy()
	cases := map[string]func(*config.SchedulerPolicy){
		"scoring": func(p *config.SchedulerPolicy) { p.Scoring = "best" },
		"picker":  func(p *config.SchedulerPolicy) { p.Picker = "first" },
		"weight":  func(p *config.SchedulerPolicy) { p.Weights.Queue = -1 },
		"nan":     func(p *config.SchedulerPolicy) { p.Weights.LRU = math.NaN() },
	}
	for name, mod := range cases {
		q := p
		mod(&q)
		if _, err := NewScheduler(NewPool(), config.Scheduler{Name: "x"}, q, Options{}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := NewScheduler(nil, config.Scheduler{Name: "x"}, p, Options{}); err == nil {
		t.Error("nil pool: no error")
	}
}

func TestPoolMembership(t *testing.T) {
	pool, eps := newPool(Metrics{}, Metrics{})
	s := newSched(t, pool, config.ScoringMeridian, config.DefaultWeights(), "")
	s.Dispatch(eps[0], &Request{Model: "llama", Hashes: seq(1, 4)}, t0)
	if pool.Add("p0", eps[0].Address) != eps[0] {
		t.Fatal("Add of an existing endpoint replaced it")
	}
	pool.Remove("p0")
	if pool.Endpoint("p0") != nil || len(pool.Endpoints()) != 1 || pool.PrefixIndex().Len() != 0 {
		t.Fatal("Remove left state behind")
	}
	ep := pool.Add("p9", "10.0.0.9:8000")
	if ep.slot != eps[0].slot {
		t.Fatalf("slot %d not reused (want %d)", ep.slot, eps[0].slot)
	}
	// A dispatch decided before a removal must not leave entries in the
	// slot's next owner.
	gone := eps[1]
	pool.Remove("p1")
	reborn := pool.Add("p1b", "10.0.0.21:8000")
	s.Dispatch(gone, &Request{Model: "llama", Hashes: seq(1, 4)}, t0)
	if pool.PrefixIndex().Len() != 0 || reborn.slot != gone.slot {
		t.Fatalf("a removed endpoint's dispatch wrote %d entries (slots %d, %d)", pool.PrefixIndex().Len(), reborn.slot, gone.slot)
	}
	moved := pool.Add("p9", "10.0.1.1:8000")
	if moved == ep || moved.Address != "10.0.1.1:8000" || pool.Endpoint("p9") != moved {
		t.Fatal("a new address did not make a new endpoint")
	}
}

// TestNaNMetricsDoNotWin: a server exporting NaN (Prometheus allows it)
// scores as the worst on that scorer instead of poisoning the total.
func TestNaNMetricsDoNotWin(t *testing.T) {
	for _, mode := range []string{config.ScoringMeridian, config.ScoringGIE} {
		pool, _ := newPool(Metrics{KVCacheUsage: math.NaN()}, Metrics{KVCacheUsage: 0.5})
		s := newSched(t, pool, mode, config.Weights{KVCache: 1}, "")
		for range 10 {
			got, err := s.Schedule(&Request{Model: "llama"}, t0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got[0].ID != "p1" {
				t.Fatalf("%s: picked %s, want p1 over the NaN pod", mode, got[0].ID)
			}
		}
		scores, _ := s.Explain(&Request{Model: "llama"}, t0)
		if math.IsNaN(scores[0].Total) {
			t.Fatalf("%s: NaN total", mode)
		}
	}
}

// TestLatencyModelTriesUnobservedPod: a pod that has shown one slow TTFT
// must not look faster than an idle pod that has shown none (the prior
// alone priced the untried pod's prefill above the slow pod's learned
// figure for a short prompt, so the first pod to answer kept every
// request). An unobserved pod is optimistic until it is tried.
func TestLatencyModelTriesUnobservedPod(t *testing.T) {
	pool, eps := newPool(Metrics{}, Metrics{})
	s := newSched(t, pool, config.ScoringMeridian, config.Weights{PredictedLatency: 1}, "")
	hashes := make([]uint64, 32)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	// p0, a slow card, has answered the shared system prompt once and
	// holds it in its cache.
	tk := s.Dispatch(eps[0], &Request{Model: "llama", PromptTokens: 2100, Hashes: hashes}, t0)
	tk.FirstToken(800 * time.Millisecond)
	tk.Done()
	for _, ep := range eps {
		ep.SetMetrics(&Metrics{ScrapedAt: t0})
	}
	got, err := s.Schedule(&Request{Model: "llama", PromptTokens: 2100, Hashes: hashes}, t0, nil)
	if err != nil || got[0] != eps[1] {
		t.Fatalf("picked %v (%v), want the untried p1", got, err)
	}
}

// TestPeerBacklogCountsInPrediction: the prefill queued on a pod by
// another replica weighs in this replica's predicted latency as its own
// would, until the other replica reports its first token; without it two
// replicas each see half of what is queued ahead (docs/tuning.md, "Two
// replicas").
func TestPeerBacklogCountsInPrediction(t *testing.T) {
	poolA, epsA := newPool(Metrics{Running: 4}, Metrics{Running: 4})
	poolB, epsB := newPool(Metrics{Running: 4}, Metrics{Running: 4})
	a := newSched(t, poolA, config.ScoringMeridian, config.Weights{PredictedLatency: 1}, "")
	b := newSched(t, poolB, config.ScoringMeridian, config.Weights{PredictedLatency: 1}, "")
	publish := func(ep *Endpoint) {
		t.Helper()
		if !b.ApplyPeerInFlight("a", ep.ID, ep.LoadReport()) {
			t.Fatalf("report on %s dropped", ep.ID)
		}
	}
	// Replica A sends one request to each pod: a long prompt to p0, a
	// short one to p1. B is told the same in-flight count on both.
	long := a.Dispatch(epsA[0], &Request{Model: "llama", PromptTokens: 20000}, t0)
	a.Dispatch(epsA[1], &Request{Model: "llama", PromptTokens: 200}, t0)
	if got := epsA[0].LoadReport(); got != (PeerLoad{InFlight: 1, Backlog: 20000}) {
		t.Fatalf("A's report on p0 = %+v, want 1 request and 20000 tokens of backlog", got)
	}
	publish(epsA[0])
	publish(epsA[1])
	req := &Request{Model: "llama", PromptTokens: 1000}
	if got := parts(t, b, req, PredictedLatency); !(got[0] < got[1]) {
		t.Fatalf("B's predicted-latency scores %v: A's 20000 queued tokens on p0 do not count", got)
	}
	if got, err := b.Schedule(req, t0, nil); err != nil || got[0] != epsB[1] {
		t.Fatalf("B picked %v (%v), want p1, with less prefill queued", got, err)
	}
	// A's first token takes the long prompt out of its backlog; its report
	// (the request still in flight) puts p0, with nothing queued, ahead of
	// p1 and its 200 tokens.
	long.FirstToken(time.Second)
	publish(epsA[0])
	if got := parts(t, b, req, PredictedLatency); !(got[0] > got[1]) {
		t.Fatalf("after A's first token: scores %v, want p0 ahead", got)
	}
	if epsB[0].PeerBacklog() != 0 || epsB[1].PeerBacklog() != 200 || epsB[0].PeerInFlight() != 1 {
		t.Fatalf("B's peer load: p0 %d tokens %d requests, p1 %d tokens; want 0, 1, 200",
			epsB[0].PeerBacklog(), epsB[0].PeerInFlight(), epsB[1].PeerBacklog())
	}
	// A replica that stops no longer counts.
	poolB.ForgetPeer("a")
	if epsB[1].PeerBacklog() != 0 || epsB[1].PeerInFlight() != 0 {
		t.Fatalf("after ForgetPeer: p1 %d tokens %d requests, want none", epsB[1].PeerBacklog(), epsB[1].PeerInFlight())
	}
}

// TestPeerLoadBounded: a peer's figures are clamped, so bad reports can
// neither overflow the sums nor make a pod look lighter than idle; a
// report on an endpoint re-added since (a new server under the same ID)
// starts from nothing.
func TestPeerLoadBounded(t *testing.T) {
	pool, eps := newPool(Metrics{})
	s := newSched(t, pool, config.ScoringMeridian, config.DefaultWeights(), "")
	huge := PeerLoad{InFlight: math.MaxInt64, Backlog: math.MaxInt64}
	s.ApplyPeerInFlight("bad-1", eps[0].ID, huge)
	s.ApplyPeerInFlight("bad-2", eps[0].ID, huge)
	if eps[0].PeerInFlight() != 2*maxPeerLoad || eps[0].PeerBacklog() != 2*maxPeerLoad {
		t.Fatalf("two huge reports: %d requests %d tokens, want each 2×%d", eps[0].PeerInFlight(), eps[0].PeerBacklog(), maxPeerLoad)
	}
	s.ApplyPeerInFlight("bad-1", eps[0].ID, PeerLoad{InFlight: -5, Backlog: math.MinInt64})
	s.ApplyPeerInFlight("bad-2", eps[0].ID, PeerLoad{InFlight: -5, Backlog: math.MinInt64})
	if eps[0].PeerInFlight() != 0 || eps[0].PeerBacklog() != 0 {
		t.Fatalf("negative reports: %d requests %d tokens, want 0", eps[0].PeerInFlight(), eps[0].PeerBacklog())
	}

	s.ApplyPeerInFlight("a", "p0", PeerLoad{InFlight: 5, Backlog: 100})
	pool.Add("p0", "10.0.0.99:8000") // a new address: a new server
	ep := pool.Endpoint("p0")
	if ep == eps[0] {
		t.Fatal("re-adding with a new address kept the endpoint")
	}
	s.ApplyPeerInFlight("a", "p0", PeerLoad{InFlight: 2, Backlog: 40})
	if ep.PeerInFlight() != 2 || ep.PeerBacklog() != 40 {
		t.Fatalf("re-added endpoint: %d requests %d tokens, want A's latest 2 and 40", ep.PeerInFlight(), ep.PeerBacklog())
	}
	pool.ForgetPeer("a")
	if ep.PeerInFlight() != 0 || ep.PeerBacklog() != 0 {
		t.Fatalf("after ForgetPeer: %d requests %d tokens, want 0", ep.PeerInFlight(), ep.PeerBacklog())
	}
}

// TestLatencyClassShared: endpoints of one class predict with one model,
// so a first token seen on one reprices the others of its class and no
// other; re-setting the class keeps what was learned, and leaving the
// class gives the endpoint a model of its own.
func TestLatencyClassShared(t *testing.T) {
	pool := NewPool()
	a, b, c := pool.Add("a", "a:1"), pool.Add("b", "b:1"), pool.Add("c", "c:1")
	pool.SetClass(a, "h100")
	pool.SetClass(b, "h100")
	pool.SetClass(c, "a10g")
	x := latencyFeatures(2, 8, 4000, 0)
	for range 50 {
		a.latency.Load().observe(&x, 3.0) // a's first tokens: slower than the prior says
	}
	pa, pb, pc := a.latency.Load().predict(&x, true), b.latency.Load().predict(&x, true), c.latency.Load().predict(&x, true)
	if pa != pb {
		t.Fatalf("a and b share the class h100 but predict %.3f and %.3f", pa, pb)
	}
	if pa < 2 || pc == pa {
		t.Fatalf("a learned %.3f s (want near 3), c of another class %.3f (want its own)", pa, pc)
	}
	pool.SetClass(b, "h100")
	if got := b.latency.Load().predict(&x, true); got != pa {
		t.Fatalf("setting b's class again lost what it learned: %.3f, was %.3f", got, pa)
	}
	pool.SetClass(b, "")
	if got := b.latency.Load().predict(&x, true); got == pa || pool.Class(b) != "" {
		t.Fatalf("b left its class but predicts %.3f (class %q)", got, pool.Class(b))
	}
	if pool.Class(a) != "h100" || pool.Class(c) != "a10g" {
		t.Fatalf("classes a %q, c %q", pool.Class(a), pool.Class(c))
	}
}

// TestLatencyClassesBounded: a replaced pod of a class joins the class's
// model, and a label whose values churn (a new value for every new pod)
// leaves at most a few classes beyond the endpoints.
func TestLatencyClassesBounded(t *testing.T) {
	pool := NewPool()
	a := pool.Add("a", "a:1")
	pool.SetClass(a, "h100")
	x := latencyFeatures(0, 8, 1000, 0)
	for range 50 {
		a.latency.Load().observe(&x, 2.0)
	}
	pool.Remove("a")
	a2 := pool.Add("a2", "a2:1")
	pool.SetClass(a2, "h100")
	if got := a2.latency.Load().predict(&x, true); got < 1.5 {
		t.Fatalf("a replaced pod of class h100 predicts %.3f s, not the class's learned ~2 s", got)
	}
	for i := range 1000 {
		id := fmt.Sprint("churn-", i)
		ep := pool.Add(id, id+":1")
		pool.SetClass(ep, id)
		pool.Remove(id)
	}
	// Pruning runs when a class is created with more than endpoints + 8
	// classes; each churned pod was a second endpoint when its class was.
	if n := len(pool.classes); n > len(pool.Endpoints())+10 {
		t.Fatalf("%d classes kept for %d endpoints after 1,000 pods with unique labels", n, len(pool.Endpoints()))
	}
	if pool.classes["h100"] == nil || pool.classes["h100"].members != 1 {
		t.Fatalf("class h100, in use by a2, was pruned or miscounted: %+v", pool.classes["h100"])
	}
}

// TestWholeAnswersTrainOnlyUntilStreamed: a non-streamed answer's first
// byte is its last, so its time (decode included) trains the latency
// model only while no streamed first token has been seen. A pool whose
// callers never stream still learns which pod answers sooner; once one
// streams, whole answers stop teaching that prefill costs what an answer
// does.
func TestWholeAnswersTrainOnlyUntilStreamed(t *testing.T) {
	m := Metrics{Waiting: 1, Running: 8}
	pool, eps := newPool(m, m)
	s := newSched(t, pool, config.ScoringMeridian, config.Weights{PredictedLatency: 1}, "")
	x := latencyFeatures(1, 8, 2000, 0)
	// Only whole answers: pod 1 answers in twice pod 0's time, and learns it.
	for range 200 {
		for j, ep := range eps {
			tk := s.Dispatch(ep, &Request{Model: "llama", PromptTokens: 2000}, t0)
			tk.Answered(time.Duration(float64(1+j) * 3 * float64(time.Second)))
			tk.Done()
			if tk.ep.backlog.Load() != 0 {
				t.Fatalf("an answered request is still in %s's prefill backlog", ep.ID)
			}
		}
	}
	p0, p1 := eps[0].latency.Load().predict(&x, true), eps[1].latency.Load().predict(&x, true)
	if p0 < 2 || p1 < 1.5*p0 {
		t.Fatalf("from whole answers alone: predicted %.2f s and %.2f s, want about 3 and 6", p0, p1)
	}
	// Pod 0 streams once: its first token at 0.3 s.
	tk := s.Dispatch(eps[0], &Request{Model: "llama", PromptTokens: 2000}, t0)
	tk.FirstToken(300 * time.Millisecond)
	tk.Done()
	before := *eps[0].latency.Load().coef.Load()
	for range 50 {
		tk := s.Dispatch(eps[0], &Request{Model: "llama", PromptTokens: 2000}, t0)
		tk.Answered(30 * time.Second) // a long non-streamed answer
		tk.Done()
	}
	if after := *eps[0].latency.Load().coef.Load(); after != before {
		t.Fatalf("whole answers after a streamed first token moved pod 0's model: %v → %v", before, after)
	}
}

// Prepare hashes a chat without building its text; PrepareText builds the
// text its caller reads (the prompt sketch) and must give the same
// hashes, and the text must be the head those hashes cover.
func TestPrepareAndPrepareTextAgree(t *testing.T) {
	pool, _ := newPool(Metrics{})
	for _, size := range []int{64, 48} { // a multiple of 32 (hashed in place) and not
		policy := config.DefaultPolicy()
		policy.BlockSize, policy.MaxPrefixBlocks = size, 20
		s, err := NewScheduler(pool, config.Scheduler{Name: "s", ModelName: "m"}, policy, Options{})
		if err != nil {
			t.Fatal(err)
		}
		body := &request.Body{Model: "m", Kind: request.Chat, CacheSalt: "salt", Messages: []request.Message{
			{Role: "system", Content: strings.Repeat("be brief. ", 50)},
			{Role: "user", Parts: []request.Part{{Type: "text", Text: strings.Repeat("question ", 40)}, {Type: "image_url", ImageURL: "http://x/y.png"}}},
			{Role: "user", Content: strings.Repeat("more ", 300)}}}
		a, b := &Request{Model: "m"}, &Request{Model: "m"}
		s.Prepare(a, body)
		text := s.PrepareText(b, body, nil)
		if len(a.Hashes) != 20 || fmt.Sprint(a.Hashes) != fmt.Sprint(b.Hashes) || a.PromptTokens != b.PromptTokens {
			t.Fatalf("block %d: Prepare %d hashes, PrepareText %d (tokens %d, %d)", size, len(a.Hashes), len(b.Hashes), a.PromptTokens, b.PromptTokens)
		}
		if want := request.AppendPromptHead(nil, body, size*20); string(text) != string(want) {
			t.Fatalf("block %d: PrepareText's text is %d bytes, want the %d-byte head", size, len(text), len(want))
		}
	}
}
