package histogram

import (
	"math"
	"testing"
)

func TestQuantile(t *testing.T) {
	bounds := []float64{0.1, 0.5, 1}
	cases := []struct {
		name       string
		q          float64
		cum        []float64
		total, out float64
	}{
		// 100 observations: 50 ≤ 0.1, 40 in (0.1, 0.5], 10 in (0.5, 1].
		{"median in the first bucket", 0.5, []float64{50, 90, 100}, 100, 0.1},
		{"p99 interpolated in the last bucket", 0.99, []float64{50, 90, 100}, 100, 0.5 + 0.5*9/10},
		{"p75 interpolated in the middle bucket", 0.75, []float64{50, 90, 100}, 100, 0.1 + 0.4*25/40},
		{"rank beyond the last bound", 0.99, []float64{50, 90, 90}, 100, 1},
	}
	for _, c := range cases {
		if got := Quantile(c.q, bounds, c.cum, c.total); math.Abs(got-c.out) > 1e-12 {
			t.Errorf("%s: %v, want %v", c.name, got, c.out)
		}
	}
	if got := Quantile(0.99, bounds, []float64{0, 0, 0}, 0); !math.IsNaN(got) {
		t.Errorf("empty histogram: %v, want NaN", got)
	}
}
