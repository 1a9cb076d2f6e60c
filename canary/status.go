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
	"github.com/meridian-router/meridian/rollout"
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
	Weights []rollout.Weight `json:"weights"`
	// Stickiness is what keeps a caller on one side: "tenant" or
	// "header NAME" (falling back to the tenant without the header).
	Stickiness string `json:"stickiness"`
	// Salt seeds the stickiness hash; `canary start` writes a fresh one
	// per rollout.
	Salt string `json:"salt,omitempty"`
	// Live is the latest analysis of each Tier-2 asked (status --tier2).
	Live        []rollout.Live `json:"live,omitempty"`
	pairPercent float64        // canary's share of the pair, for Observed

	// Observed merges the Live cohorts: how the split landed on the
	// traffic of every Tier-2 asked. Nil without live cohorts.
	Observed *rollout.Cohort `json:"observed,omitempty"`
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
	st.Weights = rollout.Shares(rl, ro)
	st.Stickiness = "tenant"
	if sk := mr.Spec.Stickiness; sk != nil {
		if sk.Key == "header" {
			st.Stickiness = "header " + sk.Header
		}
		st.Salt = sk.Salt
	}
	st.pairPercent = rollout.PairPercent(rl, ro)
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

// FetchLive asks the Tier-2 at base (http://host:port) for its latest
// analyses.
func FetchLive(ctx context.Context, client *http.Client, base string) ([]rollout.Live, error) {
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
	var out []rollout.Live
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("canary: tier2 %s: %w", base, err)
	}
	return out, nil
}

// Attach adds to each status the live analyses of its rewrite, and merges
// their cohorts into Observed.
func Attach(sts []Status, live []rollout.Live) {
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
			c := rollout.NewCohort(st.pairPercent, requests, canary, keys)
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
					rollout.Side
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
