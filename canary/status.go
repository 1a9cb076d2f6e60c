package canary

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/rewrite"
)

// Status is one rewrite's rollout as operators see it.
type Status struct {
	Rewrite string `json:"rewrite"`
	// Model is the public name the rule matches.
	Model  string `json:"model"`
	Stable string `json:"stable,omitempty"`
	Canary string `json:"canary,omitempty"`
	// State is the rollout's status (Progressing, Paused, Healthy,
	// Degraded, Aborted); empty without a rollout.
	State  string `json:"state,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Step is 1-based; 0 for a manual canary.
	Step        int     `json:"step,omitempty"`
	Steps       []int64 `json:"steps,omitempty"`
	Interval    string  `json:"interval,omitempty"`
	StepStarted string  `json:"stepStarted,omitempty"`
	// TimeInStep is how long the rollout has been in its current step
	// (or state), rounded to the second.
	TimeInStep string `json:"timeInStep,omitempty"`
	// Weights are every target's effective share of the rule.
	Weights []Weight `json:"weights"`
	// Stickiness is what keeps a caller on one side: "tenant" or
	// "header NAME" (falling back to the tenant without the header).
	Stickiness string `json:"stickiness"`
	// Salt seeds the stickiness hash; `canary start` writes a fresh one
	// per rollout.
	Salt string `json:"salt,omitempty"`
	// Live is the latest analysis of each Tier-2 asked (status --tier2).
	Live        []Live  `json:"live,omitempty"`
	pairPercent float64 // canary's share of the pair, for Observed

	// Observed merges the Live cohorts: how the split landed on the
	// traffic of every Tier-2 asked. Nil without live cohorts.
	Observed *Cohort `json:"observed,omitempty"`
}

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

func statusFrom(mr *config.ModelRewrite, rule int, now time.Time) Status {
	st := Status{Rewrite: mr.Metadata.Name}
	if rule >= len(mr.Spec.Rules) {
		return st
	}
	rl := mr.Spec.Rules[rule]
	for _, m := range rl.Matches {
		if m.Model != nil {
			st.Model = m.Model.Value
			break
		}
	}
	ro := mr.Spec.Rollout
	st.Weights = Shares(rl, ro)
	st.Stickiness = "tenant"
	if sk := mr.Spec.Stickiness; sk != nil {
		if sk.Key == "header" {
			st.Stickiness = "header " + sk.Header
		}
		st.Salt = sk.Salt
	}
	st.pairPercent = PairPercent(rl, ro)
	if ro == nil {
		return st
	}
	st.Stable, st.Canary, st.State, st.Reason = ro.Stable, ro.Canary, statusOf(ro), ro.Reason
	if len(ro.Steps) > 0 {
		st.Step, st.Steps, st.Interval = ro.Step+1, ro.Steps, ro.Interval.D().String()
	}
	st.StepStarted = ro.StepStarted
	if d, err := rewrite.TimeInStep(*ro, now); err == nil {
		st.TimeInStep = d.Round(time.Second).String()
	}
	return st
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

// FetchLive asks the Tier-2 at base (http://host:port) for its latest
// analyses.
func FetchLive(ctx context.Context, client *http.Client, base string) ([]Live, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/meridian/canary", nil)
	if err != nil {
		return nil, fmt.Errorf("canary: tier2 %s: %w", base, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("canary: tier2 %s: %w", base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("canary: tier2 %s: %w", base, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("canary: tier2 %s: %s: %s", base, resp.Status, strings.TrimSpace(string(b)))
	}
	var out []Live
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("canary: tier2 %s: %w", base, err)
	}
	return out, nil
}

// Attach adds to each status the live analyses of its rewrite, and merges
// their cohorts into Observed.
func Attach(sts []Status, live []Live) {
	for i := range sts {
		st := &sts[i]
		for _, l := range live {
			if l.Rewrite == st.Rewrite {
				st.Live = append(st.Live, l)
			}
		}
		var requests, canary int64
		var keys rewrite.CohortSample
		seen := false
		for _, l := range st.Live {
			if l.Cohort == nil || l.Error != "" {
				continue
			}
			seen = true
			requests += l.Cohort.Requests
			canary += l.Cohort.CanaryRequests
			keys.Merge(rewrite.SampleOf(l.Cohort.Sample))
		}
		if seen {
			c := NewCohort(st.pairPercent, requests, canary, keys)
			c.Sample = nil // merged; the per-Tier-2 samples stay in Live
			st.Observed = &c
		}
	}
}

// WriteTable renders statuses for people.
func WriteTable(w io.Writer, sts []Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, st := range sts {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "Rewrite:\t%s (model %s)\n", st.Rewrite, st.Model)
		if st.State == "" {
			fmt.Fprintf(tw, "Rollout:\tnone\n")
		} else {
			fmt.Fprintf(tw, "Rollout:\t%s → %s\n", st.Stable, st.Canary)
			fmt.Fprintf(tw, "State:\t%s\n", st.State)
			if st.Reason != "" {
				fmt.Fprintf(tw, "Reason:\t%s\n", st.Reason)
			}
			if st.Step > 0 {
				fmt.Fprintf(tw, "Step:\t%d of %d %v every %s\n", st.Step, len(st.Steps), st.Steps, st.Interval)
			} else {
				fmt.Fprintf(tw, "Step:\tmanual\n")
			}
			if st.TimeInStep != "" {
				fmt.Fprintf(tw, "Time in step:\t%s (since %s)\n", st.TimeInStep, st.StepStarted)
			}
		}
		if st.State != "" {
			salt := st.Salt
			if salt == "" {
				salt = "(none: every rollout draws the same cohort)"
			}
			fmt.Fprintf(tw, "Stickiness:\t%s, salt %s\n", st.Stickiness, salt)
		}
		fmt.Fprintf(tw, "Weights:\n")
		for _, wt := range st.Weights {
			where := ""
			if len(wt.Clusters) > 0 {
				where = " (clusters " + strings.Join(wt.Clusters, ",") + ")"
			}
			fmt.Fprintf(tw, "  %s\t%.1f%%%s\n", wt.Target, wt.Percent, where)
		}
		if c := st.Observed; c != nil {
			fmt.Fprintf(tw, "Observed:\tcanary %.1f%% of %d requests, %.1f%% of %d distinct keys (weight %.1f%%)\n",
				c.RequestPercent, c.Requests, c.KeyPercent, c.Keys, c.WeightPercent)
			if c.Warning != "" {
				fmt.Fprintf(tw, "WARNING:\t%s\n", c.Warning)
			}
		}
		if len(st.Live) > 0 {
			fmt.Fprintf(tw, "Analysis:\tTIER-2\tSIDE\tREQUESTS\tERRORS\t429s\tP99 TTFT\n")
			for _, l := range st.Live {
				if l.Error != "" {
					continue
				}
				for _, s := range []struct {
					name string
					Side
				}{{"canary", l.Canary}, {"stable", l.Stable}} {
					fmt.Fprintf(tw, "\t%s (%s)\t%s %s\t%d\t%d\t%d\t%.0fms\n", l.Instance, l.Region, s.name, s.Target, s.Requests, s.Errors, s.Throttled, s.TTFTP99Ms)
				}
			}
			// Verdicts after the table: their long lines would end its
			// column block.
			for _, l := range st.Live {
				if l.Error != "" {
					fmt.Fprintf(tw, "  %s: error: %s\n", l.Instance, l.Error)
					continue
				}
				fmt.Fprintf(tw, "  %s at %s: %s (%s) → %s: %s\n", l.Instance, l.At, l.Verdict, l.Reason, l.Action, l.Decision)
			}
		}
	}
	return tw.Flush()
}
