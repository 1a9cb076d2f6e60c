package tier1

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/request"
)

// allWeights turns on all seven scorers.
var allWeights = config.Weights{Queue: 2, KVCache: 2, Prefix: 3, LoraAffinity: 1, RunningRequests: 1, PredictedLatency: 1, LRU: 1}

// benchFixture is a pool of P scraped pods whose prefix index already
// holds prompts, and a prompt of B blocks whose first 16 blocks (a shared
// system prompt) are cached on every pod, its first half on a few and all
// of it on one, so matching walks real holder chains.
type benchFixture struct {
	s    *Scheduler
	body *request.Body
}

var (
	fixturesMu sync.Mutex
	fixtures   = map[string]*benchFixture{}
)

// newBenchFixture returns the fixture for these parameters, built once per
// test binary: benchmarks run their function several times while sizing
// b.N, and building a 512-pod index each time would dominate.
func newBenchFixture(tb testing.TB, mode string, pods, blocks int) *benchFixture {
	return memo(&fixturesMu, fixtures, fmt.Sprint(mode, pods, blocks), func() *benchFixture {
		return buildBenchFixture(tb, mode, pods, blocks)
	})
}

// memo returns cache[key], built by build the first time it is asked for.
func memo[F any](mu *sync.Mutex, cache map[string]*F, key string, build func() *F) *F {
	mu.Lock()
	defer mu.Unlock()
	if f := cache[key]; f != nil {
		return f
	}
	f := build()
	cache[key] = f
	return f
}

func buildBenchFixture(tb testing.TB, mode string, pods, blocks int) *benchFixture {
	r := rand.New(rand.NewPCG(uint64(pods), uint64(blocks)))
	ms := make([]Metrics, pods)
	for i := range ms {
		ms[i] = Metrics{Waiting: r.IntN(6), Running: r.IntN(60), KVCacheUsage: r.Float64() * 0.8,
			RunningAdapters: []string{fmt.Sprint("a", r.IntN(8))}, MaxLoRA: 2, LoRAReported: true,
			BlockSize: 16, GPUBlocks: 20000}
	}
	pool, eps := newPool(ms...)
	policy := config.DefaultPolicy()
	policy.Weights, policy.Scoring = allWeights, mode
	s, err := NewScheduler(pool, config.Scheduler{Name: "bench", ModelName: "llama"}, policy, Options{})
	if err != nil {
		tb.Fatal(err)
	}
	prompt := strings.Repeat("You are a careful assistant; answer briefly. ", 64*blocks/45+2)[:64*blocks]
	body := &request.Body{Model: "llama", Kind: request.Completion, Prompt: prompt}
	req := &Request{Model: "llama"}
	s.Prepare(req, body)
	// Other traffic: 8 unrelated prompts per pod.
	for i, ep := range eps {
		for j := range 8 {
			other := &Request{Model: "llama", Hashes: seq(1_000_000*(i+1)+10_000*j, blocks), PromptTokens: 16 * blocks}
			s.Dispatch(ep, other, t0.Add(-time.Minute))
		}
	}
	// Its first 16 blocks (a system prompt) on every pod, so that those
	// blocks have as many holders as there are pods.
	for i, ep := range eps {
		sys := &Request{Model: "llama", Hashes: append(slices.Clone(req.Hashes[:min(16, blocks)]), uint64(i)), PromptTokens: 300}
		s.Dispatch(ep, sys, t0.Add(-time.Minute))
	}
	// Its first half on 4 pods, all of it on one.
	for i := range min(4, pods) {
		half := &Request{Model: "llama", Hashes: req.Hashes[:blocks/2], PromptTokens: 8 * blocks}
		s.Dispatch(eps[i*pods/4], half, t0.Add(-time.Minute))
	}
	s.Dispatch(eps[pods/2], req, t0.Add(-time.Minute))
	for i, ep := range eps {
		ep.SetMetrics(&ms[i]) // resets the dispatch counters
	}
	return &benchFixture{s: s, body: body}
}

// decide is one decision as the data plane makes it: hash the prompt,
// filter, score with all seven scorers, pick a primary and fallbacks.
func (f *benchFixture) decide(req *Request, dst []*Endpoint) ([]*Endpoint, error) {
	req.Model, req.Adapter, req.PromptTokens = "llama", "a1", 0
	f.s.Prepare(req, f.body)
	return f.s.Schedule(req, t0, dst[:0])
}

func BenchmarkSchedule(b *testing.B) {
	for _, mode := range []string{config.ScoringMeridian, config.ScoringGIE} {
		for _, pods := range []int{8, 64, 512} {
			for _, blocks := range []int{16, 256} {
				name := fmt.Sprintf("pods=%d/blocks=%d", pods, blocks)
				if mode == config.ScoringGIE {
					name = "gie/" + name
				}
				b.Run(name, func(b *testing.B) {
					f := newBenchFixture(b, mode, pods, blocks)
					req := &Request{}
					dst := make([]*Endpoint, 0, 8)
					b.ReportAllocs()
					cpu := testkit.StartCPU()
					for b.Loop() {
						var err error
						if dst, err = f.decide(req, dst); err != nil {
							b.Fatal(err)
						}
					}
					cpu.Report(b)
				})
			}
		}
	}
}

func BenchmarkScheduleParallel(b *testing.B) {
	for _, pods := range []int{64, 512} {
		b.Run(fmt.Sprintf("pods=%d/blocks=256", pods), func(b *testing.B) {
			f := newBenchFixture(b, config.ScoringMeridian, pods, 256)
			b.ResetTimer()
			b.ReportAllocs()
			cpu := testkit.StartCPU()
			defer cpu.Report(b)
			b.RunParallel(func(pb *testing.PB) {
				req := &Request{}
				dst := make([]*Endpoint, 0, 8)
				for pb.Next() {
					var err error
					if dst, err = f.decide(req, dst); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkDispatch is the bookkeeping after a decision: in-flight
// accounting, the latency features and the prefix index update.
//
// Each request is a 256-block prompt whose first 16 blocks are one of 8
// shared system prompts and whose other 240 are new, sent to a random one
// of 64 pods, so that holder chains and evictions are those of a busy
// index. Drawing the 240 new hashes (about 1 µs) is inside the loop.
func BenchmarkDispatch(b *testing.B) {
	f := buildBenchFixture(b, config.ScoringMeridian, 64, 256)
	eps := f.s.pool.Endpoints()
	r := rand.New(rand.NewPCG(1, 1))
	req := &Request{Model: "llama", Hashes: make([]uint64, 256), PromptTokens: 4096}
	b.ReportAllocs()
	cpu := testkit.StartCPU()
	i := 0
	for b.Loop() {
		sys := uint64(r.IntN(8)) << 48
		for j := range req.Hashes {
			if j < 16 {
				req.Hashes[j] = sys | uint64(j)
			} else {
				req.Hashes[j] = r.Uint64()
			}
		}
		tk := f.s.Dispatch(eps[r.IntN(len(eps))], req, t0.Add(time.Duration(i)*time.Millisecond))
		tk.Done()
		i++
	}
	cpu.Report(b)
}

// TestScheduleAllocs pins the allocations of one decision (hashing,
// scoring with all seven scorers, picking) at 64 pods and 256 blocks.
func TestScheduleAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	for _, mode := range []string{config.ScoringMeridian, config.ScoringGIE} {
		f := newBenchFixture(t, mode, 64, 256)
		req := &Request{}
		dst := make([]*Endpoint, 0, 8)
		if _, err := f.decide(req, dst); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(200, func() {
			if _, err := f.decide(req, dst); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 2 {
			t.Errorf("%s: %.1f allocations per decision, want ≤ 2", mode, allocs)
		}
		if len(req.Hashes) != 256 {
			t.Fatalf("%s: %d blocks hashed, want 256", mode, len(req.Hashes))
		}
	}
}

// TestConcurrentUpdatesAndDecisions runs scrapes, decisions with
// dispatches and completions, prefix events from another replica and
// membership changes at once; run it with -race.
func TestConcurrentUpdatesAndDecisions(t *testing.T) {
	ms := make([]Metrics, 16)
	pool, eps := newPool(ms...)
	s := newSched(t, pool, config.ScoringMeridian, allWeights, "")
	body := &request.Body{Model: "llama", Kind: request.Completion, Prompt: strings.Repeat("p", 64*32)}
	var decisions atomic.Int64
	enough := make(chan struct{})
	var once sync.Once
	var stops []func()
	run := func(f func(i int)) { stops = append(stops, testkit.Loop(1, func(_, i int) { f(i) })) }
	run(func(i int) { // scraper
		ep := eps[i%len(eps)]
		ep.SetMetrics(&Metrics{Waiting: i % 7, Running: i % 30, KVCacheUsage: float64(i%10) / 10, ScrapedAt: t0,
			RunningAdapters: []string{"a"}, MaxLoRA: 2, LoRAReported: true, BlockSize: 16, GPUBlocks: 100})
		ep.SetReady(i%13 != 0)
	})
	run(func(i int) { // another replica's events
		s.ApplyPrefixEvent(PrefixEvent{Endpoint: eps[i%len(eps)].ID, Stamp: int64(i), Hashes: seq(i%50, 16)})
	})
	run(func(i int) { // discovery churn
		if i%2 == 0 {
			pool.Add("extra", "10.1.1.1:8000").SetMetrics(&Metrics{ScrapedAt: t0})
		} else {
			pool.Remove("extra")
		}
	})
	for w := range 2 {
		run(func(i int) { // decisions
			req := &Request{Model: "llama", Adapter: []string{"", "a", "b"}[i%3]}
			s.Prepare(req, body)
			got, err := s.Schedule(req, t0.Add(time.Duration(i)), nil)
			if err != nil {
				t.Error(err)
				once.Do(func() { close(enough) })
				return
			}
			tk := s.Dispatch(got[0], req, t0.Add(time.Duration(i)))
			tk.FirstToken(time.Duration(w+1) * time.Millisecond)
			tk.Done()
			_, _ = s.Explain(req, t0)
			if decisions.Add(1) == 400 {
				once.Do(func() { close(enough) })
			}
		})
	}
	<-enough
	for _, stop := range stops {
		stop()
	}
	var inflight int64
	for _, ep := range eps {
		inflight += ep.InFlight()
	}
	if inflight != 0 {
		t.Fatalf("in-flight after every request is done: %d", inflight)
	}
}
