package rewrite

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
)

func TestEvaluate(t *testing.T) {
	start := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	pass := Result{Verdict: Pass, Reason: "within limits"}
	fail := Result{Verdict: Fail, Reason: "error rate 10.0%"}
	unsure := Result{Verdict: Inconclusive, Reason: "too few requests"}
	idle := Result{Verdict: Inconclusive, Reason: "too few requests: canary 40, stable 0", StableIdle: true}
	for _, tc := range []struct {
		name       string
		ro         *config.Rollout
		res        Result
		now        time.Time
		action     Action
		status     string
		step       int
		pct        int64
		nextCheck  time.Time
		reasonPart string
	}{
		{"mid-step pass holds", rollout("", 0, 5, 25, 50, 100), pass, start.Add(5 * time.Minute),
			Hold, "", 0, 5, start.Add(10 * time.Minute), "5m0s left"},
		{"pass at the interval advances", rollout(StatusProgressing, 0, 5, 25, 50, 100), pass, start.Add(10 * time.Minute),
			Advance, StatusProgressing, 1, 25, start.Add(20 * time.Minute), "canary 5% → 25%"},
		{"fail mid-step aborts at once", rollout(StatusProgressing, 1, 5, 25, 50, 100), fail, start.Add(time.Minute),
			Abort, StatusDegraded, 1, 0, time.Time{}, "analysis failed: error rate"},
		{"inconclusive mid-step holds", rollout(StatusProgressing, 1, 5, 25, 50, 100), unsure, start.Add(time.Minute),
			Hold, StatusProgressing, 1, 25, start.Add(10 * time.Minute), "left"},
		{"inconclusive at the interval pauses", rollout(StatusProgressing, 1, 5, 25, 50, 100), unsure, start.Add(11 * time.Minute),
			Pause, StatusPaused, 1, 25, time.Time{}, "step 2 of 4 inconclusive"},
		{"last step completes", rollout(StatusProgressing, 3, 5, 25, 50, 100), pass, start.Add(10 * time.Minute),
			Complete, StatusHealthy, 3, 100, time.Time{}, "last step (100%) passed"},
		{"last step of 100% completes on the canary alone", rollout(StatusProgressing, 3, 5, 25, 50, 100), idle, start.Add(10 * time.Minute),
			Complete, StatusHealthy, 3, 100, time.Time{}, "stable serves nothing to compare with"},
		{"last step of 100% without canary evidence pauses", rollout(StatusProgressing, 3, 5, 25, 50, 100), unsure, start.Add(10 * time.Minute),
			Pause, StatusPaused, 3, 100, time.Time{}, "inconclusive"},
		{"a last step below 100% still needs stable", rollout(StatusProgressing, 2, 5, 25, 50), idle, start.Add(10 * time.Minute),
			Pause, StatusPaused, 2, 50, time.Time{}, "inconclusive"},
		{"paused stays", rollout(StatusPaused, 2, 5, 25, 50, 100), pass, start.Add(time.Hour),
			Hold, StatusPaused, 2, 50, time.Time{}, "rollout is Paused"},
		{"paused still aborts on failure", rollout(StatusPaused, 2, 5, 25, 50, 100), fail, start.Add(time.Hour),
			Abort, StatusDegraded, 2, 0, time.Time{}, "analysis failed"},
		{"degraded stays at zero", rollout(StatusDegraded, 2, 5, 25, 50, 100), pass, start.Add(time.Hour),
			Hold, StatusDegraded, 2, 0, time.Time{}, ""},
		{"manual canary aborts on failure", &config.Rollout{Stable: "v2", Canary: "v3"}, fail, start,
			Abort, StatusDegraded, 0, 0, time.Time{}, ""},
		{"manual canary otherwise holds", &config.Rollout{Stable: "v2", Canary: "v3"}, pass, start,
			Hold, "", 0, 0, time.Time{}, "no steps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := *tc.ro
			d, err := Evaluate(in, tc.res, tc.now)
			if err != nil {
				t.Fatal(err)
			}
			if d.Action != tc.action || d.Rollout.Status != tc.status || d.Rollout.Step != tc.step || d.CanaryPercent != tc.pct {
				t.Fatalf("got %s status %q step %d at %d%% (%s); want %s status %q step %d at %d%%",
					d.Action, d.Rollout.Status, d.Rollout.Step, d.CanaryPercent, d.Reason, tc.action, tc.status, tc.step, tc.pct)
			}
			if !d.NextCheck.Equal(tc.nextCheck) {
				t.Errorf("NextCheck %v; want %v", d.NextCheck, tc.nextCheck)
			}
			if !strings.Contains(d.Reason, tc.reasonPart) {
				t.Errorf("reason %q does not contain %q", d.Reason, tc.reasonPart)
			}
			if in.Step != tc.ro.Step || in.Status != tc.ro.Status {
				t.Fatal("Evaluate changed its input")
			}
			if d.Action == Advance {
				if got, _ := StepStarted(d.Rollout); !got.Equal(tc.now) {
					t.Errorf("new stepStarted %v; want %v", got, tc.now)
				}
			}
			if d.Action == Abort && d.Rollout.Reason != tc.res.Reason {
				t.Errorf("recorded reason %q; want %q", d.Rollout.Reason, tc.res.Reason)
			}
			// The weight Evaluate reports is the one the resolver will apply.
			if pct, _, _ := CanaryWeight(d.Rollout); len(d.Rollout.Steps) > 0 && pct != d.CanaryPercent {
				t.Errorf("CanaryWeight(next) = %d; Decision says %d", pct, d.CanaryPercent)
			}
		})
	}
}

// TestWalkRollout drives a whole rollout with a fake clock, as Tier-2's
// analysis loop would: check every minute, write what Evaluate returns.
func TestWalkRollout(t *testing.T) {
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	ro := *rollout(StatusProgressing, 0, 5, 25, 50, 100)
	var weights []int64
	for i := 0; i < 100 && ro.Status == StatusProgressing; i++ {
		now = now.Add(time.Minute)
		d, err := Evaluate(ro, Result{Verdict: Pass}, now)
		if err != nil {
			t.Fatal(err)
		}
		if d.Action != Hold {
			weights = append(weights, d.CanaryPercent)
		}
		ro = d.Rollout
	}
	if ro.Status != StatusHealthy || len(weights) != 4 || weights[0] != 25 || weights[3] != 100 {
		t.Fatalf("walk ended %s with transitions %v; want Healthy after 25, 50, 100, 100", ro.Status, weights)
	}
	if in, _ := TimeInStep(ro, now); in != 10*time.Minute {
		t.Fatalf("time in last step %s; want 10m", in)
	}
}

func TestEvaluateBadRollout(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		ro   config.Rollout
	}{
		{"step out of range", config.Rollout{Steps: []int64{5}, Step: 3}},
		{"weight out of range", config.Rollout{Steps: []int64{500}}},
		{"no start time", config.Rollout{Steps: []int64{5, 100}, Interval: config.Duration(time.Minute)}},
		{"bad start time", config.Rollout{Steps: []int64{5, 100}, Interval: config.Duration(time.Minute), StepStarted: "yesterday"}},
		{"no interval", config.Rollout{Steps: []int64{5, 100}, StepStarted: "2026-11-29T10:00:00Z"}},
		{"unknown status", config.Rollout{Status: "Dancing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Evaluate(tc.ro, Result{Verdict: Pass}, now)
			if !errors.Is(err, ErrBadRollout) {
				t.Fatalf("err = %v; want ErrBadRollout", err)
			}
		})
	}
}
