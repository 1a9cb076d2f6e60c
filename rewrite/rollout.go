package rewrite

import (
	"errors"
	"fmt"
	"time"

	"github.com/meridian-router/meridian/config"
)

// Rollout statuses, as written in config.Rollout.Status. An empty status
// means Progressing.
const (
	StatusProgressing = "Progressing" // stepping; analysis runs
	StatusPaused      = "Paused"      // held at the current step; an operator resumes it
	StatusHealthy     = "Healthy"     // every step passed
	StatusDegraded    = "Degraded"    // analysis failed; the canary gets no traffic
	StatusAborted     = "Aborted"     // an operator aborted; the canary gets no traffic
)

// ErrBadRollout reports a rollout whose state cannot be interpreted.
var ErrBadRollout = errors.New("rewrite: invalid rollout")

// CanaryWeight returns the canary's share of its rule in percent, as the
// rollout's state dictates. fromRollout is false when the rollout has no
// steps and is neither aborted nor degraded: the targets' own weights then
// hold the split (a manual canary moved with `meridian canary set-weight`).
func CanaryWeight(r config.Rollout) (pct int64, fromRollout bool, err error) {
	switch r.Status {
	case StatusDegraded, StatusAborted:
		return 0, true, nil
	case "", StatusProgressing, StatusPaused, StatusHealthy:
	default:
		return 0, false, fmt.Errorf("%w: status %q: want %s, %s, %s, %s or %s", ErrBadRollout, r.Status,
			StatusProgressing, StatusPaused, StatusHealthy, StatusDegraded, StatusAborted)
	}
	if len(r.Steps) == 0 {
		return 0, false, nil
	}
	if r.Step < 0 || r.Step >= len(r.Steps) {
		return 0, false, fmt.Errorf("%w: step %d out of range with %d steps", ErrBadRollout, r.Step, len(r.Steps))
	}
	pct = r.Steps[r.Step]
	if pct < 0 || pct > 100 {
		return 0, false, fmt.Errorf("%w: steps[%d] is %d, want 0..100", ErrBadRollout, r.Step, pct)
	}
	return pct, true, nil
}

// Action is what a rollout evaluation decided.
type Action int

const (
	// Hold: nothing to write; look again at Decision.NextCheck.
	Hold Action = iota
	// Advance: the step passed; move to the next one.
	Advance
	// Complete: the last step passed; the rollout is Healthy.
	Complete
	// Pause: the interval elapsed without a verdict; wait for an operator.
	Pause
	// Abort: analysis failed; the canary goes to weight 0, status Degraded.
	Abort
)

func (a Action) String() string {
	switch a {
	case Hold:
		return "hold"
	case Advance:
		return "advance"
	case Complete:
		return "complete"
	case Pause:
		return "pause"
	case Abort:
		return "abort"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Decision is the outcome of Evaluate.
type Decision struct {
	Action Action
	// Rollout is the state to write (equal to the input for Hold).
	Rollout config.Rollout
	// CanaryPercent is the canary's weight under Rollout.
	CanaryPercent int64
	// Reason explains the decision for status output, events and logs.
	Reason string
	// NextCheck is when the current step's interval elapses; zero when the
	// rollout is not progressing.
	NextCheck time.Time
}

// Evaluate decides what a progressing rollout does next, given the latest
// analysis and the time now. It is pure: the caller supplies the clock and
// writes the returned state (revision-checked) when Action is not Hold.
//
// A failing analysis aborts at once, mid-step and while paused included,
// so a bad canary serves for at most one analysis period. A passing one advances only when
// the step's interval has elapsed. An inconclusive one at the end of the
// interval pauses the rollout rather than promoting on too little evidence,
// except at a last step of 100%: stable then serves nothing to compare
// with, so the step completes on the canary's own requests (MinRequests of
// them, none breaking a limit while stable still had traffic in the
// analysis window). Rollouts without steps are never advanced, only aborted on failure.
func Evaluate(r config.Rollout, a Result, now time.Time) (Decision, error) {
	pct, _, err := CanaryWeight(r)
	if err != nil {
		return Decision{}, err
	}
	d := Decision{Action: Hold, Rollout: r, CanaryPercent: pct}
	progressing := r.Status == "" || r.Status == StatusProgressing
	// A paused canary still takes its share of traffic, so a failure
	// aborts it as well.
	if !progressing && r.Status != StatusPaused {
		d.Reason = "rollout is " + r.Status
		return d, nil
	}
	if a.Verdict == Fail {
		next := r
		next.Status = StatusDegraded
		next.Reason = a.Reason
		d.Action, d.Rollout, d.CanaryPercent, d.Reason = Abort, next, 0, "analysis failed: "+a.Reason
		return d, nil
	}
	if !progressing {
		d.Reason = "rollout is " + r.Status
		return d, nil
	}
	if len(r.Steps) == 0 {
		d.Reason = "manual canary: no steps to advance"
		return d, nil
	}
	started, err := StepStarted(r)
	if err != nil {
		return Decision{}, err
	}
	if r.Interval <= 0 {
		return Decision{}, fmt.Errorf("%w: interval must be positive with steps, got %s", ErrBadRollout, r.Interval.D())
	}
	d.NextCheck = started.Add(r.Interval.D())
	if now.Before(d.NextCheck) {
		d.Reason = fmt.Sprintf("step %d of %d at %d%%: %s left", r.Step+1, len(r.Steps), pct, d.NextCheck.Sub(now))
		return d, nil
	}
	next := r
	next.Status = StatusProgressing
	switch a.Verdict {
	case Inconclusive:
		if a.StableIdle && pct == 100 && r.Step == len(r.Steps)-1 {
			next.Status, next.Reason = StatusHealthy, "last step at 100% held for its interval: "+a.Reason
			d.Action, d.Rollout, d.NextCheck = Complete, next, time.Time{}
			d.Reason = "last step (100%) held with no failure; stable serves nothing to compare with"
			return d, nil
		}
		next.Status, next.Reason = StatusPaused, a.Reason
		d.Action, d.Rollout, d.NextCheck = Pause, next, time.Time{}
		d.Reason = fmt.Sprintf("step %d of %d inconclusive: %s", r.Step+1, len(r.Steps), a.Reason)
		return d, nil
	case Pass:
	default:
		return Decision{}, fmt.Errorf("rewrite: unknown verdict %d", int(a.Verdict))
	}
	if r.Step == len(r.Steps)-1 {
		next.Status, next.Reason = StatusHealthy, a.Reason
		d.Action, d.Rollout, d.NextCheck = Complete, next, time.Time{}
		d.Reason = fmt.Sprintf("last step (%d%%) passed", pct)
		return d, nil
	}
	next.Step++
	next.StepStarted = now.UTC().Format(time.RFC3339)
	next.Reason = a.Reason
	d.Action, d.Rollout = Advance, next
	d.CanaryPercent = r.Steps[next.Step]
	d.NextCheck = now.Add(r.Interval.D())
	d.Reason = fmt.Sprintf("step %d passed; canary %d%% → %d%%", r.Step+1, pct, d.CanaryPercent)
	return d, nil
}

// StepStarted parses the rollout's StepStarted time (RFC 3339).
func StepStarted(r config.Rollout) (time.Time, error) {
	if r.StepStarted == "" {
		return time.Time{}, fmt.Errorf("%w: stepStarted is empty", ErrBadRollout)
	}
	t, err := time.Parse(time.RFC3339, r.StepStarted)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: stepStarted: %w", ErrBadRollout, err)
	}
	return t, nil
}

// TimeInStep is how long the rollout has been at its current step.
func TimeInStep(r config.Rollout, now time.Time) (time.Duration, error) {
	t, err := StepStarted(r)
	if err != nil {
		return 0, err
	}
	return now.Sub(t), nil
}
