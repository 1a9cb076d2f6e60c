package configtest

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/meridian-router/meridian/config"
)

// Live is a running configuration source that a live-reload test drives.
type Live struct {
	// Snapshot is the configuration the source started with, Updates
	// the ones it applies after.
	Snapshot *config.Snapshot
	Updates  <-chan *config.Snapshot
	// Apply changes the configuration to yaml (a whole platform) and
	// returns the revision it was applied as; a refused change fails the
	// test.
	Apply func(yaml string) int64
}

// SourceOptions configure both sources of Sources.
type SourceOptions struct {
	Logger *slog.Logger
	Check  func(*config.Snapshot) error
}

// Sources runs test twice, as subtests "directory" and "etcd": once over a
// config.DirSource reloaded by hand, once over a config.EtcdSource
// watching a real embedded etcd that Apply commits to. The test calls
// start with its initial configuration (and, for the directory, files to
// write beside it, such as a JWKS; etcd gets none) once its harness is
// ready. The two run side by side (t.Parallel): each has its own
// source, and the test must give each its own harness.
func Sources(t *testing.T, opts SourceOptions, test func(t *testing.T, start func(initial string, files map[string][]byte) Live)) {
	t.Run("directory", func(t *testing.T) {
		t.Parallel()
		test(t, func(initial string, files map[string][]byte) Live {
			dir := t.TempDir()
			file := filepath.Join(dir, "platform.yaml")
			write := func(name string, b []byte) {
				if err := os.WriteFile(name, b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			write(file, []byte(initial))
			for name, b := range files {
				write(filepath.Join(dir, name), b)
			}
			src := &config.DirSource{Dir: dir, Logger: opts.Logger, Check: opts.Check}
			if err := src.Start(); err != nil {
				t.Fatal(err)
			}
			return Live{Snapshot: src.Snapshot(), Updates: src.Subscribe(), Apply: func(y string) int64 {
				write(file, []byte(y))
				if err := src.Reload(); err != nil {
					t.Fatalf("directory reload refused: %v", err)
				}
				return src.Snapshot().Revision
			}}
		})
	})
	t.Run("etcd", func(t *testing.T) {
		t.Parallel()
		e := StartEtcd(t)
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		commit := func(y string) int64 { return e.Apply(t, y) }
		test(t, func(initial string, _ map[string][]byte) Live {
			commit(initial)
			src := &config.EtcdSource{Client: e.Client, CacheFile: filepath.Join(t.TempDir(), "lkg.json"), Logger: opts.Logger, Check: opts.Check}
			if err := src.Start(ctx); err != nil {
				t.Fatal(err)
			}
			updates := src.Subscribe()
			go src.Run(ctx)
			return Live{Snapshot: src.Snapshot(), Updates: updates, Apply: commit}
		})
	})
}
