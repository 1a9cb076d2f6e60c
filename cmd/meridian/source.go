package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/meridian-router/meridian/config"
)

// sourceFlags select where a long-running command reads its configuration.
type sourceFlags struct {
	dir       string
	endpoints []string
	prefix    string
	cache     string
	root      string
	// check is the consuming component's test of a valid configuration
	// (tier2.Usable); a configuration it refuses is an invalid reload.
	check func(*config.Snapshot) error
	// static, when set, is served as is (configuration embedded in the
	// binary, for meridian up).
	static *config.Snapshot
	// rewrite, when set, edits the directory's documents on every load
	// (meridian up's moved ports).
	rewrite func([]config.Document) []config.Document
}

func (f *sourceFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.dir, "config", "", "directory (or file) of YAML configuration, reloaded on change")
	cmd.Flags().StringSliceVar(&f.endpoints, "etcd", nil, "etcd endpoints (host:port,...) to read configuration from")
	cmd.Flags().StringVar(&f.prefix, "prefix", config.DefaultPrefix, "etcd key prefix")
	cmd.Flags().StringVar(&f.cache, "cache", "", "last-known-good copy of the etcd configuration (default: in the user cache dir)")
	cmd.Flags().StringVar(&f.root, "config-root", "", "with --etcd: the directory relative file paths of the configuration (spec.auth.jwt.jwksFile) are resolved against (default: the working directory)")
}

// fileRoot is the directory relative file paths in the configuration are
// resolved against: with --config, the configuration's directory; with
// --etcd, --config-root, else the working directory (an etcd key is no
// place on disk).
func (f *sourceFlags) fileRoot() (string, error) {
	if f.dir != "" {
		return f.dir, nil
	}
	if len(f.endpoints) == 0 {
		return "", nil
	}
	root := f.root
	if root == "" {
		root = "."
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("--config-root: %w", err)
	}
	return abs, nil
}

// openedSource is a started configuration source.
type openedSource struct {
	config.Source
	run   func(ctx context.Context)
	close func()
}

// open starts the source chosen by the flags and counts reloads on reg.
func (f *sourceFlags) open(ctx context.Context, reg prometheus.Registerer, log *slog.Logger) (*openedSource, error) {
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meridian_config_reloads_total",
		Help: "Configuration reloads by result (ok, invalid).",
	}, []string{"result"})
	reloads.WithLabelValues("ok")
	reloads.WithLabelValues("invalid")
	etcdUp := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "meridian_config_etcd_up",
		Help: "1 while etcd answers the configuration source's probe, 0 during an outage (the configuration in force, or the last-known-good copy, keeps serving).",
	})
	if reg != nil {
		reg.MustRegister(reloads)
		if len(f.endpoints) > 0 {
			reg.MustRegister(etcdUp)
		}
	}
	onReload := func(_ int64, err error) {
		if err != nil {
			reloads.WithLabelValues("invalid").Inc()
		} else {
			reloads.WithLabelValues("ok").Inc()
		}
	}
	switch {
	case f.static != nil:
		src := config.NewStaticSource(f.static)
		return &openedSource{Source: src, run: src.Run, close: func() {}}, nil
	case f.dir != "" && len(f.endpoints) > 0:
		return nil, &exitError{2, errors.New("set either --config or --etcd, not both")}
	case f.dir != "":
		src := &config.DirSource{Dir: f.dir, Logger: log, OnReload: onReload, Check: f.check, Rewrite: f.rewrite}
		if err := src.Start(); err != nil {
			return nil, err
		}
		return &openedSource{Source: src, run: src.Run, close: func() {}}, nil
	case len(f.endpoints) > 0:
		cli, err := clientv3.New(clientv3.Config{Endpoints: f.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
		cache := f.cache
		if cache == "" {
			dir, err := os.UserCacheDir()
			if err != nil {
				dir = os.TempDir()
			}
			name := strings.NewReplacer("/", "_", ":", "_").Replace(strings.Join(f.endpoints, ",") + f.prefix)
			cache = filepath.Join(dir, "meridian", name+".json")
		}
		src := &config.EtcdSource{Client: cli, Prefix: f.prefix, CacheFile: cache, Logger: log, OnReload: onReload, Check: f.check,
			OnReachable: func(up bool) {
				if up {
					etcdUp.Set(1)
				} else {
					etcdUp.Set(0)
				}
			}}
		if err := src.Start(ctx); err != nil {
			cli.Close()
			return nil, err
		}
		return &openedSource{Source: src, run: src.Run, close: func() { cli.Close() }}, nil
	}
	return nil, &exitError{2, errors.New("set --config DIR or --etcd ENDPOINTS")}
}
