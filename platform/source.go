package platform

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
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/meridian-router/meridian/canary"
	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/kube"
	"github.com/meridian-router/meridian/tier2"
)

// Source is where a process reads its configuration: a directory (Dir),
// etcd (Etcd) or cluster objects (Kubernetes), one of them.
type Source struct {
	Dir    string   // directory (or file) of YAML, reloaded on change
	Etcd   []string // etcd endpoints
	Prefix string   // etcd key prefix
	// Cache is the last-known-good copy of the etcd configuration (empty:
	// in the user cache dir, named after the endpoints and prefix).
	Cache string
	// Root is, with Etcd, the directory relative file paths of the
	// configuration (spec.auth.jwt.jwksFile) are resolved against (empty:
	// the working directory).
	Root string
	// Kubernetes reads the configuration from cluster objects in
	// Namespace (config/kube), through Kubeconfig (empty: the in-cluster
	// service account). Empty Namespace: the kubeconfig context's, or this
	// pod's.
	Kubernetes bool
	Kubeconfig string
	Namespace  string

	// check is the consuming component's test of a valid configuration
	// (tier2.Usable); a configuration it refuses is an invalid reload.
	check func(*config.Snapshot) error
	// static, when set, is served as is (the configuration embedded in
	// the binary, for the local platform).
	static *config.Snapshot
	// rewrite, when set, edits the directory's documents on every load
	// (the local platform's moved ports).
	rewrite func([]config.Document) []config.Document
}

// fileRoot is the directory relative file paths in the configuration are
// resolved against: with Dir, the configuration's directory; with Etcd,
// Root, else the working directory (an etcd key is no place on disk).
func (f *Source) fileRoot() (string, error) {
	if f.Dir != "" {
		return f.Dir, nil
	}
	if len(f.Etcd) == 0 && !f.Kubernetes {
		return "", nil
	}
	root := f.Root
	if root == "" {
		root = "."
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("--config-root: %w", err)
	}
	return abs, nil
}

// forComponent gives each component of the local platform its own
// last-known-good file (they would otherwise rewrite one file at once).
func (f Source) forComponent(name string) Source {
	if f.Cache != "" {
		f.Cache = strings.TrimSuffix(f.Cache, ".json") + "-" + name + ".json"
	}
	return f
}

// openedSource is a started configuration source.
type openedSource struct {
	config.Source
	run   func(ctx context.Context)
	close func()
}

// open starts the source and counts reloads on reg.
func (f *Source) open(ctx context.Context, reg prometheus.Registerer, log *slog.Logger) (*openedSource, error) {
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
		if len(f.Etcd) > 0 {
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
	case btoi(f.Dir != "")+btoi(len(f.Etcd) > 0)+btoi(f.Kubernetes) > 1:
		return nil, usage(errors.New("set one of --config, --etcd and --source kubernetes"))
	case f.Kubernetes:
		clients, ns, err := kube.Connect(f.Kubeconfig, f.Namespace, "meridian")
		if err != nil {
			return nil, err
		}
		src := &kube.Source{Dynamic: clients.Dynamic, Client: clients.Client, Namespace: ns, Logger: log, OnReload: onReload, Check: f.check}
		if err := src.Start(ctx); err != nil {
			return nil, err
		}
		return &openedSource{Source: src, run: src.Run, close: func() {}}, nil
	case f.Dir != "":
		src := &config.DirSource{Dir: f.Dir, Logger: log, OnReload: onReload, Check: f.check, Rewrite: f.rewrite}
		if err := src.Start(); err != nil {
			return nil, err
		}
		return &openedSource{Source: src, run: src.Run, close: func() {}}, nil
	case len(f.Etcd) > 0:
		cli, err := newEtcdClient(f.Etcd)
		if err != nil {
			return nil, err
		}
		cache := f.Cache
		if cache == "" {
			dir, err := os.UserCacheDir()
			if err != nil {
				dir = os.TempDir()
			}
			name := strings.NewReplacer("/", "_", ":", "_").Replace(strings.Join(f.Etcd, ",") + f.Prefix)
			cache = filepath.Join(dir, "meridian", name+".json")
		}
		src := &config.EtcdSource{Client: cli, Prefix: f.Prefix, CacheFile: cache, Logger: log, OnReload: onReload, Check: f.check,
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
	return nil, usage(errors.New("set --config DIR, --etcd ENDPOINTS or --source kubernetes"))
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// newEtcdClient connects to etcd the way every process here does.
func newEtcdClient(endpoints []string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	return cli, nil
}

// canaryStore is the rollout store Tier-2's analysis writes through: etcd
// or the cluster's objects when the configuration comes from there, none
// (report only) otherwise.
func (f *Source) canaryStore() (tier2.RolloutStore, func(), error) {
	if f.Kubernetes {
		clients, ns, err := kube.Connect(f.Kubeconfig, f.Namespace, "meridian")
		if err != nil {
			return nil, nil, err
		}
		return canary.NewKubernetes(&kube.Store{Dynamic: clients.Dynamic, Client: clients.Client, Namespace: ns}), func() {}, nil
	}
	if len(f.Etcd) == 0 {
		return nil, func() {}, nil
	}
	cli, err := newEtcdClient(f.Etcd)
	if err != nil {
		return nil, nil, err
	}
	return canary.NewEtcd(&config.Store{Client: cli, Prefix: f.Prefix}), func() { cli.Close() }, nil
}
