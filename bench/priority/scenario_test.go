package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/priority"
)

// A short run of the benchmark's scenario: the Gate keeps Standard
// tenants fair and Critical unharmed at 3× overload where the GIE
// baseline does neither. Deterministic (virtual time, fixed seed).
func TestScenario(t *testing.T) {
	capacity, err := Calibrate(8, "a10g", 1)
	if err != nil {
		t.Fatal(err)
	}
	if capacity <= 0 {
		t.Fatalf("capacity %v", capacity)
	}
	c, err := Compare(Scenario{Pods: 8, Profile: "a10g", Capacity: capacity, Warmup: 20 * time.Second, Measure: 60 * time.Second,
		ClientTimeout: 30 * time.Second, Seed: 1}, 0.5, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []Policy{Meridian, GIE} {
		t.Logf("%s: %s", p, summary(c.Runs[p]))
	}
	mer, gie := c.Runs[Meridian][1], c.Runs[GIE][1]
	if j := mer.Jain(StandardTenants); j < 0.95 {
		t.Errorf("Meridian: Jain %.3f < 0.95", j)
	}
	if j := gie.Jain(StandardTenants); j > 0.8 {
		t.Errorf("GIE baseline: Jain %.3f; the scenario should be unfair without fair queueing", j)
	}
	crit := mer.Bands[priority.Critical]
	if n := total(crit.Shed) + crit.ClientTimeouts; n != 0 || crit.Served != crit.Offered {
		t.Errorf("Meridian: Critical served %d of %d, %d lost", crit.Served, crit.Offered, n)
	}
	calm := c.Runs[Meridian][0].Bands[priority.Critical].TTFTP99
	if crit.TTFTP99 > 2*calm {
		t.Errorf("Meridian: Critical P99 TTFT %s at overload vs %s calm", crit.TTFTP99, calm)
	}
	shed := mer.Bands[priority.Sheddable]
	if shed.Shed["saturated"] == 0 || shed.RejectVirtualMax != 0 {
		t.Errorf("Meridian: Sheddable shed %v, longest wait for a 429 %s; want sheds, at once", shed.Shed, shed.RejectVirtualMax)
	}
	if !strings.Contains(summary(c.Runs[GIE]), "timeouts") {
		t.Error("summary lost its fields")
	}
}

// TestShippedDefaultsMeetTheGoal is `go run ./bench/priority -count 3`
// asserted: with the shipped admission defaults (no flags), the medians
// over seeds 1–3 meet the priority goal at 3× overload — Critical P99 TTFT
// ≤ 1.2× calm, no Critical request shed or timed out, Standard Jain ≥ 0.95
// — and every Sheddable request is refused. The figures are on the
// simulator's virtual clock, so the machine's load does not change them.
func TestShippedDefaultsMeetTheGoal(t *testing.T) {
	capacity, err := Calibrate(4, "a10g", 1)
	if err != nil {
		t.Fatal(err)
	}
	var ratios, jains []float64
	for seed := uint64(1); seed <= 3; seed++ {
		// Meridian only (Compare would run the GIE baseline too).
		var pair [2]*Result
		for i, load := range []float64{0.5, 3} {
			r, err := Run(Scenario{Pods: 4, Profile: "a10g", Capacity: capacity, Warmup: 20 * time.Second, Measure: 120 * time.Second,
				ClientTimeout: 30 * time.Second, Seed: seed, Policy: Meridian, Tenants: Mix(load)})
			if err != nil {
				t.Fatal(err)
			}
			pair[i] = r
		}
		calm, hot := pair[0], pair[1]
		crit := hot.Bands[priority.Critical]
		if n := total(crit.Shed) + crit.ClientTimeouts; n != 0 || crit.Served != crit.Offered {
			t.Errorf("seed %d: Critical served %d of %d, %d lost", seed, crit.Served, crit.Offered, n)
		}
		if sh := hot.Bands[priority.Sheddable]; total(sh.Shed) != sh.Offered {
			t.Errorf("seed %d: %d of %d Sheddable requests refused at overload; want all", seed, total(sh.Shed), sh.Offered)
		}
		ratios = append(ratios, float64(crit.TTFTP99)/float64(calm.Bands[priority.Critical].TTFTP99))
		jains = append(jains, hot.Jain(StandardTenants))
		t.Logf("seed %d: %s", seed, summary(pair))
	}
	slices.Sort(ratios)
	slices.Sort(jains)
	if r := ratios[1]; r > 1.2 {
		t.Errorf("median Critical P99 TTFT at 3× overload is %.2f× calm; the goal is ≤ 1.2× (per seed %.2f)", r, ratios)
	}
	if j := jains[1]; j < 0.95 {
		t.Errorf("median Standard Jain %.3f < 0.95", j)
	}
}
