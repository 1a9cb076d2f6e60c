package canary

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/configtest"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/rewrite"
)

// versionsGateway is the gateway gw that serves chat-v1 (pool a) and
// chat-v2 (pool b); more schedulers may follow, then other documents.
const versionsGateway = `apiVersion: meridian.dev/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: gw}
spec:
  bbr: {enabled: true}
  schedulers:
  - {name: a, modelName: chat-v1, modelSelector: {matchLabels: {pool: a}}}
  - {name: b, modelName: chat-v2, modelSelector: {matchLabels: {pool: b}}}
`

const platform = versionsGateway + `  - {name: c, modelName: other, modelSelector: {matchLabels: {pool: c}}}
---
# the public name
` + testkit.ChatRewrite + `    targets:
    - {modelRewrite: chat-v1, weight: 80}
    - {modelRewrite: other, weight: 20}
`

var t0 = time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)

// backends runs a test against etcd and against a directory.
func backends(t *testing.T, f func(t *testing.T, r *Rollouts, raw func() string)) {
	t.Run("etcd", func(t *testing.T) {
		e := configtest.StartEtcd(t)
		store := &config.Store{Client: e.Client}
		e.Apply(t, platform)
		raw := func() string {
			resp, err := e.Client.Get(context.Background(), config.KeyOf(config.DefaultPrefix, config.ObjectKey{Kind: config.KindModelRewrite, Name: "chat"}))
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("read rewrite: %v", err)
			}
			return string(resp.Kvs[0].Value)
		}
		f(t, &Rollouts{Backend: NewEtcd(store), Now: func() time.Time { return t0 }}, raw)
	})
	t.Run("dir", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "platform.yaml")
		if err := os.WriteFile(path, []byte(platform), 0o644); err != nil {
			t.Fatal(err)
		}
		raw := func() string {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
		f(t, &Rollouts{Backend: &Dir{Path: filepath.Dir(path)}, Now: func() time.Time { return t0 }}, raw)
	})
}

func weights(st Status) map[string]float64 {
	m := map[string]float64{}
	for _, w := range st.Weights {
		m[w.Target] = w.Percent
	}
	return m
}

func TestLifecycle(t *testing.T) {
	backends(t, func(t *testing.T, r *Rollouts, raw func() string) {
		ctx := context.Background()
		before := raw()
		st, err := r.Start(ctx, StartOptions{Model: "chat", To: "chat-v2", Steps: []int64{10, 50, 100}, Interval: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		// chat-v1 had 80% of the rule; the rollout splits that share.
		if w := weights(st); st.State != rewrite.StatusProgressing || st.Step != 1 || w["chat-v2"] != 8 || w["chat-v1"] != 72 || w["other"] != 20 {
			t.Fatalf("after start: %+v", st)
		}
		st, err = r.Promote(ctx, "chat", false)
		if err != nil {
			t.Fatal(err)
		}
		if w := weights(st); st.Step != 2 || w["chat-v2"] != 40 {
			t.Fatalf("after promote: %+v", st)
		}
		st, err = r.SetWeight(ctx, "chat", 30)
		if err != nil {
			t.Fatal(err)
		}
		if w := weights(st); st.Step != 0 || w["chat-v2"] != 24 || w["chat-v1"] != 56 || w["other"] != 20 {
			t.Fatalf("after set-weight: %+v", st)
		}
		st, err = r.Abort(ctx, "chat")
		if err != nil {
			t.Fatal(err)
		}
		if w := weights(st); st.State != rewrite.StatusAborted || w["chat-v2"] != 0 || w["chat-v1"] != 80 {
			t.Fatalf("after abort: %+v", st)
		}
		if _, err := r.Promote(ctx, "chat", true); !errors.Is(err, ErrNoRollout) {
			t.Fatalf("promote after abort: %v, want ErrNoRollout", err)
		}
		if _, err := r.Undo(ctx, "chat"); err != nil {
			t.Fatal(err)
		}
		st, err = r.Status(ctx, "chat")
		if err != nil {
			t.Fatal(err)
		}
		if w := weights(st); st.State != "" || len(w) != 2 || w["chat-v1"] != 80 {
			t.Fatalf("after undo: %+v", st)
		}
		// A manual canary, promoted in full, then undone.
		if _, err := r.Start(ctx, StartOptions{Model: "chat", To: "chat-v2", Weight: 25}); err != nil {
			t.Fatal(err)
		}
		st, err = r.Promote(ctx, "chat", true)
		if err != nil {
			t.Fatal(err)
		}
		if w := weights(st); st.State != rewrite.StatusHealthy || w["chat-v2"] != 80 || len(w) != 2 {
			t.Fatalf("after full promotion: %+v", st)
		}
		list, err := r.List(ctx)
		if err != nil || len(list) != 1 || list[0].Rewrite != "chat" {
			t.Fatalf("list: %+v, %v", list, err)
		}
		if _, err := r.Undo(ctx, "chat"); err != nil {
			t.Fatal(err)
		}
		if st, _ := r.Status(ctx, "chat"); weights(st)["chat-v1"] != 80 {
			t.Fatalf("undo after full promotion: %+v", st)
		}
		if _, ok := r.Backend.(*Dir); ok {
			// Only the rewrite's own document is re-rendered.
			gw := before[:strings.Index(before, "---")]
			if !strings.HasPrefix(raw(), gw) {
				t.Fatalf("directory write changed other documents:\n%s", raw())
			}
		}
	})
}

func TestInvalidCommandsChangeNothing(t *testing.T) {
	backends(t, func(t *testing.T, r *Rollouts, raw func() string) {
		ctx := context.Background()
		before := raw()
		cases := []struct {
			name string
			run  func() error
			want error
		}{
			{"unknown model", func() error { _, err := r.Start(ctx, StartOptions{Model: "nope", To: "chat-v2"}); return err }, ErrUnknownModel},
			{"weight above range", func() error {
				_, err := r.Start(ctx, StartOptions{Model: "chat", To: "chat-v2", Weight: 150})
				return err
			}, ErrBadWeight},
			{"weight and steps", func() error {
				_, err := r.Start(ctx, StartOptions{Model: "chat", To: "chat-v2", Weight: 5, Steps: []int64{5}, Interval: time.Minute})
				return err
			}, ErrBadSteps},
			{"decreasing steps", func() error {
				_, err := r.Start(ctx, StartOptions{Model: "chat", To: "chat-v2", Steps: []int64{50, 5}, Interval: time.Minute})
				return err
			}, ErrBadSteps},
			{"steps without interval", func() error {
				_, err := r.Start(ctx, StartOptions{Model: "chat", To: "chat-v2", Steps: []int64{5}})
				return err
			}, ErrBadSteps},
			{"promote without rollout", func() error { _, err := r.Promote(ctx, "chat", false); return err }, ErrNoRollout},
			{"abort without rollout", func() error { _, err := r.Abort(ctx, "chat"); return err }, ErrNoRollout},
			{"set-weight without rollout", func() error { _, err := r.SetWeight(ctx, "chat", 10); return err }, ErrNoRollout},
			{"undo without rollout", func() error { _, err := r.Undo(ctx, "chat"); return err }, ErrNothingUndo},
		}
		for _, c := range cases {
			if err := c.run(); !errors.Is(err, c.want) {
				t.Errorf("%s: %v, want %v", c.name, err, c.want)
			}
		}
		// A target no scheduler serves fails validation.
		_, err := r.Start(ctx, StartOptions{Model: "chat", To: "chat-v9"})
		if _, ok := config.AsErrors(err); !ok || !strings.Contains(err.Error(), `"chat-v9" is not served`) {
			t.Errorf("unserved target: %v", err)
		}
		if raw() != before {
			t.Fatalf("an invalid command changed the rewrite:\n%s", raw())
		}
		// With a rollout running: a second start and out-of-range
		// weights are refused and change nothing.
		if _, err := r.Start(ctx, StartOptions{Model: "chat", To: "chat-v2", Weight: 5}); err != nil {
			t.Fatal(err)
		}
		running := raw()
		if _, err := r.Start(ctx, StartOptions{Model: "chat", To: "chat-v2", Weight: 10}); !errors.Is(err, ErrInProgress) {
			t.Errorf("second start: %v", err)
		}
		for _, w := range []int64{-1, 0, 100, 101} {
			if _, err := r.SetWeight(ctx, "chat", w); !errors.Is(err, ErrBadWeight) {
				t.Errorf("set-weight %d: %v", w, err)
			}
		}
		if raw() != running {
			t.Fatalf("an invalid command changed the running rollout")
		}
	})
}

func TestRacingOperatorsConflict(t *testing.T) {
	e := configtest.StartEtcd(t)
	store := &config.Store{Client: e.Client}
	e.Apply(t, platform)
	ctx := context.Background()
	slow := NewEtcd(store)
	a := &Rollouts{Backend: slow}
	b := &Rollouts{Backend: NewEtcd(store)}
	if _, err := a.Start(ctx, StartOptions{Model: "chat", To: "chat-v2", Weight: 5}); err != nil {
		t.Fatal(err)
	}
	// Operator A reads, then B aborts before A commits its weight change.
	var bErr error
	slow.beforeCommit = func() {
		slow.beforeCommit = nil
		_, bErr = b.Abort(ctx, "chat")
	}
	_, aErr := a.SetWeight(ctx, "chat", 50)
	if bErr != nil {
		t.Fatalf("the first writer failed: %v", bErr)
	}
	if !errors.Is(aErr, config.ErrConflict) {
		t.Fatalf("the second writer: %v, want a conflict", aErr)
	}
	st, err := a.Status(ctx, "chat")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != rewrite.StatusAborted || weights(st)["chat-v2"] != 0 {
		t.Fatalf("state after the race: %+v", st)
	}
	// SwapRollout from a stale state is a conflict too.
	stale := config.Rollout{Stable: "chat-v1", Canary: "chat-v2", Status: rewrite.StatusProgressing}
	if err := slow.SwapRollout(ctx, "chat", stale, config.Rollout{}); !errors.Is(err, config.ErrConflict) {
		t.Fatalf("swap from a stale rollout: %v", err)
	}
}
