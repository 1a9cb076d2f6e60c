package config_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/configtest"
)

const tenantDoc = "apiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: %s}\nspec:\n  limits:\n    requests: {limit: %d, per: 1m}\n"

func tenant(name string, limit int) string {
	return strings.NewReplacer("%s", name, "%d", itoa(limit)).Replace(tenantDoc)
}

func itoa(n int) string {
	b := []byte{}
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	if neg {
		b = append([]byte{'-'}, b...)
	}
	return string(b)
}

// runDir starts src and runs it until stop is called or the test ends,
// returning its updates.
func runDir(t *testing.T, src *config.DirSource) (updates <-chan *config.Snapshot, stop func()) {
	t.Helper()
	if err := src.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	updates = src.Subscribe()
	go src.Run(ctx)
	return updates, cancel
}

func TestDirSourceReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "tenants.yaml")
		write(t, path, tenant("a", 10))
		var outcomes []error
		src := &config.DirSource{Dir: dir, Logger: quiet, Interval: time.Second, OnReload: func(_ int64, err error) { outcomes = append(outcomes, err) }}
		updates, stop := runDir(t, src)

		// A valid change is picked up on the next tick.
		write(t, path, tenant("a", 20))
		time.Sleep(time.Second)
		synctest.Wait()
		s := <-updates
		if got := s.Tenant("a").Spec.Limits.Requests.Limit; got != 20 || s.Revision != 2 {
			t.Fatalf("after valid change: limit %d revision %d, want 20 and 2", got, s.Revision)
		}

		// An invalid change is reported and the running snapshot stays.
		write(t, path, tenant("a", -5))
		time.Sleep(time.Second)
		synctest.Wait()
		select {
		case s := <-updates:
			t.Fatalf("invalid change was published: revision %d", s.Revision)
		default:
		}
		if src.Snapshot().Tenant("a").Spec.Limits.Requests.Limit != 20 {
			t.Fatal("running snapshot changed after an invalid update")
		}
		if err := src.LastError(); err == nil || !strings.Contains(err.Error(), "spec.limits.requests.limit") {
			t.Fatalf("LastError = %v, want the validation error", err)
		}

		// Unchanged bytes are skipped: no reload attempt is counted.
		n := len(outcomes)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if len(outcomes) != n {
			t.Fatalf("unchanged directory reloaded %d times", len(outcomes)-n)
		}

		// Fixing the file recovers.
		write(t, path, tenant("a", 30))
		time.Sleep(time.Second)
		synctest.Wait()
		if s := <-updates; s.Tenant("a").Spec.Limits.Requests.Limit != 30 {
			t.Fatal("fixed configuration not applied")
		}
		stop()
		synctest.Wait()
		if _, open := <-updates; open {
			t.Fatal("subscription not closed on stop")
		}
	})
}

func TestDirSourceStartInvalid(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "t.yaml"), tenant("a", 0))
	if err := (&config.DirSource{Dir: dir}).Start(); err == nil {
		t.Fatal("Start accepted an invalid configuration")
	}
}

// waitFor reads snapshots until ok accepts one or the deadline passes.
func waitFor(t *testing.T, ch <-chan *config.Snapshot, ok func(*config.Snapshot) bool) *config.Snapshot {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case s, open := <-ch:
			if !open {
				t.Fatal("subscription closed")
			}
			if ok(s) {
				return s
			}
		case <-deadline.C:
			t.Fatal("no matching snapshot within 20s")
		}
	}
}

func docsOf(t *testing.T, yaml string) []config.Document {
	t.Helper()
	docs, errs := config.Decode("apply.yaml", []byte(yaml))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return docs
}

func limitOf(s *config.Snapshot, name string) int64 {
	if tn := s.Tenant(name); tn != nil && tn.Spec.Limits.Requests != nil {
		return tn.Spec.Limits.Requests.Limit
	}
	return -1
}

func TestEtcd(t *testing.T) {
	e := configtest.StartEtcd(t)
	ctx := t.Context()
	store := &config.Store{Client: e.Client}

	apply := e.Apply

	// Seed the whole example platform.
	docs, _, err := config.ReadDir(examples)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := store.PlanApply(ctx, docs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Changes) != len(docs) {
		t.Fatalf("first apply plans %d changes, want %d", len(plan.Changes), len(docs))
	}
	if _, err := store.Commit(ctx, plan); err != nil {
		t.Fatal(err)
	}
	again, err := store.PlanApply(ctx, docs, nil)
	if err != nil || len(again.Changes) != 0 {
		t.Fatalf("re-applying the same files plans %v changes (err %v), want none", again.Changes, err)
	}

	cache := filepath.Join(t.TempDir(), "lkg.json")
	rejected := make(chan error, 16)
	src := &config.EtcdSource{Client: e.Client, CacheFile: cache, Logger: quiet, OnReload: func(_ int64, err error) {
		if err != nil {
			select {
			case rejected <- err:
			default:
			}
		}
	}}
	if err := src.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := len(src.Snapshot().Objects); got != len(docs) {
		t.Fatalf("source holds %d objects, want %d", got, len(docs))
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	updates := src.Subscribe()
	go src.Run(runCtx)

	t.Run("watch", func(t *testing.T) {
		rev := apply(t, tenant("claims-team", 700))
		s := waitFor(t, updates, func(s *config.Snapshot) bool { return s.Revision >= rev })
		if limitOf(s, "claims-team") != 700 {
			t.Fatalf("limit = %d, want 700", limitOf(s, "claims-team"))
		}
	})

	t.Run("invalid update never applied", func(t *testing.T) {
		// Written behind Meridian's back, bypassing validation.
		bad := `{"apiVersion":"meridian.dev/v1alpha1","kind":"Tenant","metadata":{"name":"claims-team"},"spec":{"limits":{"requests":{"limit":-1,"per":"1m"}}}}`
		resp, err := e.Client.Put(ctx, config.KeyOf(config.DefaultPrefix, config.ObjectKey{Kind: "Tenant", Name: "claims-team"}), bad)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-rejected:
			if !strings.Contains(err.Error(), "/meridian/Tenant/claims-team: Tenant/claims-team: spec.limits.requests.limit: must be > 0") {
				t.Fatalf("rejection = %v, want the validation error naming the key", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the invalid write was not rejected within 20s")
		}
		select {
		case s := <-updates:
			t.Fatalf("an invalid snapshot was published at revision %d", s.Revision)
		default:
		}
		if got := limitOf(src.Snapshot(), "claims-team"); got != 700 || resp.Header.Revision <= src.Snapshot().Revision {
			t.Fatalf("running limit = %d at revision %d, want 700 (unchanged) below %d", got, src.Snapshot().Revision, resp.Header.Revision)
		}
		// The store refuses to plan on top of an invalid state: the result
		// would not validate.
		if _, err := store.PlanApply(ctx, docsOf(t, tenant("x", 1)), nil); err == nil {
			t.Fatal("planning on an invalid stored configuration succeeded")
		}
		// Replacing the broken object repairs it.
		// Repair it.
		fix := apply(t, tenant("claims-team", 800))
		waitFor(t, updates, func(s *config.Snapshot) bool { return s.Revision >= fix })
	})

	t.Run("conflicting applies", func(t *testing.T) {
		p1, err := store.PlanApply(ctx, docsOf(t, tenant("claims-team", 901)), nil)
		if err != nil {
			t.Fatal(err)
		}
		p2, err := store.PlanApply(ctx, docsOf(t, tenant("support-team", 902)), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Commit(ctx, p1); err != nil {
			t.Fatalf("first commit: %v", err)
		}
		if _, err := store.Commit(ctx, p2); !errors.Is(err, config.ErrConflict) {
			t.Fatalf("second commit: %v, want ErrConflict", err)
		}
		s, err := store.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if limitOf(s, "claims-team") != 901 || limitOf(s, "support-team") == 902 {
			t.Fatalf("stored limits claims=%d support=%d; want the winner's write only", limitOf(s, "claims-team"), limitOf(s, "support-team"))
		}
	})

	t.Run("invalid apply rejected", func(t *testing.T) {
		_, err := store.PlanApply(ctx, docsOf(t, "apiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: z}\nspec: {maxBand: Gold}\n"), nil)
		if _, ok := config.AsErrors(err); !ok || !strings.Contains(err.Error(), "apply.yaml: Tenant/z: spec.maxBand") {
			t.Fatalf("err = %v, want a validation error naming apply.yaml", err)
		}
	})

	t.Run("resume after disconnect", func(t *testing.T) {
		e.Stop()
		e.Start()
		rev := apply(t, tenant("claims-team", 1000))
		s := waitFor(t, updates, func(s *config.Snapshot) bool { return s.Revision >= rev })
		if limitOf(s, "claims-team") != 1000 {
			t.Fatalf("after restart limit = %d, want 1000", limitOf(s, "claims-team"))
		}
	})

	t.Run("etcd down at start uses last known good", func(t *testing.T) {
		want := src.Snapshot()
		e.Stop()
		defer e.Start()
		cold := &config.EtcdSource{Client: e.Client, Logger: quiet, CacheFile: cache, StartTimeout: 500 * time.Millisecond}
		if err := cold.Start(ctx); err != nil {
			t.Fatalf("start with etcd down: %v", err)
		}
		if !cold.FromLastKnownGood() {
			t.Fatal("not marked as last known good")
		}
		got := cold.Snapshot()
		if got.Revision != want.Revision || limitOf(got, "claims-team") != limitOf(want, "claims-team") {
			t.Fatalf("LKG revision %d limit %d, want %d and %d", got.Revision, limitOf(got, "claims-team"), want.Revision, limitOf(want, "claims-team"))
		}
		none := &config.EtcdSource{Client: e.Client, CacheFile: filepath.Join(t.TempDir(), "missing.json"), StartTimeout: 200 * time.Millisecond}
		if err := none.Start(ctx); err == nil {
			t.Fatal("start with etcd down and no cache succeeded")
		}
	})
}

var quiet = slog.New(slog.DiscardHandler)

// An empty or truncated tenants file (caught mid-write) is an error that
// keeps the running configuration, not a configuration without tenants.
func TestDirSourceEmptyFileKeepsRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "tenants.yaml")
		write(t, path, tenant("a", 10))
		src := &config.DirSource{Dir: dir, Logger: quiet, Interval: time.Second}
		updates, stop := runDir(t, src)
		truncated := tenant("a", 10)
		truncated = truncated[:strings.Index(truncated, " per:")] // cut mid-write: an unterminated flow mapping
		for _, content := range []string{"", "  \n# nothing yet\n", truncated} {
			write(t, path, content)
			time.Sleep(time.Second)
			synctest.Wait()
			select {
			case s := <-updates:
				t.Fatalf("%q was published: revision %d", content, s.Revision)
			default:
			}
			if src.Snapshot().Tenant("a") == nil {
				t.Fatal("the running tenants were removed")
			}
			if err := src.LastError(); err == nil || !strings.Contains(err.Error(), "tenants.yaml") || (content != truncated && !strings.Contains(err.Error(), "empty")) {
				t.Fatalf("LastError = %v, want the file named (as empty when it is)", err)
			}
		}
		stop()
		synctest.Wait()
	})
}
