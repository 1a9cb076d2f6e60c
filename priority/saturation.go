package priority

import (
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/defaults"
)

// PodLoad is one pod's load as the caller last saw it.
type PodLoad struct {
	// Queue is the pod's waiting requests. Tier-1 adds the requests it has
	// sent since the last scrape, so a burst is visible before the next one.
	Queue float64
	// KVCache is the fraction of KV-cache blocks in use, 0..1.
	KVCache float64
	// Age is how old the metrics are (time since the scrape that produced
	// them). Negative ages count as zero.
	Age time.Duration
}

// Thresholds turn per-pod load into a pool's saturation.
type Thresholds struct {
	// Queue is the waiting-queue length at which a pod counts as full.
	// Zero means 5 (GIE's default). Lower sheds and queues earlier, keeping
	// model-server queues (and TTFT) short; higher keeps more work on the
	// pods and less in the Gate, where it is fairly ordered.
	Queue float64
	// KVCache is the KV-cache use (0..1) at which a pod counts as full.
	// Zero means 0.8 (GIE's default). Above about 0.9 vLLM starts to
	// preempt, which wastes the work done on the preempted requests.
	KVCache float64
	// StaleAfter is the age beyond which a pod's metrics are not believed.
	// Zero means 2s: forty of Tier-1's 50 ms scrapes. Tier-2 should set
	// about three times its digest period. Too short turns a slow scrape
	// into lost capacity (GIE's 200 ms); too long trusts a dead pod's
	// last good numbers.
	StaleAfter time.Duration
	// StaleIsSaturated counts a stale pod as fully saturated (1.0) instead
	// of leaving it out. GIE does this; Meridian does not by default (see
	// Pool). Set it only to reproduce GIE.
	StaleIsSaturated bool
}

// DefaultThresholds are Meridian's defaults (the zero Thresholds).
func DefaultThresholds() Thresholds {
	return Thresholds{Queue: 5, KVCache: 0.8, StaleAfter: 2 * time.Second}
}

// GIEThresholds reproduce GIE's saturation detector: queue 5, KV 0.8, and
// any pod whose metrics are older than 200 ms counts as saturated.
func GIEThresholds() Thresholds {
	return Thresholds{Queue: 5, KVCache: 0.8, StaleAfter: 200 * time.Millisecond, StaleIsSaturated: true}
}

// WithDefaults is t with each field that is zero or negative taken from
// DefaultThresholds (StaleIsSaturated is kept as it is).
func (t Thresholds) WithDefaults() Thresholds {
	d := DefaultThresholds()
	t.Queue = defaults.Positive(t.Queue, d.Queue)
	t.KVCache = defaults.Positive(t.KVCache, d.KVCache)
	t.StaleAfter = defaults.Positive(t.StaleAfter, d.StaleAfter)
	return t
}

// Saturation is how full a pool is. It is a value type; Tier-1 computes it
// from live pod metrics and ships it in its health digest, and Tier-2 uses
// the digest's copy (combining clusters with Combine).
type Saturation struct {
	// Value is the mean over the counted pods of max(queue/Queue,
	// kv/KVCache). Below 1 the pool has headroom; 1 or more it is
	// saturated; above 1 says by how much it is oversubscribed.
	Value float64
	// PerRequest is how much one more admitted request raises Value:
	// 1/(Fresh × Queue). The Gate uses it to account for requests it admits
	// between two observations. Zero turns that accounting off.
	PerRequest float64
	// Fresh and Stale count the pods whose metrics were and were not
	// believed. With StaleIsSaturated, stale pods are counted in Value and
	// in Fresh as well.
	Fresh, Stale int
	// Backlog is how far past its limits the Gate may admit Critical and
	// Standard requests, in units of Value: the requests that Gates
	// behind this pool will hold for it (Tier-2 sets it from each
	// cluster's admission rate; see tier2.Admission). Sheddable requests,
	// and those that may spill, are judged without it. Tier-1 leaves it
	// zero: nothing stands behind its Gate but the pods.
	Backlog float64
}

// WithoutBacklog is s with no Backlog.
func (s Saturation) WithoutBacklog() Saturation {
	s.Backlog = 0
	return s
}

// Known reports whether any pod's metrics were believed. A pool with no
// fresh metrics is blind: the Gate then sheds Sheddable requests and
// admits the others without queueing.
func (s Saturation) Known() bool { return s.Fresh > 0 }

// Saturated reports whether the pool is known to have no headroom.
func (s Saturation) Saturated() bool { return s.Known() && s.Value >= 1 }

// Pool computes a pool's saturation from its pods.
//
// Stale pods are left out, not counted as saturated as GIE does: a missed
// scrape is missing evidence, not evidence of load. Counting it as load
// turns one slow scrape into lost capacity and, in small pools, into a full
// stop of the pool (GIE issue 1497; llm-d's stale-metrics bugs). Leaving it
// out still gives it no credit for headroom, and the Gate's own in-flight
// accounting keeps it from being flooded. When no pod is fresh the pool is
// unknown (see Known).
func (t Thresholds) Pool(pods []PodLoad) Saturation {
	t = t.WithDefaults()
	var s Saturation
	var sum float64
	for _, p := range pods {
		if p.Age > t.StaleAfter {
			s.Stale++
			if t.StaleIsSaturated {
				s.Fresh++
				sum++
			}
			continue
		}
		s.Fresh++
		sum += max(p.Queue/t.Queue, p.KVCache/t.KVCache, 0)
	}
	if t.StaleIsSaturated && len(pods) == 0 {
		// GIE fails closed on an empty pool.
		return Saturation{Value: 1, Fresh: 0}
	}
	if s.Fresh == 0 {
		return s
	}
	s.Value = sum / float64(s.Fresh)
	s.PerRequest = 1 / (float64(s.Fresh) * t.Queue)
	return s
}

// Digest applies the staleness rule to a saturation received in a health
// digest of the given age (Tier-2): a digest older than StaleAfter counts
// as if all its pods were stale, so that cluster is blind, not trusted on
// old numbers nor counted as full.
func (t Thresholds) Digest(s Saturation, age time.Duration) Saturation {
	t = t.WithDefaults()
	if age <= t.StaleAfter {
		return s
	}
	if t.StaleIsSaturated {
		return Saturation{Value: 1, Fresh: s.Fresh + s.Stale, Stale: s.Fresh + s.Stale}
	}
	return Saturation{Stale: s.Fresh + s.Stale}
}

// Combine merges the saturations of pools that can serve the same request
// (one model's pools in several clusters) into one, weighting each by its
// fresh pods, as if they were one pool.
func Combine(pools ...Saturation) Saturation {
	var out Saturation
	var sum, inv, backlog float64 // backlog in requests
	for _, p := range pools {
		out.Stale += p.Stale
		if !p.Known() {
			continue
		}
		out.Fresh += p.Fresh
		sum += p.Value * float64(p.Fresh)
		if p.PerRequest > 0 {
			inv += 1 / p.PerRequest
			backlog += p.Backlog / p.PerRequest
		}
	}
	if out.Fresh == 0 {
		return out
	}
	out.Value = sum / float64(out.Fresh)
	if inv > 0 {
		out.PerRequest = 1 / inv
		out.Backlog = backlog * out.PerRequest
	}
	return out
}

// Overlay lays the fields a pool's admission settings set over a Gate
// configuration and thresholds (which may hold a caller's own defaults);
// unset fields keep c's and t's. An explicit criticalReserve of 0 means no
// reserve. A nil a changes nothing.
func Overlay(c Config, t Thresholds, a *config.Admission) (Config, Thresholds) {
	if a == nil {
		return c, t
	}
	setF := func(dst *float64, v float64) {
		if v != 0 {
			*dst = v
		}
	}
	setD := func(dst *time.Duration, v config.Duration) {
		if v != 0 {
			*dst = v.D()
		}
	}
	if a.MaxQueued != 0 {
		c.MaxQueued = a.MaxQueued
	}
	if a.MaxQueuedBytes != 0 {
		c.MaxQueuedBytes = a.MaxQueuedBytes
	}
	if r := a.CriticalReserve; r != nil {
		c.CriticalReserve = *r
		if *r == 0 {
			c.CriticalReserve = -1 // Config's zero is the default
		}
	}
	setD(&c.StandardMaxWait, a.StandardMaxWait)
	setD(&c.CriticalMaxWait, a.CriticalMaxWait)
	setD(&c.RetryAfter, a.RetryAfter)
	setF(&t.Queue, a.QueueThreshold)
	setF(&t.KVCache, a.KVCacheThreshold)
	setD(&t.StaleAfter, a.StaleAfter)
	return c, t
}
