package trace

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// Adapters assigns synthetic LoRA adapter names to requests. No public LLM
// trace carries adapter ids, so a replay that exercises LoRA affinity must
// invent them; it should say so in its output. Popularity follows Zipf's
// law: the adapter of rank k (from 1) is chosen with weight 1/k^s. With 40
// adapters, s = 2.3 puts 90% of requests on the top 3 (REFERENCE.md §6).
type Adapters struct {
	names []string
	cdf   []float64
	rng   *rand.Rand
}

// NewZipfAdapters returns n adapters named "adapter-00", "adapter-01", ...
// in popularity order, drawn with exponent s from a source seeded by seed.
func NewZipfAdapters(n int, s float64, seed uint64) (*Adapters, error) {
	if n < 1 || s < 0 || math.IsNaN(s) {
		return nil, fmt.Errorf("trace: zipf adapters: want n >= 1 and s >= 0, got n=%d s=%v", n, s)
	}
	a := &Adapters{rng: rand.New(rand.NewPCG(seed, seed^0x94d049bb133111eb))}
	width := len(fmt.Sprint(n - 1))
	total := 0.0
	for k := 1; k <= n; k++ {
		total += 1 / math.Pow(float64(k), s)
		a.cdf = append(a.cdf, total)
		a.names = append(a.names, fmt.Sprintf("adapter-%0*d", width, k-1))
	}
	for i := range a.cdf {
		a.cdf[i] /= total
	}
	return a, nil
}

// Names lists the adapters, most popular first.
func (a *Adapters) Names() []string { return append([]string(nil), a.names...) }

// Share is the expected fraction of requests that go to the top k adapters.
func (a *Adapters) Share(k int) float64 {
	if k <= 0 {
		return 0
	}
	return a.cdf[min(k, len(a.cdf))-1]
}

// Pick draws one adapter name.
func (a *Adapters) Pick() string {
	x := a.rng.Float64()
	i := sort.SearchFloat64s(a.cdf, x)
	return a.names[min(i, len(a.names)-1)]
}
