package cloudwatch

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// BenchmarkDatums measures building one publication for a Region serving
// 100 models, each with a TTFT histogram of 12 buckets: the exporter's
// whole per-minute CPU cost before the network.
func BenchmarkDatums(b *testing.B) {
	prev, cur := Aggregates{Requests: map[string]uint64{}, Throttled: map[string]uint64{}, TTFT: map[string]Histogram{}},
		Aggregates{Requests: map[string]uint64{}, Throttled: map[string]uint64{}, TTFT: map[string]Histogram{}}
	bounds := []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, math.Inf(1)}
	for i := range 100 {
		m := fmt.Sprintf("model-%03d", i)
		prev.Requests[m], cur.Requests[m] = 1000, 1600
		prev.Throttled[m], cur.Throttled[m] = 10, 16
		var hp, hc Histogram
		for j, ub := range bounds {
			hp.Buckets = append(hp.Buckets, Bucket{ub, uint64(80 * (j + 1))})
			hc.Buckets = append(hc.Buckets, Bucket{ub, uint64(130 * (j + 1))})
		}
		hp.Count, hc.Count = 80*uint64(len(bounds)), 130*uint64(len(bounds))
		prev.TTFT[m], cur.TTFT[m] = hp, hc
	}
	e := &Exporter{cfg: Config{Region: "us-east-1"}}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if d := e.datums(prev, cur, now); len(d) != 100*5+4 {
			b.Fatalf("%d datums", len(d))
		}
	}
}
