package replay

import (
	"testing"
)

// BenchmarkRun replays the first 2,000 requests of the Mooncake trace on
// the 2+2 mixed fleet, one policy per sub-benchmark: the cost of the
// simulator plus the policy's decisions. The whole-trace wall time is in
// docs/BENCHMARKS.md.
func BenchmarkRun(b *testing.B) {
	w := mooncake(b, 2000)
	f := fleet(b, mixedFleet)
	for _, kind := range PolicyKinds {
		b.Run(kind, func(b *testing.B) {
			p := mustPolicy(b, kind)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Run(w, p, Options{Fleet: f}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
