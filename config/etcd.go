package config

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
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
	keys := make([]string, 0, len(objs))
	for k := range objs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
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

// EtcdSource serves the configuration kept in etcd and follows changes with
// a watch that resumes from the last revision it saw. Every valid snapshot
// is also written to CacheFile, so a restart while etcd is unreachable
// starts from the last known good configuration.
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
	e.log().Warn("etcd unreachable or invalid; serving the last known good configuration", "cache", e.CacheFile, "revision", s.Revision, "error", err)
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

// rebuild validates the watched objects and publishes them when valid.
func (e *EtcdSource) rebuild() error {
	e.mu.Lock()
	objs, rev := e.objects, e.rev
	e.mu.Unlock()
	s, err := buildFrom(e.Prefix, objs, rev)
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
		e.log().Error("config in etcd rejected; keeping the running configuration", "revision", rev, "error", err)
		return err
	}
	e.publish(s)
	if werr := e.saveLKG(s); werr != nil {
		e.log().Warn("cannot write last-known-good configuration", "cache", e.CacheFile, "error", werr)
	}
	return nil
}

// Run watches etcd until ctx ends, resuming after disconnects and
// re-listing after compaction, then closes subscriptions.
func (e *EtcdSource) Run(ctx context.Context) {
	defer e.close()
	e.Prefix = normPrefix(e.Prefix)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		e.mu.Lock()
		listed := e.objects != nil
		e.mu.Unlock()
		if !listed {
			if err := e.relist(ctx); err != nil && e.objectsNil() {
				if !sleepCtx(ctx, jitter(backoff)) {
					return
				}
				backoff = min(backoff*2, 10*time.Second)
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
		if !sleepCtx(ctx, jitter(backoff)) {
			return
		}
		backoff = min(backoff*2, 10*time.Second)
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

func (e *EtcdSource) saveLKG(s *Snapshot) error {
	if e.CacheFile == "" {
		return nil
	}
	f := lkgFile{Prefix: e.Prefix, Revision: s.Revision, Objects: map[string]string{}}
	e.mu.Lock()
	for k, v := range e.objects {
		f.Objects[k] = string(v)
	}
	e.mu.Unlock()
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
	s, err := buildFrom(f.Prefix, objs, f.Revision)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.CacheFile, err)
	}
	return s, nil
}

func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(rand.Int64N(int64(d)))
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
