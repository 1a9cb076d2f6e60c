package config_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/configtest"
)

// records keeps the log records at Error level, for tests that assert a
// refusal is logged loudly.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }
func (r *records) has(sub string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

// needTopology is what Tier-2 asks of a configuration (tier2.Usable).
func needTopology(s *config.Snapshot) error {
	if s.Topology == nil {
		return errors.New("no Topology")
	}
	return nil
}

// lkgRig is the example platform in a real etcd, followed by a source
// that keeps a last-known-good copy and refuses topology-less states.
type lkgRig struct {
	e       *configtest.Etcd
	cache   string
	src     *config.EtcdSource
	updates <-chan *config.Snapshot
	refused chan error
	reach   chan bool
	logs    *records
	good    *config.Snapshot
	lkg     []byte // the copy's bytes once the platform is in force
}

func newLKGRig(t *testing.T) *lkgRig {
	t.Helper()
	e := configtest.StartEtcd(t)
	docs, _, err := config.ReadDir(examples)
	if err != nil {
		t.Fatal(err)
	}
	e.Commit(t, docs)
	r := &lkgRig{e: e, cache: filepath.Join(t.TempDir(), "lkg.json"), refused: make(chan error, 16), reach: make(chan bool, 16), logs: &records{}}
	r.src = r.source()
	if err := r.src.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	r.good = r.src.Snapshot()
	if r.lkg, err = os.ReadFile(r.cache); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	r.updates = r.src.Subscribe()
	done := make(chan struct{})
	go func() { defer close(done); r.src.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	return r
}

// source returns a source over the rig's etcd and cache.
func (r *lkgRig) source() *config.EtcdSource {
	return &config.EtcdSource{Client: r.e.Client, CacheFile: r.cache, Logger: slog.New(r.logs), Check: needTopology,
		StartTimeout: time.Second, ProbeInterval: 50 * time.Millisecond,
		OnReload: func(_ int64, err error) {
			if err != nil {
				select {
				case r.refused <- err:
				default:
				}
			}
		},
		OnReachable: func(up bool) {
			select {
			case r.reach <- up:
			default:
			}
		}}
}

func (r *lkgRig) refusal(t *testing.T, want error) {
	t.Helper()
	select {
	case err := <-r.refused:
		if !errors.Is(err, want) {
			t.Fatalf("refused with %v, want %v", err, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no refusal (%v) within 20s", want)
	}
	select {
	case s := <-r.updates:
		t.Fatalf("a refused state was published at revision %d", s.Revision)
	default:
	}
	if got := r.src.Snapshot(); got.Revision != r.good.Revision {
		t.Fatalf("running revision %d, want %d (unchanged)", got.Revision, r.good.Revision)
	}
	if b, err := os.ReadFile(r.cache); err != nil || !bytes.Equal(b, r.lkg) {
		t.Fatalf("the last-known-good copy changed (err %v):\n%s", err, b)
	}
}

// An `etcdctl del --prefix` by mistake: every component keeps serving, the
// last-known-good copy stays byte for byte, and a restart — with etcd
// emptied, then with etcd down — serves that copy.
func TestEtcdEmptiedKeepsLastKnownGood(t *testing.T) {
	r := newLKGRig(t)
	if _, err := r.e.Client.Delete(t.Context(), config.DefaultPrefix, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	r.refusal(t, config.ErrEmpty)
	if !r.logs.has("etcd state refused") {
		t.Fatalf("the refusal was not logged at Error: %v", r.logs.msgs)
	}

	for _, c := range []struct {
		name string
		down bool
	}{{"restart with etcd emptied", false}, {"restart with etcd down", true}} {
		t.Run(c.name, func(t *testing.T) {
			if c.down {
				r.e.Stop()
				defer r.e.Start()
			}
			cold := r.source()
			if err := cold.Start(t.Context()); err != nil {
				t.Fatalf("start: %v", err)
			}
			if s := cold.Snapshot(); !cold.FromLastKnownGood() || s.Revision != r.good.Revision || len(s.Objects) != len(r.good.Objects) {
				t.Fatalf("serving revision %d with %d objects (from LKG: %v), want the last-known-good revision %d with %d",
					s.Revision, len(s.Objects), cold.FromLastKnownGood(), r.good.Revision, len(r.good.Objects))
			}
			if b, _ := os.ReadFile(r.cache); !bytes.Equal(b, r.lkg) {
				t.Fatal("starting from the copy changed it")
			}
		})
	}
}

// A valid configuration the component cannot run (no Topology, which
// Tier-2 refuses) is refused at the source: not published, not counted as
// a good reload, not kept as last-known-good.
func TestEtcdUnusableConfigurationRefused(t *testing.T) {
	r := newLKGRig(t)
	if _, err := r.e.Client.Delete(t.Context(), config.KeyOf(config.DefaultPrefix, config.ObjectKey{Kind: config.KindTopology, Name: r.good.Topology.Metadata.Name})); err != nil {
		t.Fatal(err)
	}
	r.refusal(t, config.ErrUnusable)
}

// An etcd outage is logged when it starts and when it ends, and reported
// to OnReachable (the meridian_config_etcd_up gauge).
func TestEtcdOutageLogged(t *testing.T) {
	r := newLKGRig(t)
	next := func(want bool) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			select {
			case up := <-r.reach:
				if up == want {
					return
				}
			case <-deadline:
				t.Fatalf("etcd not reported reachable=%v within 20s", want)
			}
		}
	}
	next(true)
	r.e.Stop()
	next(false)
	if !r.logs.has("etcd unreachable") {
		t.Fatalf("the outage was not logged at Error: %v", r.logs.msgs)
	}
	r.e.Start()
	next(true)
	if got := r.src.Snapshot(); got.Revision != r.good.Revision {
		t.Fatalf("revision %d after the outage, want %d", got.Revision, r.good.Revision)
	}
}
