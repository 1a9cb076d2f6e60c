package gateway

import (
	"slices"
	"sync"
	"time"
)

// poolStats keeps a pool's recent outcomes for the health feed: TTFT
// samples and failures in fixed rings, so memory stays bounded whatever
// the traffic.
type poolStats struct {
	mu       sync.Mutex
	ttft     [1024]sample
	nTTFT    int
	outcomes [1024]outcome
	nOut     int
	hits     [1024]float64
	nHits    int
}

type sample struct {
	at       time.Time
	d        time.Duration
	streamed bool // a first token; else a non-streamed answer's whole latency
}

type outcome struct {
	at     time.Time
	failed bool
}

func newPoolStats() *poolStats { return &poolStats{} }

func (s *poolStats) observeTTFT(at time.Time, d time.Duration, streamed bool) {
	s.mu.Lock()
	s.ttft[s.nTTFT%len(s.ttft)] = sample{at, d, streamed}
	s.nTTFT++
	s.mu.Unlock()
}

func (s *poolStats) observeOutcome(at time.Time, failed bool) {
	s.mu.Lock()
	s.outcomes[s.nOut%len(s.outcomes)] = outcome{at, failed}
	s.nOut++
	s.mu.Unlock()
}

// observeHit records the share of a dispatched prompt's blocks the index
// held for the chosen endpoint.
func (s *poolStats) observeHit(h float64) {
	s.mu.Lock()
	s.hits[s.nHits%len(s.hits)] = h
	s.nHits++
	s.mu.Unlock()
}

func (s *poolStats) indexHitRatio() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := min(s.nHits, len(s.hits))
	if n == 0 {
		return 0
	}
	sum := 0.0
	for _, h := range s.hits[:n] {
		sum += h
	}
	return sum / float64(n)
}

// summary returns TTFT quantiles and the error rate over the window. The
// quantiles are of the streamed requests' first tokens when the window has
// any: a non-streamed answer's first byte is its last, and mixed in it
// would make a pool whose callers stream less look slower. A pool with no
// streamed requests gets its answers' latency instead.
func (s *poolStats) summary(now time.Time, window time.Duration) (p50, p99 time.Duration, errRate float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	from := now.Add(-window)
	var streamed, all []time.Duration
	for _, x := range s.ttft[:min(s.nTTFT, len(s.ttft))] {
		if x.at.After(from) {
			all = append(all, x.d)
			if x.streamed {
				streamed = append(streamed, x.d)
			}
		}
	}
	ds := all
	if len(streamed) > 0 {
		ds = streamed
	}
	if len(ds) > 0 {
		slices.Sort(ds)
		p50 = ds[(len(ds)-1)*50/100]
		p99 = ds[(len(ds)-1)*99/100]
	}
	total, failed := 0, 0
	for _, o := range s.outcomes[:min(s.nOut, len(s.outcomes))] {
		if o.at.After(from) {
			total++
			if o.failed {
				failed++
			}
		}
	}
	if total > 0 {
		errRate = float64(failed) / float64(total)
	}
	return p50, p99, errRate
}
