package labelcache

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// A cached child is the vector's own: what it counts is in the series,
// and the lookup runs once per label values.
func TestCacheReturnsTheVectorsChild(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"a", "b"})
	type key struct{ a, b string }
	var c Cache[key, prometheus.Counter]
	lookups := 0
	get := func(a, b string) prometheus.Counter {
		return c.Get(key{a, b}, func() prometheus.Counter { lookups++; return vec.WithLabelValues(a, b) })
	}
	for range 3 {
		get("1", "2").Inc()
	}
	get("1", "3").Inc()
	if got := value(t, vec.WithLabelValues("1", "2")); got != 3 {
		t.Errorf("series a=1,b=2: %v, want 3", got)
	}
	if got := value(t, vec.WithLabelValues("1", "3")); got != 1 {
		t.Errorf("series a=1,b=3: %v, want 1", got)
	}
	if lookups != 2 {
		t.Errorf("%d lookups for 2 label sets, want 2", lookups)
	}
}

// Past MaxChildren the cache stops growing and still answers.
func TestCacheIsBounded(t *testing.T) {
	var c Cache[int, int]
	for i := range MaxChildren + 10 {
		if got := c.Get(i, func() int { return i * 2 }); got != i*2 {
			t.Fatalf("Get(%d) = %d", i, got)
		}
	}
	if len(c.m) != MaxChildren {
		t.Errorf("%d children kept, want %d", len(c.m), MaxChildren)
	}
}
