package regions

import (
	"fmt"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
)

// scaleFleet is the fleet of docs/scale.md: 500 clusters in 20 Regions,
// each with 4 pools (one per model, 2,000 digests), so that every cluster
// is a candidate for any of the models.
func scaleFleet(tb testing.TB) *Fleet {
	var ds []Digest
	var rtts []RegionRTT
	for r := range 20 {
		if r > 0 {
			rtts = append(rtts, RegionRTT{"region-00", fmt.Sprintf("region-%02d", r), time.Duration(20+10*r) * time.Millisecond})
		}
	}
	for c := range 500 {
		for m := range 4 {
			d := pool(fmt.Sprintf("region-%02d", c%20), fmt.Sprintf("c%03d", c), fmt.Sprintf("model-%d", m))
			d.QueueTotal, d.KVMean = (c+m)%5, float64((c+m)%7)/10
			ds = append(ds, d)
		}
	}
	return newFleet(tb, Config{LocalRegion: "region-00", DigestMaxAge: time.Hour, RTTs: rtts}, ds...)
}

// BenchmarkSelect500Clusters is Tier-2's cluster choice at docs/scale.md's
// size: Select (with a new prefix hash each time) then Begin and End.
func BenchmarkSelect500Clusters(b *testing.B) {
	f := scaleFleet(b)
	dst := make([]Target, 0, 3)
	req := Request{Model: "model-0"}
	b.ReportAllocs()
	cpu0 := testkit.CPUTime()
	for i := 0; b.Loop(); i++ {
		req.PrefixHash = uint64(i)*0x9E3779B97F4A7C15 | 1
		dst = f.Select(dst, req)
		f.Begin(dst[0])
		f.End(dst[0], Success)
	}
	reportCPU(b, cpu0)
}

// Select over 500 clusters allocates nothing. It runs in test.sh's second
// pass, without the race detector (under it the fleet alone takes minutes).
func TestSelect500ClustersDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("runs without the race detector (test.sh's second pass)")
	}
	f := scaleFleet(t)
	dst := make([]Target, 0, 3)
	req := Request{Model: "model-2", PrefixHash: 0x1234}
	if n := testing.AllocsPerRun(200, func() {
		req.PrefixHash++
		dst = f.Select(dst, req)
		f.Begin(dst[0])
		f.End(dst[0], Success)
	}); n != 0 {
		t.Errorf("Select+Begin+End over 500 clusters allocates %v times per call", n)
	}
}
