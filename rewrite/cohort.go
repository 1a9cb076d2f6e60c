package rewrite

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// CohortSampleSize is how many distinct stickiness keys a CohortSample
// keeps: up to this many keys it counts exactly; beyond, it estimates with
// a relative standard error of about 1/√(CohortSampleSize−2) ≈ 3%, in 8 KiB.
const CohortSampleSize = 1024

// CohortSample is a bounded, mergeable sample of the distinct stickiness
// keys a rollout has seen, each marked with the side its split put it on:
// the CohortSampleSize smallest key hashes (a bottom-k, or KMV, sketch).
// Because a key's hash does not depend on its side, the marked fraction of
// the sample estimates the canary's share of distinct keys, and the k-th
// smallest hash estimates how many distinct keys there are.
//
// A bottom-k sample, not a HyperLogLog (github.com/axiomhq/hyperloglog was
// considered): it is exact for the few-key case that matters most here,
// carries each key's side so one structure gives both counts, and merges
// across Tier-2 instances by a sorted union.
//
// The zero CohortSample is empty and ready. It is not safe for concurrent
// use.
type CohortSample struct {
	// h holds distinct key hashes, ascending, with the lowest bit replaced
	// by the key's side (1: canary). At most CohortSampleSize.
	h []uint64
}

// Add records one request's key and side. A key always lands on the same
// side within one rollout state, so a repeat changes nothing.
func (s *CohortSample) Add(key string, canary bool) {
	// Unseeded, unlike the split's hash (seeded with the rollout's salt), so
	// whether a key is sampled does not depend on its side.
	s.add(xxhash.Sum64String(key)&^1 | bit(canary))
}

func bit(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func (s *CohortSample) add(v uint64) {
	if len(s.h) == CohortSampleSize && v&^1 >= s.h[len(s.h)-1]&^1 {
		if v&^1 == s.h[len(s.h)-1]&^1 {
			s.h[len(s.h)-1] = v // same key; keep the side last seen
		}
		return
	}
	i, _ := slices.BinarySearchFunc(s.h, v&^1, func(e, t uint64) int {
		switch {
		case e&^1 < t:
			return -1
		case e&^1 > t:
			return 1
		}
		return 0
	})
	if i < len(s.h) && s.h[i]&^1 == v&^1 {
		s.h[i] = v
		return
	}
	if len(s.h) == CohortSampleSize {
		s.h = s.h[:len(s.h)-1]
	}
	s.h = slices.Insert(s.h, i, v)
}

// Merge adds o's keys (another instance's sample of the same rollout
// state).
func (s *CohortSample) Merge(o CohortSample) {
	for _, v := range o.h {
		s.add(v)
	}
}

// Keys estimates the distinct keys seen and how many of them are on the
// canary. Both are exact while fewer than CohortSampleSize keys were seen.
func (s *CohortSample) Keys() (keys, canary int64) {
	n := len(s.h)
	var onCanary int
	for _, v := range s.h {
		onCanary += int(v & 1)
	}
	if n < CohortSampleSize {
		return int64(n), int64(onCanary)
	}
	// KMV: the k-th smallest of n uniform hashes sits near k/n of the range.
	frac := float64(s.h[n-1]|1) / math.MaxUint64
	est := float64(n-1) / frac
	return int64(math.Round(est)), int64(math.Round(est * float64(onCanary) / float64(n)))
}

// Hashes returns the sample's entries for shipping to another process;
// SampleOf turns them back into a sample.
func (s *CohortSample) Hashes() []uint64 { return slices.Clone(s.h) }

// SampleOf rebuilds a sample from Hashes, which it checks and bounds.
func SampleOf(h []uint64) CohortSample {
	var s CohortSample
	for _, v := range h {
		s.add(v)
	}
	return s
}

// Cohort measures how one rollout state's split lands on real traffic: the
// requests and distinct stickiness keys on each side of the stable/canary
// pair. It is safe for concurrent use.
type Cohort struct {
	mu               sync.Mutex
	requests, canary int64
	keys             CohortSample
}

// Observe counts one resolved request; it ignores requests outside the
// rollout's stable/canary pair.
func (c *Cohort) Observe(res Resolution) {
	if !res.Canary && !res.Stable {
		return
	}
	c.mu.Lock()
	c.requests++
	if res.Canary {
		c.canary++
	}
	c.keys.Add(res.Key, res.Canary)
	c.mu.Unlock()
}

// Counts returns the requests seen (all, and on the canary) and a copy of
// the key sample.
func (c *Cohort) Counts() (requests, canary int64, keys CohortSample) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests, c.canary, CohortSample{h: slices.Clone(c.keys.h)}
}

// MinCohortKeys is the cohort rule: a split by stickiness key means
// something only when the canary's expected cohort, distinct keys × weight,
// holds at least this many keys. At 5% that takes 20 distinct keys; with
// fewer, the canary gets whole keys or none, and its share of requests is
// whatever those keys send (0% or 30% with 5 tenants at "5%").
const MinCohortKeys = 1

// CohortWarning returns why a split at pct percent (the canary's share of
// the pair) over keys distinct keys seen in requests requests cannot be
// trusted, or "" when it can. It warns only once the keys repeat (requests
// ≥ 2 × keys), so a rollout that has seen few requests of a large key space
// is not mistaken for a small key space.
func CohortWarning(pct float64, keys, requests int64) string {
	if pct <= 0 || pct >= 100 || keys <= 0 || requests < 2*keys {
		return ""
	}
	need := int64(math.Ceil(MinCohortKeys * 100 / pct))
	if keys >= need {
		return ""
	}
	return fmt.Sprintf("only %d distinct stickiness keys in %d requests: at %.4g%% the canary's cohort is %.2g keys (want %d keys or more); its share of requests is whatever the keys it drew send — key on a session header (stickiness.key: header) or raise the weight",
		keys, requests, pct, float64(keys)*pct/100, need)
}
