// Package rollout holds what the CLI (canary, `meridian canary status`)
// and Tier-2 (its canary analysis, GET /meridian/canary) both say about a
// rollout: each target's effective share of a rule, how the split landed
// on observed traffic (Cohort), and one Tier-2's latest analysis (Live).
// It sits below both so that neither imports the other.
package rollout

import (
	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/rewrite"
)

// Cohort is how a rollout's split lands on observed traffic: the canary's
// share of the stable/canary pair's requests and of its distinct
// stickiness keys, beside the configured weight. Counts run from when the
// Tier-2 first saw the rollout's current state (step, status or weights).
type Cohort struct {
	// WeightPercent is the canary's configured share of the pair.
	WeightPercent  float64 `json:"weightPercent"`
	Requests       int64   `json:"requests"`
	CanaryRequests int64   `json:"canaryRequests"`
	RequestPercent float64 `json:"requestPercent"`
	// Keys and CanaryKeys count distinct stickiness keys: exact up to
	// rewrite.CohortSampleSize keys, estimated (about ±3%) beyond.
	Keys       int64   `json:"keys"`
	CanaryKeys int64   `json:"canaryKeys"`
	KeyPercent float64 `json:"keyPercent"`
	// Warning says why the split cannot be trusted (rewrite.CohortWarning);
	// empty when it can.
	Warning string `json:"warning,omitempty"`
	// Sample is the key sample (rewrite.CohortSample.Hashes), so that
	// status can merge the cohorts of several Tier-2s.
	Sample []uint64 `json:"sample,omitempty"`
}

// NewCohort reports requests (canary of them on the canary) and the key
// sample keys against the configured weight (the canary's share of the
// pair, in percent).
func NewCohort(weight float64, requests, canary int64, keys rewrite.CohortSample) Cohort {
	c := Cohort{WeightPercent: weight, Requests: requests, CanaryRequests: canary, Sample: keys.Hashes()}
	c.Keys, c.CanaryKeys = keys.Keys()
	if requests > 0 {
		c.RequestPercent = 100 * float64(canary) / float64(requests)
	}
	if c.Keys > 0 {
		c.KeyPercent = 100 * float64(c.CanaryKeys) / float64(c.Keys)
	}
	c.Warning = rewrite.CohortWarning(weight, c.Keys, requests)
	return c
}

// PairPercent is the canary's share, in percent, of the stable/canary pair
// as Shares computes the rule's split; 0 when the rule lacks either.
func PairPercent(rl config.RewriteRule, ro *config.Rollout) float64 {
	if ro == nil {
		return 0
	}
	var s, c float64
	for _, w := range Shares(rl, ro) {
		switch w.Target {
		case ro.Stable:
			s = w.Percent
		case ro.Canary:
			c = w.Percent
		}
	}
	if s+c == 0 {
		return 0
	}
	return 100 * c / (s + c)
}

// Weight is one target's effective share in percent.
type Weight struct {
	Target   string   `json:"target"`
	Percent  float64  `json:"percent"`
	Clusters []string `json:"clusters,omitempty"`
}

// Shares computes each target's share as rewrite resolves it: the
// rollout's percentage splits the stable/canary pair when it holds the
// split, the targets' weights otherwise.
func Shares(rl config.RewriteRule, ro *config.Rollout) []Weight {
	w := make([]float64, len(rl.Targets))
	for i, t := range rl.Targets {
		w[i] = float64(t.Weight)
	}
	if ro != nil {
		s, c := targetIndex(&rl, ro.Stable), targetIndex(&rl, ro.Canary)
		if pct, fromRollout, err := rewrite.CanaryWeight(*ro); err == nil && fromRollout && s >= 0 && c >= 0 {
			pair := w[s] + w[c]
			w[c], w[s] = pair*float64(pct)/100, pair*float64(100-pct)/100
		}
	}
	total := 0.0
	for _, x := range w {
		total += x
	}
	out := make([]Weight, len(rl.Targets))
	for i, t := range rl.Targets {
		out[i] = Weight{Target: t.ModelRewrite, Clusters: t.Clusters}
		if total > 0 {
			out[i].Percent = 100 * w[i] / total
		}
	}
	return out
}

// Live is one Tier-2's latest analysis of a rewrite, as it serves it on
// GET /meridian/canary (a JSON array of these).
type Live struct {
	Rewrite string `json:"rewrite"`
	Model   string `json:"model"`
	// Instance and Region name the Tier-2 that analysed.
	Instance string `json:"instance"`
	Region   string `json:"region"`
	// At is when the analysis ran (RFC 3339).
	At     string `json:"at"`
	Canary Side   `json:"canary"`
	Stable Side   `json:"stable"`
	// Verdict is Pass, Fail or Inconclusive; Reason says why.
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
	// Action is what the evaluation decided (hold, advance, complete,
	// pause, abort) and Decision why.
	Action   string `json:"action"`
	Decision string `json:"decision"`
	// Cohort is how the split landed on this Tier-2's traffic.
	Cohort *Cohort `json:"cohort,omitempty"`
	// Error is set when the analysis could not run.
	Error string `json:"error,omitempty"`
}

// Side is one side's measurements over the analysis window.
type Side struct {
	Target    string  `json:"target"`
	Requests  int64   `json:"requests"`
	Errors    int64   `json:"errors"`
	Throttled int64   `json:"throttled"`
	TTFTP99Ms float64 `json:"ttftP99Ms"`
}

// targetIndex is the index of the target model in rl, or -1.
func targetIndex(rl *config.RewriteRule, model string) int {
	for i, t := range rl.Targets {
		if t.ModelRewrite == model {
			return i
		}
	}
	return -1
}
