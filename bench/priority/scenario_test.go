package main

import (
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
