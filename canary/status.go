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
	// Live is the latest analysis of each Tier-2 asked (status --tier2).
	Live []Live `json:"live,omitempty"`
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

// Attach adds to each status the live analyses of its rewrite.
func Attach(sts []Status, live []Live) {
	for i := range sts {
		for _, l := range live {
			if l.Rewrite == sts[i].Rewrite {
				sts[i].Live = append(sts[i].Live, l)
			}
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
		fmt.Fprintf(tw, "Weights:\n")
		for _, wt := range st.Weights {
			where := ""
			if len(wt.Clusters) > 0 {
				where = " (clusters " + strings.Join(wt.Clusters, ",") + ")"
			}
			fmt.Fprintf(tw, "  %s\t%.1f%%%s\n", wt.Target, wt.Percent, where)
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
