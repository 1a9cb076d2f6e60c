// Package simtest starts simulated model-server pods for tests: live on
// loopback, closed when the test ends. It is imported only by test files
// (docs/architecture.md, rule 2).
package simtest

import (
	"context"
	"testing"

	"github.com/meridian-router/meridian/sim"
)

// Profile is the named hardware profile ("h100", "a10g", …), failing tb
// when there is none of that name.
func Profile(tb testing.TB, name string) sim.Profile {
	tb.Helper()
	p, err := sim.LookupProfile(name)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// StartPods starts k live pods of spec on loopback (sim.StartPods), failing
// tb when they do not start, and closes them when tb's test ends, after
// the cleanups registered later.
func StartPods(tb testing.TB, spec sim.PodSpec, k int) []*sim.LivePod {
	tb.Helper()
	pods, err := sim.StartPods(context.Background(), spec, k)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		for _, lp := range pods {
			lp.Close()
		}
	})
	return pods
}
