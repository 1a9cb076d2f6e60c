package sim

import (
	"github.com/meridian-router/meridian/internal/traces"
	"slices"
	"testing"
	"time"

	"github.com/meridian-router/meridian/sim/trace"
)

func loadAzure(t testing.TB, n int) ([]*Request, []time.Duration) {
	t.Helper()
	return loadTrace(t, traces.Azure, trace.NewAzure, n)
}

// p99TTFT replays requests on 2 H100 and 2 A10G pods, picking pods either
// round-robin or by the fewest waiting+running requests in the last 50 ms
// scrape (plus those sent since), and returns the P99 TTFT.
func p99TTFT(t *testing.T, reqs []*Request, at []time.Duration, loadAware bool) time.Duration {
	e := NewEngine(1)
	for i, name := range []string{"h100", "a10g", "h100", "a10g"} {
		if _, err := e.AddPod(PodConfig{Name: name + string(rune('0'+i)), Profile: mustProfile(t, name)}); err != nil {
			t.Fatal(err)
		}
	}
	pods := e.Pods()
	load := make([]int, len(pods))
	e.Every(50*time.Millisecond, func() {
		for i, p := range pods {
			m := p.Metrics()
			load[i] = m.Waiting + m.Running
		}
	})
	var ttfts []time.Duration
	for i := range reqs {
		e.At(at[i], func() {
			pick := i % len(pods)
			if loadAware {
				pick = 0
				for j := range load {
					if load[j] < load[pick] {
						pick = j
					}
				}
				load[pick]++
			}
			e.Submit(pods[pick], reqs[i], func(o Outcome) {
				if o.Err != nil {
					t.Errorf("request %s: %v", o.Request.ID, o.Err)
				}
				ttfts = append(ttfts, o.TTFT())
			})
		})
	}
	e.Run()
	slices.Sort(ttfts)
	return ttfts[len(ttfts)*99/100]
}

// TestLoadAwareRoutingBeatsRoundRobin is the comparison the simulator
// exists for, in the direction published for mixed H100/A10G fleets
// (REFERENCE.md §7): on the Azure conversation trace at its own rate,
// routing by queue length cuts P99 TTFT far below round-robin, which
// overloads the A10Gs.
func TestLoadAwareRoutingBeatsRoundRobin(t *testing.T) {
	n := 6000
	if raceEnabled {
		n = 2000
	}
	reqs, at := loadAzure(t, n)
	rr := p99TTFT(t, reqs, at, false)
	la := p99TTFT(t, reqs, at, true)
	t.Logf("P99 TTFT over %d requests: round-robin %v, load-aware %v", len(reqs), rr, la)
	if la*2 > rr {
		t.Errorf("load-aware P99 TTFT %v is not under half of round-robin's %v", la, rr)
	}
}
