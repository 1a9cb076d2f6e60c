package tier1_test

import (
	"fmt"
	"github.com/meridian-router/meridian/internal/traces"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/trace"
	"github.com/meridian-router/meridian/tier1"
)

// traceBlockTokens is the Mooncake trace's prefix block: one hash id per
// 512 tokens.
const traceBlockTokens = trace.MooncakeBlockTokens

type traced struct {
	at  time.Duration
	req *sim.Request
}

func loadMooncake(t testing.TB, n int) []traced {
	t.Helper()
	f, err := os.Open(traces.Path(traces.Mooncake))
	if err != nil {
		t.Fatalf("open trace: %v", err)
	}
	defer f.Close()
	r := trace.NewMooncake(f)
	var out []traced
	for len(out) < n {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, traced{at: rec.Arrival, req: sim.TraceRequest(rec)})
	}
	return out
}

type replayResult struct {
	p50, p90, p99 time.Duration
	cachedShare   float64 // prompt tokens served from the prefix cache
	maxShare      float64 // largest share of requests one pod received
}

func (r replayResult) String() string {
	return fmt.Sprintf("TTFT p50 %v p90 %v p99 %v, cached %.1f%%, busiest pod %.1f%% of requests",
		r.p50.Round(time.Millisecond), r.p90.Round(time.Millisecond), r.p99.Round(time.Millisecond),
		100*r.cachedShare, 100*r.maxShare)
}

// rngFunc is a seeded random source for Options.Rand (replay is
// single-threaded).
func rngFunc(seed uint64) func() uint64 {
	r := rand.New(rand.NewPCG(seed, seed))
	return r.Uint64
}

// replayMooncake drives the real scheduler in virtual time over simulated
// pods, the way the replay tool does: pods scraped every 50 ms, a decision
// per arrival, Dispatch on the pick, the TTFT reported back.
func replayMooncake(t testing.TB, reqs []traced, gpus []string, scoring string, w config.Weights) replayResult {
	t.Helper()
	e := sim.NewEngine(1)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pool := tier1.NewPool()
	eps := map[*sim.Pod]*tier1.Endpoint{}
	podOf := map[*tier1.Endpoint]*sim.Pod{}
	for i, g := range gpus {
		prof, err := sim.LookupProfile(g)
		if err != nil {
			t.Fatal(err)
		}
		p, err := e.AddPod(sim.PodConfig{Name: fmt.Sprintf("%s-%d", g, i), Profile: prof, Seed: uint64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		ep := pool.Add(p.Name(), fmt.Sprintf("10.0.0.%d:8000", i))
		eps[p], podOf[ep] = ep, p
	}
	scrape := func() {
		for p, ep := range eps {
			m := p.Metrics()
			// The index counts the trace's 512-token blocks: report the
			// cache in those units so that both modes size it alike.
			ep.SetMetrics(&tier1.Metrics{
				Waiting: m.Waiting, Running: m.Running, KVCacheUsage: m.KVCacheUsage,
				BlockSize: traceBlockTokens, GPUBlocks: m.NumGPUBlocks * m.BlockSize / traceBlockTokens,
				ScrapedAt: base.Add(e.Now()),
			})
		}
	}
	scrape()
	e.Every(50*time.Millisecond, scrape)
	policy := config.DefaultPolicy()
	policy.Weights, policy.Scoring = w, scoring
	policy.BlockSize = traceBlockTokens * 4 // characters, at 4 a token
	s, err := tier1.NewScheduler(pool, config.Scheduler{Name: "replay", ModelName: "m"}, policy,
		tier1.Options{Rand: rngFunc(7)})
	if err != nil {
		t.Fatal(err)
	}
	var ttfts []time.Duration
	var cached, prompt int
	per := map[string]int{}
	for _, tr := range reqs {
		e.At(tr.at, func() {
			now := base.Add(e.Now())
			req := &tier1.Request{Model: "m", PromptTokens: tr.req.PromptTokens}
			for _, h := range tr.req.PrefixHashes {
				req.Hashes = append(req.Hashes, h+1) // ids from 0; keep them apart from the zero hash
			}
			picked, err := s.Schedule(req, now, nil)
			if err != nil {
				t.Error(err)
				return
			}
			tk := s.Dispatch(picked[0], req, now)
			per[picked[0].ID]++
			e.Submit(podOf[picked[0]], tr.req, func(o sim.Outcome) {
				if o.Err != nil {
					t.Errorf("request %s: %v", o.Request.ID, o.Err)
					tk.Done()
					return
				}
				tk.FirstToken(o.TTFT())
				tk.Done()
				ttfts = append(ttfts, o.TTFT())
				cached += o.CachedTokens
				prompt += o.Request.PromptTokens
			})
		})
	}
	e.Run()
	slices.Sort(ttfts)
	q := func(f float64) time.Duration { return ttfts[int(f*float64(len(ttfts)-1))] }
	most := 0
	for _, n := range per {
		most = max(most, n)
	}
	return replayResult{p50: q(0.5), p90: q(0.9), p99: q(0.99),
		cachedShare: float64(cached) / float64(prompt), maxShare: float64(most) / float64(len(reqs))}
}

// TestMeridianBeatsGIEOnMooncake replays the Mooncake conversation trace
// (shared system prompts, arrivals in ~3 s bursts) on a mixed fleet of
// four H100 and four A100 pods, at half, its own and 1.5× its rate, once
// with GIE's scoring and once with Meridian's, both with the documented
// default weights (queue 2, kvCache 2, prefix 3). Meridian must have the
// lower median and p99 TTFT at every rate.
func TestMeridianBeatsGIEOnMooncake(t *testing.T) {
	if testing.Short() {
		t.Skip("replays a trace")
	}
	n, rates := 1<<30, []float64{0.5, 1, 1.5} // the whole trace
	if tier1.RaceEnabled {
		n, rates = 800, []float64{1} // the race detector slows the replay tenfold
	}
	trace := loadMooncake(t, n)
	gpus := []string{"h100", "a100", "h100", "a100", "h100", "a100", "h100", "a100"}
	t.Logf("%d requests, 4×H100 + 4×A100", len(trace))
	for _, rate := range rates {
		reqs := make([]traced, len(trace))
		for i, r := range trace {
			reqs[i] = traced{at: time.Duration(float64(r.at) / rate), req: r.req}
		}
		gie := replayMooncake(t, reqs, gpus, config.ScoringGIE, config.GIEWeights())
		mer := replayMooncake(t, reqs, gpus, config.ScoringMeridian, config.DefaultWeights())
		t.Logf("rate ×%.1f GIE scoring:      %v", rate, gie)
		t.Logf("rate ×%.1f Meridian scoring: %v", rate, mer)
		if rate == 1 {
			withLatency := config.DefaultWeights()
			withLatency.PredictedLatency = 2
			lat := replayMooncake(t, reqs, gpus, config.ScoringMeridian, withLatency)
			t.Logf("rate ×%.1f Meridian + predictedLatency 2: %v", rate, lat)
		}
		if mer.p99 >= gie.p99 || mer.p50 >= gie.p50 {
			t.Errorf("rate ×%.1f: Meridian TTFT (p50 %v, p99 %v) not below GIE's (p50 %v, p99 %v)",
				rate, mer.p50, mer.p99, gie.p50, gie.p99)
		}
	}
}
