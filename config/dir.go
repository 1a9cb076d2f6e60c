package config

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/meridian-router/meridian/internal/loop"
)

// ReadDir decodes every YAML file under dir (recursively; hidden files and
// folders are skipped). A file none of whose documents has a "kind" (a Helm
// values file, say) is not configuration and is skipped. It returns the
// documents, the paths of the files it read, and every decoding error.
func ReadDir(dir string) ([]Document, []string, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	if !st.IsDir() {
		data, err := os.ReadFile(dir)
		if err != nil {
			return nil, nil, fmt.Errorf("config: %w", err)
		}
		docs, errs := Decode(dir, data)
		return docs, []string{dir}, errs.Err()
	}
	rel, err := yamlFiles(os.DirFS(dir))
	if err != nil {
		return nil, nil, fmt.Errorf("config: reading %s: %w", dir, err)
	}
	files := make([]string, len(rel))
	for i, f := range rel {
		files[i] = filepath.Join(dir, filepath.FromSlash(f))
	}
	var docs []Document
	var errs Errors
	var read []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, FieldError{Origin: f, Msg: err.Error()})
			continue
		}
		if len(bytes.TrimSpace(stripComments(data))) == 0 {
			// Most often a file caught while being written or truncated:
			// reading it as "no objects" would delete what it declared.
			errs = append(errs, FieldError{Origin: f, Msg: "the file is empty; remove it, or give it content"})
			continue
		}
		if !hasKind(data) {
			continue
		}
		read = append(read, f)
		d, e := Decode(f, data)
		docs = append(docs, d...)
		errs = append(errs, e...)
	}
	return docs, read, errs.Err()
}

// yamlFiles lists the YAML files of fsys, sorted, skipping hidden files
// and folders.
func yamlFiles(fsys fs.FS) ([]string, error) {
	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != "." && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			files = append(files, p)
		}
		return nil
	})
	sort.Strings(files)
	return files, err
}

// ReadFS is ReadDir over a file system (for configuration embedded in the
// binary). Paths in errors are prefixed with name.
func ReadFS(fsys fs.FS, name string) ([]Document, error) {
	files, err := yamlFiles(fsys)
	if err != nil {
		return nil, fmt.Errorf("config: reading %s: %w", name, err)
	}
	var docs []Document
	var errs Errors
	for _, f := range files {
		data, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if !hasKind(data) {
			continue
		}
		d, e := Decode(name+"/"+f, data)
		docs = append(docs, d...)
		errs = append(errs, e...)
	}
	return docs, errs.Err()
}

// hasKind reports whether any document of a YAML stream has a top-level
// "kind" key.
func hasKind(data []byte) bool {
	for _, part := range splitDocuments(data) {
		var top map[string]any
		if yaml.Unmarshal(part.body, &top) != nil {
			return true // let the decoder explain the syntax error
		}
		if _, ok := top["kind"]; ok {
			return true
		}
		if _, ok := top["apiVersion"]; ok {
			return true
		}
	}
	return false
}

// LoadDir reads and validates a directory (or a single file) of
// configuration.
func LoadDir(dir string) (*Snapshot, error) {
	docs, _, err := ReadDir(dir)
	if err != nil {
		// Report decoding errors together with validation errors of what
		// did decode, so the operator sees everything at once.
		errs, _ := AsErrors(err)
		if _, berr := Build(docs, 0); berr != nil {
			more, _ := AsErrors(berr)
			errs = append(errs, more...)
		}
		if len(errs) == 0 {
			return nil, err
		}
		return nil, errs
	}
	return Build(docs, 0)
}

// Source yields validated snapshots. Implementations: DirSource, EtcdSource.
type Source interface {
	// Snapshot returns the snapshot in force. It is non-nil once Start
	// has returned without error.
	Snapshot() *Snapshot
	// Subscribe returns a channel that receives each new snapshot. The
	// channel holds one value; a slow reader sees the newest snapshot, not
	// every one. It is closed when the source stops.
	Subscribe() <-chan *Snapshot
}

// broadcaster hands snapshots to subscribers, newest wins.
type broadcaster struct {
	mu   sync.Mutex
	cur  *Snapshot
	subs []chan *Snapshot
	done bool
}

func (b *broadcaster) Snapshot() *Snapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cur
}

func (b *broadcaster) Subscribe() <-chan *Snapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan *Snapshot, 1)
	if b.done {
		close(ch)
		return ch
	}
	b.subs = append(b.subs, ch)
	return ch
}

func (b *broadcaster) publish(s *Snapshot) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cur = s
	for _, ch := range b.subs {
		select {
		case <-ch: // drop the stale one
		default:
		}
		ch <- s
	}
}

func (b *broadcaster) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return
	}
	b.done = true
	for _, ch := range b.subs {
		close(ch)
	}
}

// DirSource serves a directory of YAML files and reloads it when a file
// changes. An invalid change is logged, counted and reported by LastError;
// the running snapshot stays.
type DirSource struct {
	broadcaster
	// Dir is the folder (or single file) to read.
	Dir string
	// Interval is how often the directory is checked for changes. Polling
	// rather than inotify keeps Kubernetes ConfigMap mounts (symlink swaps)
	// and network file systems working. Zero means 1s.
	Interval time.Duration
	// Logger receives reload outcomes. Nil means slog.Default().
	Logger *slog.Logger
	// OnReload, when set, is called after each reload attempt with its
	// outcome (nil error on success). It must not block.
	OnReload func(rev int64, err error)
	// Check, when set, is the consumer's own test of a valid snapshot, as
	// EtcdSource.Check: a snapshot it refuses is an invalid reload.
	Check func(*Snapshot) error
	// Rewrite, when set, edits the decoded documents of every load before
	// they are validated (meridian up moves the listen addresses of a
	// Topology whose ports are taken). It may modify docs in place.
	Rewrite func(docs []Document) []Document

	mu      sync.Mutex
	lastErr error
	digest  [32]byte
	rev     int64
}

// Start loads the directory once; it fails if the configuration is
// invalid, since there is nothing to fall back to.
func (d *DirSource) Start() error {
	s, sum, err := d.load()
	if err != nil {
		return err
	}
	d.digest = sum
	d.rev = 1
	s.Revision = d.rev
	d.publish(s)
	return nil
}

// Run watches the directory until ctx ends, then closes subscriptions.
func (d *DirSource) Run(ctx context.Context) {
	defer d.close()
	iv := d.Interval
	if iv <= 0 {
		iv = time.Second
	}
	loop.Every(ctx, iv, func() { d.Reload() })
}

// Reload re-reads the directory now. It returns the validation error of an
// invalid change (the running snapshot stays) or nil when the snapshot was
// replaced or nothing changed.
func (d *DirSource) Reload() error {
	sum, err := dirDigest(d.Dir)
	if err == nil && sum == d.digest {
		return nil // unchanged bytes: skip
	}
	s, sum, err := d.load()
	log := d.Logger
	if log == nil {
		log = slog.Default()
	}
	d.mu.Lock()
	d.lastErr = err
	if err != nil {
		d.digest = sum // do not re-report the same bad bytes every tick
		d.mu.Unlock()
		log.Error("config reload rejected; keeping the running configuration", "dir", d.Dir, "revision", d.rev, "error", err)
		if d.OnReload != nil {
			d.OnReload(d.rev, err)
		}
		return err
	}
	d.digest = sum
	d.rev++
	s.Revision = d.rev
	rev := d.rev
	d.mu.Unlock()
	d.publish(s)
	log.Info("config reloaded", "dir", d.Dir, "revision", rev)
	if d.OnReload != nil {
		d.OnReload(rev, nil)
	}
	return nil
}

// LastError returns the error of the last reload attempt, or nil.
func (d *DirSource) LastError() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastErr
}

func (d *DirSource) load() (*Snapshot, [32]byte, error) {
	sum, _ := dirDigest(d.Dir)
	var s *Snapshot
	var err error
	if d.Rewrite == nil {
		s, err = LoadDir(d.Dir)
	} else {
		var docs []Document
		if docs, _, err = ReadDir(d.Dir); err != nil {
			return nil, sum, err
		}
		s, err = Build(d.Rewrite(docs), 0)
	}
	if err == nil && d.Check != nil {
		if cerr := d.Check(s); cerr != nil {
			return nil, sum, fmt.Errorf("%w: %s: %w", ErrUnusable, d.Dir, cerr)
		}
	}
	return s, sum, err
}

// dirDigest hashes the names and contents of the YAML files under dir.
func dirDigest(dir string) ([32]byte, error) {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if de.IsDir() || !(strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h.Write([]byte(p))
		h.Write([]byte{0})
		h.Write(b)
		h.Write([]byte{0})
		return nil
	})
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum, err
}

// StaticSource serves one snapshot that never changes (configuration
// embedded in the binary).
type StaticSource struct{ broadcaster }

// NewStaticSource returns a source holding s.
func NewStaticSource(s *Snapshot) *StaticSource {
	src := &StaticSource{}
	src.publish(s)
	return src
}

// Run waits for ctx to end, then closes subscriptions.
func (s *StaticSource) Run(ctx context.Context) {
	<-ctx.Done()
	s.close()
}

// Broadcaster is the Snapshot and Subscribe half of a Source, for sources
// outside this package (config/kube): Publish puts a snapshot in force
// and hands it to subscribers, newest wins; Close ends subscriptions.
type Broadcaster struct{ broadcaster }

// Publish puts s in force.
func (b *Broadcaster) Publish(s *Snapshot) { b.publish(s) }

// Close closes every subscription.
func (b *Broadcaster) Close() { b.close() }
