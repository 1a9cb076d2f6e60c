package cloudwatch

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Tier-2 metric names the aggregates are read from (docs/metrics.md).
const (
	metricRequests  = "meridian_tier2_requests_total"
	metricTTFT      = "meridian_tier2_ttft_seconds"
	metricFailovers = "meridian_tier2_failovers_total"
)

// FromGatherer returns a source that reads a Tier-2's aggregates from its
// Prometheus registry: requests and 429s by model_name from
// meridian_tier2_requests_total, TTFT by model_name from
// meridian_tier2_ttft_seconds (target models merged; streamed answers
// only, since a non-streamed answer's first byte is its last), and every
// meridian_tier2_failovers_total. Metrics not registered yet read as
// zero. A gathering error yields what could be read.
func FromGatherer(g prometheus.Gatherer) func() Aggregates {
	return func() Aggregates {
		families, _ := g.Gather() // partial results are still useful
		a := Aggregates{Requests: map[string]uint64{}, Throttled: map[string]uint64{}, TTFT: map[string]Histogram{}}
		for _, f := range families {
			switch f.GetName() {
			case metricRequests:
				for _, m := range f.GetMetric() {
					model := label(m, "model_name")
					n := uint64(m.GetCounter().GetValue())
					a.Requests[model] += n
					if label(m, "code") == "429" {
						a.Throttled[model] += n
					}
				}
			case metricTTFT:
				for _, m := range f.GetMetric() {
					if label(m, "stream") == "false" {
						continue // a whole answer's latency, not a first token
					}
					model := label(m, "model_name")
					a.TTFT[model] = merge(a.TTFT[model], m.GetHistogram())
				}
			case metricFailovers:
				for _, m := range f.GetMetric() {
					a.Failovers += uint64(m.GetCounter().GetValue())
				}
			}
		}
		return a
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// merge adds a Prometheus histogram into h, bucket by bound.
func merge(h Histogram, p *dto.Histogram) Histogram {
	counts := map[float64]uint64{}
	for _, b := range h.Buckets {
		counts[b.UpperBound] = b.Count
	}
	for _, b := range p.GetBucket() {
		counts[b.GetUpperBound()] += b.GetCumulativeCount()
	}
	bounds := make([]float64, 0, len(counts))
	for ub := range counts {
		bounds = append(bounds, ub)
	}
	sort.Float64s(bounds)
	out := Histogram{Count: h.Count + p.GetSampleCount(), Sum: h.Sum + p.GetSampleSum()}
	for _, ub := range bounds {
		out.Buckets = append(out.Buckets, Bucket{UpperBound: ub, Count: counts[ub]})
	}
	return out
}
