// Package canary carries out `meridian canary`: it moves an
// InferenceModelRewrite's rollout from one state to the next (start, set
// the weight, promote, abort, undo) with one validated, revision-checked
// write per command, and reports a rollout's state for people.
//
// What it decides: whether a command is allowed in the rollout's current
// state and what the rewrite looks like afterwards. What it does not: how
// requests split (rewrite resolves that from the state written here),
// whether a step passed (Tier-2's analysis, with rewrite.Analyze and
// rewrite.Evaluate), or when (Tier-2 advances steps on its own clock).
//
// A command that is not allowed, names an unknown model or would leave an
// invalid configuration fails before anything is written. Two operators
// racing on the same rewrite: the first write wins and the second gets
// config.ErrConflict, whatever they changed.
package canary

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/rewrite"
)

// UndoAnnotation holds, on the rewrite, the rule's targets as they were
// before `canary start`, so `canary undo` can restore them.
const UndoAnnotation = "meridian.dev/canary-undo"

// Errors a command can fail with, besides validation and conflicts.
var (
	ErrUnknownModel = errors.New("canary: unknown model")
	ErrInProgress   = errors.New("canary: a rollout is already in progress")
	ErrNoRollout    = errors.New("canary: no rollout in progress")
	ErrBadWeight    = errors.New("canary: invalid weight")
	ErrBadSteps     = errors.New("canary: invalid steps")
	ErrNothingUndo  = errors.New("canary: nothing to undo")
)

// Rollouts runs canary commands against a Backend.
type Rollouts struct {
	Backend Backend
	// Now is the clock stamped into stepStarted. Nil means time.Now.
	Now func() time.Time
}

func (r *Rollouts) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// StartOptions describe a new rollout.
type StartOptions struct {
	// Model is the public model name (or the rewrite's name).
	Model string
	// To is the canary's target model; it must be served somewhere.
	To string
	// Weight is the canary's share in percent (1..99) of a manual canary,
	// moved later with SetWeight. Zero means 5 when Steps is empty.
	Weight int64
	// Steps are the canary's weights in percent of a stepped rollout,
	// increasing, each 1..100; Tier-2 advances through them every Interval
	// while the analysis passes. Empty means a manual canary.
	Steps []int64
	// Interval is the time per step; required with Steps.
	Interval time.Duration
	// Analysis overrides the thresholds (nil: rewrite's defaults).
	Analysis *config.AnalysisLimit
	// Salt seeds the rollout's stickiness hash (spec.stickiness.salt).
	// Empty means a fresh one, the rewrite's name plus a new rollout id, so
	// each rollout samples its own cohort of callers instead of the same
	// keys every time. Give one only to repeat a past rollout's cohort.
	Salt string
}

// rolloutID names one rollout in its salt: when it started and 48 random
// bits, so two rollouts started in the same instant still differ.
func rolloutID(now time.Time) string {
	var b [6]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return now.UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}

// Start begins a rollout of o.To behind o.Model. The stable target is the
// rule's heaviest other target. A rollout that is progressing or paused
// must be promoted, aborted or undone first; a finished one is replaced.
func (r *Rollouts) Start(ctx context.Context, o StartOptions) (Status, error) {
	if o.To == "" {
		return Status{}, fmt.Errorf("%w: --to is required", ErrBadSteps)
	}
	switch {
	case len(o.Steps) > 0 && o.Weight != 0:
		return Status{}, fmt.Errorf("%w: set either --weight (a manual canary) or --steps, not both", ErrBadSteps)
	case len(o.Steps) > 0:
		prev := int64(0)
		for i, s := range o.Steps {
			if s < 1 || s > 100 || s < prev {
				return Status{}, fmt.Errorf("%w: steps must increase within 1..100, got %d at position %d", ErrBadSteps, s, i+1)
			}
			prev = s
		}
		if o.Interval <= 0 {
			return Status{}, fmt.Errorf("%w: --interval must be positive with --steps", ErrBadSteps)
		}
	case o.Weight == 0:
		o.Weight = 5
	case o.Weight < 1 || o.Weight > 99:
		return Status{}, fmt.Errorf("%w: %d%%: a canary's weight is 1..99 (use promote --full for 100)", ErrBadWeight, o.Weight)
	}
	return r.change(ctx, o.Model, func(mr *config.ModelRewrite, rule int) error {
		if ro := mr.Spec.Rollout; ro != nil && inProgress(ro) {
			return fmt.Errorf("%w for %s: %s to %s is %s; promote, abort or undo it first", ErrInProgress, o.Model, ro.Stable, ro.Canary, statusOf(ro))
		}
		rl := &mr.Spec.Rules[rule]
		stable, canary := -1, -1
		for i, t := range rl.Targets {
			if t.ModelRewrite == o.To {
				canary = i
			} else if stable < 0 || t.Weight > rl.Targets[stable].Weight {
				stable = i
			}
		}
		if stable < 0 {
			return fmt.Errorf("%w: %s has no target other than %s to keep as stable", ErrBadSteps, o.Model, o.To)
		}
		saved, _ := json.Marshal(rl.Targets)
		if mr.Metadata.Annotations == nil {
			mr.Metadata.Annotations = map[string]string{}
		}
		mr.Metadata.Annotations[UndoAnnotation] = string(saved)
		if canary < 0 {
			// The new target takes half of stable's weight, so the pair
			// keeps the rule share stable had (the rollout splits it).
			for i := range rl.Targets {
				rl.Targets[i].Weight *= 2
			}
			rl.Targets[stable].Weight /= 2
			rl.Targets = append(rl.Targets, config.RewriteTarget{ModelRewrite: o.To, Weight: rl.Targets[stable].Weight})
			canary = len(rl.Targets) - 1
			reduce(rl)
		}
		ro := &config.Rollout{
			Stable: rl.Targets[stable].ModelRewrite, Canary: o.To,
			StepStarted: stamp(r.now()), Status: rewrite.StatusProgressing,
			Analysis: o.Analysis,
		}
		if len(o.Steps) > 0 {
			ro.Steps, ro.Interval = append([]int64(nil), o.Steps...), config.Duration(o.Interval)
			ro.Reason = "started by operator"
		} else {
			setPair(rl, stable, canary, o.Weight)
			ro.Reason = fmt.Sprintf("started by operator at %d%%", o.Weight)
		}
		mr.Spec.Rollout = ro
		// A new cohort per rollout: the salt reshuffles which keys fall in
		// the canary's slice. It stays fixed until the next start, so a key
		// keeps its side (and only moves onto the canary as it grows).
		salt := o.Salt
		if salt == "" {
			salt = mr.Metadata.Name + "/" + rolloutID(r.now())
		}
		if mr.Spec.Stickiness == nil {
			mr.Spec.Stickiness = &config.Stickiness{}
		}
		mr.Spec.Stickiness.Salt = salt
		return nil
	})
}

// SetWeight moves a rollout's canary to pct percent (1..99) and holds it
// there: a stepped rollout becomes a manual one (Tier-2 still aborts it if
// the analysis fails). 0 is abort and 100 is promote --full.
func (r *Rollouts) SetWeight(ctx context.Context, model string, pct int64) (Status, error) {
	switch {
	case pct == 0:
		return Status{}, fmt.Errorf("%w: 0%%: use `meridian canary abort` to take the canary out", ErrBadWeight)
	case pct == 100:
		return Status{}, fmt.Errorf("%w: 100%%: use `meridian canary promote --full` to send everything to the canary", ErrBadWeight)
	case pct < 0 || pct > 100:
		return Status{}, fmt.Errorf("%w: %d%%: want 1..99", ErrBadWeight, pct)
	}
	return r.change(ctx, model, func(mr *config.ModelRewrite, rule int) error {
		ro, err := running(mr, model, "set the weight of")
		if err != nil {
			return err
		}
		rl := &mr.Spec.Rules[rule]
		stable, canary := targetIndex(rl, ro.Stable), targetIndex(rl, ro.Canary)
		if stable < 0 || canary < 0 {
			return fmt.Errorf("%w: %s's rule no longer holds both %s and %s", ErrNoRollout, model, ro.Stable, ro.Canary)
		}
		setPair(rl, stable, canary, pct)
		ro.Steps, ro.Step, ro.Interval = nil, 0, 0
		ro.Status = rewrite.StatusProgressing
		ro.StepStarted = stamp(r.now())
		ro.Reason = fmt.Sprintf("weight set to %d%% by operator", pct)
		return nil
	})
}

// Promote moves a stepped rollout to its next step (resuming it when
// paused). With full, or from the last step, or for a manual canary, the
// canary takes the stable target's whole share and the rollout is Healthy.
func (r *Rollouts) Promote(ctx context.Context, model string, full bool) (Status, error) {
	return r.change(ctx, model, func(mr *config.ModelRewrite, rule int) error {
		ro, err := running(mr, model, "promote")
		if err != nil {
			return err
		}
		now := stamp(r.now())
		if !full && len(ro.Steps) > 0 && ro.Step < len(ro.Steps)-1 {
			ro.Step++
			ro.Status, ro.StepStarted = rewrite.StatusProgressing, now
			ro.Reason = fmt.Sprintf("promoted by operator to step %d (%d%%)", ro.Step+1, ro.Steps[ro.Step])
			return nil
		}
		rl := &mr.Spec.Rules[rule]
		stable, canary := targetIndex(rl, ro.Stable), targetIndex(rl, ro.Canary)
		if canary < 0 {
			return fmt.Errorf("%w: %s's rule no longer holds %s", ErrNoRollout, model, ro.Canary)
		}
		if stable >= 0 {
			rl.Targets[canary].Weight += rl.Targets[stable].Weight
			rl.Targets = append(rl.Targets[:stable], rl.Targets[stable+1:]...)
			reduce(rl)
		}
		if len(ro.Steps) > 0 {
			ro.Step = len(ro.Steps) - 1
		}
		ro.Status, ro.StepStarted, ro.Reason = rewrite.StatusHealthy, now, "fully promoted by operator"
		return nil
	})
}

// Abort sends the canary's traffic back to stable (weight 0, status
// Aborted). The targets stay as they are, so the rollout can be inspected
// and then undone.
func (r *Rollouts) Abort(ctx context.Context, model string) (Status, error) {
	return r.change(ctx, model, func(mr *config.ModelRewrite, _ int) error {
		ro, err := running(mr, model, "abort")
		if err != nil {
			return err
		}
		ro.Status, ro.Reason = rewrite.StatusAborted, "aborted by operator"
		ro.StepStarted = stamp(r.now())
		return nil
	})
}

// Undo restores the rule's targets as they were before `canary start` and
// removes the rollout, whatever state it reached (a full promotion too).
func (r *Rollouts) Undo(ctx context.Context, model string) (Status, error) {
	return r.change(ctx, model, func(mr *config.ModelRewrite, rule int) error {
		saved, ok := mr.Metadata.Annotations[UndoAnnotation]
		if !ok {
			return fmt.Errorf("%w: %s has no rollout started by `meridian canary start`", ErrNothingUndo, model)
		}
		var targets []config.RewriteTarget
		if err := json.Unmarshal([]byte(saved), &targets); err != nil {
			return fmt.Errorf("canary: annotation %s: %w", UndoAnnotation, err)
		}
		mr.Spec.Rules[rule].Targets = targets
		mr.Spec.Rollout = nil
		delete(mr.Metadata.Annotations, UndoAnnotation)
		if len(mr.Metadata.Annotations) == 0 {
			mr.Metadata.Annotations = nil
		}
		return nil
	})
}

// Status reports the rewrite that serves model.
func (r *Rollouts) Status(ctx context.Context, model string) (Status, error) {
	snap, err := r.Backend.Load(ctx)
	if err != nil {
		return Status{}, err
	}
	mr, rule, err := find(snap, model)
	if err != nil {
		return Status{}, err
	}
	return statusFrom(mr, rule, r.now()), nil
}

// List reports every rewrite that has a rollout, sorted by name.
func (r *Rollouts) List(ctx context.Context) ([]Status, error) {
	snap, err := r.Backend.Load(ctx)
	if err != nil {
		return nil, err
	}
	var out []Status
	for _, mr := range snap.Rewrites {
		if mr.Spec.Rollout == nil {
			continue
		}
		rule := ruleOf(mr, mr.Spec.Rollout)
		out = append(out, statusFrom(mr, rule, r.now()))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rewrite < out[j].Rewrite })
	return out, nil
}

// change finds the rewrite serving model, applies fn to the rule that
// serves it and writes the result; it returns the new status.
func (r *Rollouts) change(ctx context.Context, model string, fn func(mr *config.ModelRewrite, rule int) error) (Status, error) {
	snap, err := r.Backend.Load(ctx)
	if err != nil {
		return Status{}, err
	}
	cur, _, err := find(snap, model)
	if err != nil {
		return Status{}, err
	}
	var after config.ModelRewrite
	var afterRule int
	err = r.Backend.Update(ctx, cur.Metadata.Name, func(mr *config.ModelRewrite) error {
		// Find the rule again in what Update read: it is the state written.
		_, rule, err := ruleFor(mr, model)
		if err != nil {
			return err
		}
		if err := fn(mr, rule); err != nil {
			return err
		}
		after, afterRule = *mr, rule
		return nil
	})
	if err != nil {
		if errors.Is(err, config.ErrConflict) {
			return Status{}, fmt.Errorf("canary: %s: %w", model, err)
		}
		return Status{}, err
	}
	return statusFrom(&after, afterRule, r.now()), nil
}

// find returns the rewrite and rule serving model: the rule that matches
// the public name exactly, or else the rewrite of that name when it has one
// rule (or one with a rollout).
func find(snap *config.Snapshot, model string) (*config.ModelRewrite, int, error) {
	names := slices.Sorted(maps.Keys(snap.Rewrites))
	for _, n := range names {
		if _, rule, err := ruleFor(snap.Rewrites[n], model); err == nil {
			if matchesExactly(snap.Rewrites[n], rule, model) {
				return snap.Rewrites[n], rule, nil
			}
		}
	}
	if mr, ok := snap.Rewrites[model]; ok {
		_, rule, err := ruleFor(mr, model)
		return mr, rule, err
	}
	return nil, 0, fmt.Errorf("%w %q: no InferenceModelRewrite matches it (public names: %v)", ErrUnknownModel, model, publicNames(snap))
}

// ruleFor returns the rule of mr that serves model: the one matching it
// exactly; else, when model is mr's name, its only rule or the rule holding
// its rollout.
func ruleFor(mr *config.ModelRewrite, model string) (*config.ModelRewrite, int, error) {
	for i := range mr.Spec.Rules {
		if matchesExactly(mr, i, model) {
			return mr, i, nil
		}
	}
	if mr.Metadata.Name == model {
		if ro := mr.Spec.Rollout; ro != nil {
			return mr, ruleOf(mr, ro), nil
		}
		if len(mr.Spec.Rules) == 1 {
			return mr, 0, nil
		}
		return nil, 0, fmt.Errorf("%w %q: InferenceModelRewrite %s has %d rules; name the public model instead", ErrUnknownModel, model, mr.Metadata.Name, len(mr.Spec.Rules))
	}
	return nil, 0, fmt.Errorf("%w %q", ErrUnknownModel, model)
}

func matchesExactly(mr *config.ModelRewrite, rule int, model string) bool {
	for _, m := range mr.Spec.Rules[rule].Matches {
		if m.Model != nil && m.Model.Value == model {
			return true
		}
	}
	return false
}

// ruleOf returns the rule holding ro's canary (or stable), else 0.
func ruleOf(mr *config.ModelRewrite, ro *config.Rollout) int {
	for _, name := range []string{ro.Canary, ro.Stable} {
		for i := range mr.Spec.Rules {
			if targetIndex(&mr.Spec.Rules[i], name) >= 0 {
				return i
			}
		}
	}
	return 0
}

func publicNames(snap *config.Snapshot) []string {
	var out []string
	for _, mr := range snap.Rewrites {
		for _, rl := range mr.Spec.Rules {
			for _, m := range rl.Matches {
				if m.Model != nil {
					out = append(out, m.Model.Value)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func targetIndex(rl *config.RewriteRule, model string) int {
	for i, t := range rl.Targets {
		if t.ModelRewrite == model {
			return i
		}
	}
	return -1
}

func statusOf(ro *config.Rollout) string {
	if ro.Status == "" {
		return rewrite.StatusProgressing
	}
	return ro.Status
}

// inProgress reports a rollout that still splits traffic under an
// operator's or the analysis's control.
func inProgress(ro *config.Rollout) bool {
	s := statusOf(ro)
	return s == rewrite.StatusProgressing || s == rewrite.StatusPaused
}

// running returns mr's rollout when it is in progress.
func running(mr *config.ModelRewrite, model, verb string) (*config.Rollout, error) {
	ro := mr.Spec.Rollout
	if ro == nil {
		return nil, fmt.Errorf("%w for %s: nothing to %s", ErrNoRollout, model, verb)
	}
	if !inProgress(ro) {
		return nil, fmt.Errorf("%w for %s: the rollout of %s is %s; nothing to %s", ErrNoRollout, model, ro.Canary, statusOf(ro), verb)
	}
	return ro, nil
}

// setPair gives the canary pct percent of the pair's combined weight,
// keeping every other target's share of the rule.
func setPair(rl *config.RewriteRule, stable, canary int, pct int64) {
	pair := rl.Targets[stable].Weight
	if canary != stable {
		pair += rl.Targets[canary].Weight
	}
	for i := range rl.Targets {
		rl.Targets[i].Weight *= 100
	}
	rl.Targets[stable].Weight = pair * (100 - pct)
	rl.Targets[canary].Weight = pair * pct
	reduce(rl)
}

// reduce divides the rule's weights by their greatest common divisor, so
// they stay small (GIE caps a weight at 1,000,000).
func reduce(rl *config.RewriteRule) {
	g := int64(0)
	for _, t := range rl.Targets {
		g = gcd(g, t.Weight)
	}
	if g > 1 {
		for i := range rl.Targets {
			rl.Targets[i].Weight /= g
		}
	}
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// stamp formats a stepStarted time. Sub-second precision matters for short
// steps; rewrite.StepStarted parses it as RFC 3339.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
