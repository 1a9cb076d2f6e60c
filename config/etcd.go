package config

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/meridian-router/meridian/internal/loop"
)

// DefaultPrefix is where Meridian keeps its objects in etcd: one key per
// object, <prefix><Kind>/<name>, whose value is the object's JSON.
const DefaultPrefix = "/meridian/"

// guardKey is rewritten by every apply; comparing its revision makes two
// applies that read the same state conflict even when they touch
// different objects (their union might not validate).
const guardKey = "_guard"

// KeyOf returns the etcd key of an object under prefix.
func KeyOf(prefix string, k ObjectKey) string { return prefix + k.Kind + "/" + k.Name }

func normPrefix(p string) string {
	if p == "" {
		return DefaultPrefix
	}
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return p
}

// storedObject is one object as read from etcd.
type storedObject struct {
	Value  []byte
	ModRev int64
}

// etcdState is every object under a prefix at one revision.
type etcdState struct {
	Revision int64
	GuardRev int64 // mod revision of the guard key, 0 when absent
	Objects  map[string]storedObject
}

// etcdErr normalises errors at the etcd boundary so callers can test them
// with errors.Is (context errors come back as gRPC statuses otherwise).
func etcdErr(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("config: etcd %s: %w", op, cerr)
	}
	return fmt.Errorf("config: etcd %s: %w", op, rpctypes.Error(err))
}

func readState(ctx context.Context, cli *clientv3.Client, prefix string) (*etcdState, error) {
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, etcdErr(ctx, "get", err)
	}
	st := &etcdState{Revision: resp.Header.Revision, Objects: map[string]storedObject{}}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if k == prefix+guardKey {
			st.GuardRev = kv.ModRevision
			continue
		}
		st.Objects[k] = storedObject{Value: kv.Value, ModRev: kv.ModRevision}
	}
	return st, nil
}

// decodeObjects decodes etcd values into documents, each named by its key.
func decodeObjects(prefix string, objs map[string][]byte) ([]Document, Errors) {
	keys := slices.Sorted(maps.Keys(objs))
	var docs []Document
	var errs Errors
	for _, k := range keys {
		rel := strings.TrimPrefix(k, prefix)
		if strings.HasPrefix(rel, "_") {
			continue // bookkeeping keys
		}
		d, e := Decode(k, objs[k])
		errs = append(errs, e...)
		for _, doc := range d {
			if want := KeyOf(prefix, doc.Key); doc.Key.Kind != KindEndpointPicker && want != k {
				errs = append(errs, FieldError{Origin: k, Object: doc.Key.String(), Msg: fmt.Sprintf("stored under the wrong key; want %s", want)})
				continue
			}
			docs = append(docs, doc)
		}
	}
	return docs, errs
}

func buildFrom(prefix string, objs map[string][]byte, rev int64) (*Snapshot, error) {
	docs, errs := decodeObjects(prefix, objs)
	if len(errs) > 0 {
		return nil, errs
	}
	return Build(docs, rev)
}

// ErrEmpty reports an etcd prefix that holds no objects: every key was
// deleted (an `etcdctl del --prefix` by mistake), or the prefix is wrong.
// Such a state is refused like an invalid one.
var ErrEmpty = errors.New("config: no objects under the etcd prefix")

// ErrUnusable reports a valid configuration that the consuming component
// cannot run (EtcdSource.Check refused it).
var ErrUnusable = errors.New("config: configuration not usable here")

// EtcdSource serves the configuration kept in etcd and follows changes with
// a watch that resumes from the last revision it saw.
//
// A state is published only when it is valid, not empty and passes Check;
// anything else is refused: logged at Error, reported to OnReload, and the
// running configuration stays. Only a published snapshot is written to
// CacheFile (the last-known-good copy), so the copy only ever holds a
// configuration that was put in force, and a restart while etcd is down,
// emptied or invalid starts from it.
type EtcdSource struct {
	broadcaster
	Client *clientv3.Client
	// Prefix under which objects live. Empty means DefaultPrefix.
	Prefix string
	// CacheFile keeps the last known good configuration. Empty disables it.
	CacheFile string
	// StartTimeout bounds the first read before falling back to CacheFile.
	// Zero means 5s.
	StartTimeout time.Duration
	// Logger receives reload outcomes. Nil means slog.Default().
	Logger *slog.Logger
	// OnReload, when set, is called after each reload attempt with its
	// outcome (nil error on success). It must not block.
	OnReload func(rev int64, err error)
	// Check, when set, is the consumer's own test of a valid snapshot (for
	// example Tier-2 needs a Topology); a snapshot it refuses is treated as
	// invalid and never published or saved. It must not block.
	Check func(*Snapshot) error
	// ProbeInterval is how often Run checks that etcd answers, so an outage
	// is logged (a watch on a dead server just waits). Zero means 5s; the
	// probe's timeout is the interval.
	ProbeInterval time.Duration
	// OnReachable, when set, is called when etcd stops or starts answering
	// (the first probe reports either). It must not block.
	OnReachable func(up bool)

	mu      sync.Mutex
	objects map[string][]byte // the state being watched (may be invalid)
	rev     int64             // last etcd revision applied to objects
	lastErr error
	fromLKG bool
}

func (e *EtcdSource) log() *slog.Logger {
	if e.Logger != nil {
		return e.Logger
	}
	return slog.Default()
}

// Start reads the configuration once. When etcd cannot be reached it falls
// back to the last known good copy; it fails only when neither is usable.
// A configuration in etcd that does not validate is an error too, unless
// a last known good copy exists.
func (e *EtcdSource) Start(ctx context.Context) error {
	e.Prefix = normPrefix(e.Prefix)
	to := e.StartTimeout
	if to <= 0 {
		to = 5 * time.Second
	}
	rctx, cancel := context.WithTimeout(ctx, to)
	err := e.relist(rctx)
	cancel()
	if err == nil {
		return nil
	}
	s, lerr := e.loadLKG()
	if lerr != nil {
		return fmt.Errorf("%w (and no last-known-good copy: %v)", err, lerr)
	}
	e.mu.Lock()
	e.fromLKG = true
	e.mu.Unlock()
	e.log().Error("config: etcd unreachable, empty or invalid at start; serving the last-known-good configuration",
		"cache", e.CacheFile, "revision", s.Revision, "error", err)
	e.publish(s)
	return nil
}

// FromLastKnownGood reports whether the snapshot in force came from the
// local cache rather than etcd.
func (e *EtcdSource) FromLastKnownGood() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fromLKG
}

// LastError returns the error of the last reload attempt, or nil.
func (e *EtcdSource) LastError() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lastErr
}

// relist reads the whole prefix and applies it.
func (e *EtcdSource) relist(ctx context.Context) error {
	st, err := readState(ctx, e.Client, e.Prefix)
	if err != nil {
		return err
	}
	objs := make(map[string][]byte, len(st.Objects))
	for k, o := range st.Objects {
		objs[k] = o.Value
	}
	e.mu.Lock()
	e.objects, e.rev = objs, st.Revision
	e.mu.Unlock()
	return e.rebuild()
}

// build validates objects as a configuration this source may publish.
func (e *EtcdSource) build(prefix string, objs map[string][]byte, rev int64) (*Snapshot, error) {
	if len(objs) == 0 {
		return nil, fmt.Errorf("%w %s at revision %d (were they all deleted?); apply the configuration again", ErrEmpty, prefix, rev)
	}
	s, err := buildFrom(prefix, objs, rev)
	if err != nil {
		return nil, err
	}
	if e.Check != nil {
		if err := e.Check(s); err != nil {
			return nil, fmt.Errorf("%w: revision %d: %w", ErrUnusable, rev, err)
		}
	}
	return s, nil
}

// rebuild validates the watched objects and publishes them when valid.
func (e *EtcdSource) rebuild() error {
	e.mu.Lock()
	objs, rev := e.objects, e.rev
	e.mu.Unlock()
	s, err := e.build(e.Prefix, objs, rev)
	e.mu.Lock()
	e.lastErr = err
	if err == nil {
		e.fromLKG = false
	}
	e.mu.Unlock()
	if e.OnReload != nil {
		e.OnReload(rev, err)
	}
	if err != nil {
		running := int64(0)
		if cur := e.Snapshot(); cur != nil {
			running = cur.Revision
		}
		e.log().Error("config: etcd state refused; keeping the running configuration and the last-known-good copy",
			"revision", rev, "running", running, "error", err)
		return err
	}
	e.publish(s)
	if werr := e.saveLKG(objs, s.Revision); werr != nil {
		e.log().Error("config: cannot write the last-known-good copy", "cache", e.CacheFile, "error", werr)
	}
	return nil
}

// Run watches etcd until ctx ends, resuming after disconnects and
// re-listing after compaction, then closes subscriptions.
func (e *EtcdSource) Run(ctx context.Context) {
	defer e.close()
	e.Prefix = normPrefix(e.Prefix)
	probed := make(chan struct{})
	defer func() { <-probed }()
	go func() { defer close(probed); e.probe(ctx) }()
	// Jittered ([d/2, 3d/2]) exponential backoff from 100 ms to 10 s.
	retry := &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 10 * time.Second}
	for ctx.Err() == nil {
		e.mu.Lock()
		listed := e.objects != nil
		e.mu.Unlock()
		if !listed {
			if err := e.relist(ctx); err != nil && e.objectsNil() {
				if !loop.Sleep(ctx, retry.NextBackOff()) {
					return
				}
				continue
			}
		}
		err := e.watch(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, rpctypes.ErrCompacted) {
			e.log().Warn("etcd watch compacted; re-listing", "error", err)
			e.mu.Lock()
			e.objects = nil
			e.mu.Unlock()
			continue
		}
		e.log().Warn("etcd watch ended; resuming", "error", err)
		if !loop.Sleep(ctx, retry.NextBackOff()) {
			return
		}
	}
}

// probe asks etcd for one key every ProbeInterval and logs when it stops
// and starts answering: a watch on an unreachable server neither fails nor
// says anything.
func (e *EtcdSource) probe(ctx context.Context) {
	every := e.ProbeInterval
	if every <= 0 {
		every = 5 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	known, up := false, false
	var since time.Time
	for {
		pctx, cancel := context.WithTimeout(ctx, every)
		_, err := e.Client.Get(pctx, e.Prefix+guardKey, clientv3.WithCountOnly())
		cancel()
		if ctx.Err() != nil {
			return
		}
		now := err == nil
		if !known || now != up {
			running := int64(0)
			if cur := e.Snapshot(); cur != nil {
				running = cur.Revision
			}
			switch {
			case !now:
				e.log().Error("config: etcd unreachable; serving the configuration in force until it answers",
					"revision", running, "lastKnownGood", e.FromLastKnownGood(), "error", etcdErr(pctx, "probe", err))
			case known:
				e.log().Warn("config: etcd reachable again", "down", time.Since(since).Round(time.Millisecond), "revision", running)
			}
			known, up, since = true, now, time.Now()
			if e.OnReachable != nil {
				e.OnReachable(now)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (e *EtcdSource) objectsNil() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.objects == nil
}

// watch follows the prefix from the revision after the last one applied.
func (e *EtcdSource) watch(ctx context.Context) error {
	e.mu.Lock()
	from := e.rev + 1
	e.mu.Unlock()
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := e.Client.Watch(wctx, e.Prefix, clientv3.WithPrefix(), clientv3.WithRev(from))
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return err
		}
		if len(resp.Events) == 0 {
			continue
		}
		e.mu.Lock()
		objs := make(map[string][]byte, len(e.objects)+len(resp.Events))
		for k, v := range e.objects {
			objs[k] = v
		}
		for _, ev := range resp.Events {
			k := string(ev.Kv.Key)
			if k == e.Prefix+guardKey {
				continue
			}
			if ev.Type == clientv3.EventTypeDelete {
				delete(objs, k)
			} else {
				objs[k] = ev.Kv.Value
			}
		}
		e.objects, e.rev = objs, resp.Header.Revision
		e.mu.Unlock()
		_ = e.rebuild() // an invalid change is logged and counted; keep watching
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("watch channel closed")
}

// lkgFile is the on-disk last-known-good format.
type lkgFile struct {
	Prefix   string            `json:"prefix"`
	Revision int64             `json:"revision"`
	Objects  map[string]string `json:"objects"` // key → JSON
}

// saveLKG writes objs, the objects of the snapshot just published.
func (e *EtcdSource) saveLKG(objs map[string][]byte, rev int64) error {
	if e.CacheFile == "" {
		return nil
	}
	f := lkgFile{Prefix: e.Prefix, Revision: rev, Objects: make(map[string]string, len(objs))}
	for k, v := range objs {
		f.Objects[k] = string(v)
	}
	b, err := json.MarshalIndent(f, "", " ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(e.CacheFile), 0o755); err != nil {
		return err
	}
	tmp := e.CacheFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, e.CacheFile)
}

func (e *EtcdSource) loadLKG() (*Snapshot, error) {
	if e.CacheFile == "" {
		return nil, errors.New("no cache file configured")
	}
	b, err := os.ReadFile(e.CacheFile)
	if err != nil {
		return nil, err
	}
	var f lkgFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", e.CacheFile, err)
	}
	objs := make(map[string][]byte, len(f.Objects))
	for k, v := range f.Objects {
		objs[k] = []byte(v)
	}
	s, err := e.build(f.Prefix, objs, f.Revision)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.CacheFile, err)
	}
	return s, nil
}
