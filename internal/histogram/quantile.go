// Package histogram holds the one estimate of a quantile from a cumulative
// histogram that Meridian makes, as Prometheus's histogram_quantile makes
// it: Tier-2's canary analysis (the TTFT P99 of each side) and the
// CloudWatch exporter (the P99 it publishes) both use it.
package histogram

import "math"

// Quantile estimates the q-quantile (0 ≤ q ≤ 1) of a cumulative
// histogram: bounds are its finite upper bounds in increasing order, cum
// the cumulative count at each, total the count of every observation
// (the +Inf bucket's). It interpolates linearly inside the bucket holding
// the rank, returns the last finite bound when the rank falls beyond it,
// and NaN when the histogram is empty.
func Quantile(q float64, bounds, cum []float64, total float64) float64 {
	if total <= 0 || len(bounds) == 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for i, ub := range bounds[:min(len(bounds), len(cum))] {
		if cum[i] >= rank {
			in := cum[i] - below
			if in <= 0 {
				return ub
			}
			return lower + (ub-lower)*(rank-below)/in
		}
		lower, below = ub, cum[i]
	}
	return lower
}
