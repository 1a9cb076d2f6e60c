package plan

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/traces"
	"github.com/meridian-router/meridian/replay"
	"github.com/meridian-router/meridian/sim"
)

const mixedFleet = "../deploy/examples/fleets/mixed-h100-a10g.yaml"

// azure loads the first n requests of the Azure conversation trace (the
// docs use the whole trace; the goals hold on this prefix too).
func azure(t *testing.T, n int, o replay.LoadOptions) *replay.Workload {
	t.Helper()
	o.Limit = n
	w, err := replay.LoadTrace(traces.Path(traces.Azure), o)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// meets replays fleet f independently of the planner, to the end, and
// reports whether it meets a P99 TTFT SLO.
func meets(t *testing.T, w *replay.Workload, f *sim.Fleet, scale float64, slo time.Duration) (bool, float64) {
	t.Helper()
	pol, err := replay.ParsePolicy(replay.Meridian, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Stopping once over 1% of requests have missed cannot turn a miss
	// into a pass, and spares replaying an overloaded fleet's backlog.
	r, err := replay.Run(w, pol, replay.Options{Fleet: f, RateScale: scale, Seed: 1,
		Deadline: slo, MissBudget: len(w.Records) / 100})
	if err != nil {
		t.Fatal(err)
	}
	ok, _ := replay.SLO{TTFT: slo}.Met(r)
	return ok, r.TTFT.P99
}

// TestCapacityAzureMixed is the goal: on the Azure conversation
// trace and the mixed fleet, at 2× and 4× the trace's rate, the plan's
// replay meets a 2 s P99 TTFT SLO, one pod fewer in any planned pool
// misses it, and 4× needs at least as many pods as 2×. The plan is read
// back from the fleet file it is written as and replayed afresh.
func TestCapacityAzureMixed(t *testing.T) {
	const slo = 2 * time.Second
	w := azure(t, 3000, replay.LoadOptions{})
	pods := map[float64]int{}
	for _, scale := range []float64{2, 4} {
		inv := Invocation{Fleet: mixedFleet, SLO: slo, Seed: 1}
		c, err := inv.capacity()
		if err != nil {
			t.Fatal(err)
		}
		c.Scale = scale
		// The margin search is checked at 4× only, to keep the test cheap.
		c.noMargin = scale != 4
		p, err := PlanCapacity(w, c)
		if err != nil {
			t.Fatalf("×%v: %v", scale, err)
		}
		out := filepath.Join(t.TempDir(), "planned.yaml")
		if err := WriteFleetFile(out, p, "test"); err != nil {
			t.Fatal(err)
		}
		f, err := sim.LoadFleet(out)
		if err != nil {
			t.Fatalf("the planned fleet file does not load: %v", err)
		}
		ok, p99 := meets(t, w, f, scale, slo)
		t.Logf("×%v: plan %s, cost %.2f/h, P99 %.0f ms, margin ×%.3g; %d replays", scale, p.Plan.Label(), p.Plan.Cost, p99, p.Margin.Scale, p.Replays)
		if !ok || !p.Plan.Met {
			t.Errorf("×%v: the plan %s misses the SLO (P99 %.0f ms)", scale, p.Plan.Label(), p99)
		}
		if !c.noMargin && p.Margin.Scale < scale {
			t.Errorf("×%v: margin ×%v is below the peak", scale, p.Margin.Scale)
		}
		// Minimal: one pod fewer in each planned pool misses.
		checked := 0
		for i := range f.Pools {
			less := &sim.Fleet{}
			for j, q := range f.Pools {
				if j == i {
					q.Count--
				}
				if q.Count > 0 {
					less.Pools = append(less.Pools, q)
				}
			}
			checked++
			if len(less.Pools) == 0 {
				continue // no pods serve nothing
			}
			if ok, p99 := meets(t, w, less, scale, slo); ok {
				t.Errorf("×%v: with one %s pod fewer the replay still meets the SLO (P99 %.0f ms): the plan is not minimal", scale, f.Pools[i].Name, p99)
			}
		}
		if checked == 0 || len(p.OneFewer) != checked {
			t.Errorf("×%v: %d pools checked, plan reports %d", scale, checked, len(p.OneFewer))
		}
		pods[scale] = p.Plan.Pods()
	}
	if pods[4] < pods[2] {
		t.Errorf("pods at 4× (%d) < pods at 2× (%d)", pods[4], pods[2])
	}
}

// TestLoRAZipf is the LoRA goal: 40 adapters, Zipf s = 2.3 (the
// top 3 carry about 90%): two pools, the hot one with --max-loras at least
// the hot set, and the layout beats one shared pool of the same pods in
// P99 TTFT and in adapter loads.
func TestLoRAZipf(t *testing.T) {
	var stdout bytes.Buffer
	inv := Invocation{
		Source:       Source{Trace: traces.Path(traces.Azure), Load: replay.LoadOptions{Limit: 10000}, PeakScale: 2},
		Fleet:        "../deploy/examples/fleets/uniform-h100.yaml",
		SLO:          2 * time.Second,
		Seed:         1,
		AdaptersFrom: "zipf:40,2.3",
		JSON:         true,
	}
	if err := inv.LoRA(context.Background(), &stdout); err != nil {
		t.Fatal(err)
	}
	var p LoRAPlan
	if err := json.Unmarshal(stdout.Bytes(), &p); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	t.Logf("hot set %v (%.1f%%); layout P99 %.0f ms, %d loads; shared P99 %.0f ms, %d loads",
		p.HotSet, 100*p.HotShare, p.Layout.P99TTFTMS, p.Layout.AdapterLoads, p.Shared.P99TTFTMS, p.Shared.AdapterLoads)
	if p.Adapters != 40 || len(p.HotSet) != 3 || p.HotShare < 0.85 || p.HotShare > 0.95 {
		t.Errorf("hot set %v of %d adapters carries %.3f, want 3 of 40 carrying about 90%%", p.HotSet, p.Adapters, p.HotShare)
	}
	if len(p.Pools) != 2 || p.Pools[0].Role != "hot" || p.Pools[1].Role != "tail" {
		t.Fatalf("pools %+v, want hot and tail", p.Pools)
	}
	if p.Pools[0].MaxLoRAs < len(p.HotSet) {
		t.Errorf("hot pool --max-loras %d < hot set %d", p.Pools[0].MaxLoRAs, len(p.HotSet))
	}
	if len(p.Pools[0].Adapters)+len(p.Pools[1].Adapters) != 40 {
		t.Errorf("pools serve %d + %d adapters, want 40 in all", len(p.Pools[0].Adapters), len(p.Pools[1].Adapters))
	}
	lp, sp := 0, 0
	for _, pc := range p.Layout.Pods {
		lp += pc.Count
	}
	for _, pc := range p.Shared.Pods {
		sp += pc.Count
	}
	if lp != sp || lp == 0 {
		t.Errorf("layout has %d pods, shared pool %d: want the same", lp, sp)
	}
	if p.Layout.Requests != p.Shared.Requests {
		t.Errorf("layout replayed %d requests, shared %d", p.Layout.Requests, p.Shared.Requests)
	}
	if !(p.Layout.P99TTFTMS < p.Shared.P99TTFTMS) {
		t.Errorf("layout P99 TTFT %.0f ms does not beat the shared pool's %.0f ms", p.Layout.P99TTFTMS, p.Shared.P99TTFTMS)
	}
	if !(p.Layout.AdapterLoads < p.Shared.AdapterLoads) {
		t.Errorf("layout loads adapters %d times, the shared pool %d", p.Layout.AdapterLoads, p.Shared.AdapterLoads)
	}
}

// TestBadInput: bad flags and files get a clear error, classified as the
// caller's, before any replay.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	unpriced := filepath.Join(dir, "unpriced.yaml")
	if err := os.WriteFile(unpriced, []byte("pools:\n- {name: h100, profile: h100, count: 1}\n- {name: a10g, profile: a10g, count: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badPrice := filepath.Join(dir, "badprice.yaml")
	if err := os.WriteFile(badPrice, []byte("pools:\n- {name: h100, profile: h100, count: 1}\nprices: {h200: 9}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	azurePath := traces.Path(traces.Azure)
	cases := []struct {
		name string
		inv  Invocation
		lora bool
		want string
	}{
		{"unknown GPU", Invocation{Source: Source{Trace: azurePath}, Fleet: mixedFleet, SLO: time.Second, GPUs: "h100,b200"}, false, `unknown GPU profile "b200"`},
		{"zero SLO", Invocation{Source: Source{Trace: azurePath}, Fleet: mixedFleet}, false, "--slo-ttft-p99 must be positive"},
		{"negative SLO", Invocation{Source: Source{Trace: azurePath}, Fleet: mixedFleet, SLO: -time.Second}, false, "--slo-ttft-p99 must be positive"},
		{"unreadable trace", Invocation{Source: Source{Trace: filepath.Join(dir, "missing.csv")}, Fleet: mixedFleet, SLO: time.Second}, false, "missing.csv"},
		{"malformed trace", Invocation{Source: Source{Trace: unpriced, Load: replay.LoadOptions{Format: "azure"}}, Fleet: mixedFleet, SLO: time.Second}, false, "line 1"},
		{"no source", Invocation{Fleet: mixedFleet, SLO: time.Second}, false, "--trace FILE or --from-prometheus URL is required"},
		{"two peaks", Invocation{Source: Source{Trace: azurePath, PeakScale: 2, PeakRPS: 10}, Fleet: mixedFleet, SLO: time.Second}, false, "not both"},
		{"no fleet", Invocation{Source: Source{Trace: azurePath}, SLO: time.Second}, false, "--fleet FILE is required"},
		{"mix without prices", Invocation{Source: Source{Trace: azurePath}, Fleet: unpriced, SLO: time.Second}, false, "price per pod-hour for h100, a10g"},
		{"price of an unknown GPU", Invocation{Source: Source{Trace: azurePath}, Fleet: badPrice, SLO: time.Second}, false, "prices.h200"},
		{"bad Prometheus URL", Invocation{Source: Source{Prometheus: Prometheus{URL: "prometheus:9090"}}, Fleet: mixedFleet, SLO: time.Second}, false, "want an http(s) URL"},
		{"bad adapters source", Invocation{Source: Source{Trace: azurePath}, Fleet: mixedFleet, SLO: time.Second, AdaptersFrom: "zipf:1"}, true, "2 ≤ N"},
		{"trace without adapters", Invocation{Source: Source{Trace: azurePath}, Fleet: mixedFleet, SLO: time.Second, AdaptersFrom: "trace"}, true, "carries no adapter ids"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.lora {
				err = tc.inv.LoRA(context.Background(), &bytes.Buffer{})
			} else {
				err = tc.inv.Capacity(context.Background(), &bytes.Buffer{})
			}
			if err == nil || !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrBadInput mentioning %q", err, tc.want)
			}
		})
	}
}
