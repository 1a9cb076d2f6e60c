package platform

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"github.com/meridian-router/meridian/internal/tracing"
	"github.com/meridian-router/meridian/internal/trust"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/discovery"
	"github.com/meridian-router/meridian/tier1/extproc"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/health"
	"github.com/meridian-router/meridian/tier1/hygiene"
	"github.com/meridian-router/meridian/tier1/peers"
	"github.com/meridian-router/meridian/tier1/proxy"
	"github.com/meridian-router/meridian/tier1/scrape"
)

// Tier1Config is one cluster's Tier-1 process (meridian tier1's flags).
type Tier1Config struct {
	Source  Source
	Cluster string // whose InferenceGatewayConfig to serve
	Replica string // this replica's name among the cluster's Tier-1s
	Listen  string // the OpenAI proxy's address
	Metrics string // the /metrics (and hygiene report) listener; empty: off
	// ScrapeInterval is how often each pod's metrics are polled; a pod
	// whose last scrape is older than MaxMetricsAge is avoided.
	ScrapeInterval time.Duration
	MaxMetricsAge  time.Duration
	// ModelsInterval is how often each pod's /v1/models (what it serves) is
	// read again; zero means 30 s.
	ModelsInterval time.Duration
	Health         string   // pool-health feed address (empty: off)
	Region         string   // Region named in health digests (empty: the gateway's spec.region)
	Discovery      string   // static (or empty) | kubernetes
	Kubeconfig     string   // for kubernetes discovery (empty: in-cluster)
	Namespace      string   // whose pods kubernetes discovery watches
	ExtProc        string   // ext_proc picker address (empty: off)
	Peers          []string // other replicas' Health addresses (needs Health)
	PromptSamples  bool     // keep redacted prompt samples for the hygiene report
	// IdentityKey is the key Tier-2 signs tenant and band with; when nil
	// it is read from IdentityKeyFile (empty too: headers trusted unsigned).
	IdentityKey     []byte
	IdentityKeyFile string
	Version         string // meridian_build_info's version
	// Tracing exports spans of the proxy's requests (off unless its
	// Endpoint is set); Service defaults to meridian-tier1.
	Tracing tracing.Config
	// AccessLog writes a line per proxied request to the log, at info.
	AccessLog bool
}

// Tier1 is a started Tier-1 process: its gateway and listeners.
type Tier1 struct {
	Gateway *gateway.Gateway
	// Exchange shares the prefix index with the other replicas (nil
	// without Peers).
	Exchange *peers.Exchange
	listeners
	extAddr string // the ext_proc listener's address, or ""
	run     func(ctx context.Context) error
}

// Run serves until ctx ends, then drains.
func (t *Tier1) Run(ctx context.Context) error { return t.run(ctx) }

// ExtProcAddr is the address of the ext_proc picker (Tier1Config.ExtProc),
// or "" without one.
func (t *Tier1) ExtProcAddr() string { return t.extAddr }

// StartTier1 binds every listener of one Tier-1 and reads its
// configuration; Run serves. An error leaves nothing open.
func StartTier1(ctx context.Context, f Tier1Config, log *slog.Logger) (*Tier1, error) {
	reg := newRegistry(f.Version)
	src, err := f.Source.open(ctx, reg, log)
	if err != nil {
		return nil, err
	}
	var opened []io.Closer // the listeners bound so far
	fail := func(err error) (*Tier1, error) {
		for _, c := range opened {
			c.Close()
		}
		src.close()
		return nil, err
	}
	var prompts *hygiene.Sketch // read only through the metrics listener
	if f.Metrics != "" {
		prompts = hygiene.New(hygiene.Config{Samples: f.PromptSamples})
		reg.MustRegister(prompts.Collector())
	}
	gcfg := gateway.Config{
		Cluster:    f.Cluster,
		Replica:    f.Replica,
		Scrape:     scrape.Config{Interval: f.ScrapeInterval, ModelsInterval: f.ModelsInterval},
		Options:    tier1.Options{MaxMetricsAge: f.MaxMetricsAge},
		Registerer: reg,
		Logger:     log,
		Prompts:    prompts,
	}
	gcfg.Tier2Key = f.IdentityKey
	if f.IdentityKeyFile != "" && f.IdentityKey == nil {
		if gcfg.Tier2Key, err = trust.ReadKey(f.IdentityKeyFile); err != nil {
			return fail(usage(err))
		}
	}
	var exchange *peers.Exchange
	if len(f.Peers) > 0 {
		if f.Health == "" {
			return fail(usage(errors.New("--peers needs --health: replicas exchange events on the health gRPC port")))
		}
		if exchange, err = peers.New(peers.Config{Replica: f.Replica, Peers: f.Peers, Registerer: reg, Logger: log}); err != nil {
			return fail(err)
		}
		gcfg.OnDispatch = exchange.Publish
		gcfg.OnInFlight = exchange.PublishInFlight
	}
	gw, err := gateway.New(gcfg, src.Snapshot())
	if err != nil {
		return fail(err)
	}
	inst := &Tier1{Gateway: gw, Exchange: exchange}
	var kube *discovery.Kubernetes
	switch f.Discovery {
	case "static", "":
	case "kubernetes":
		// client-go logs through klog; route it into this process's slog
		// so that its lines are structured like ours, not bare stderr.
		klog.SetSlogLogger(log.With("component", "client-go"))
		if kube, err = discovery.NewKubernetes(f.Kubeconfig, f.Namespace); err != nil {
			return fail(fmt.Errorf("tier1: kubernetes discovery: %w", err))
		}
		kube.Logger = log
	default:
		return fail(usage(fmt.Errorf("--discovery %q: want static or kubernetes", f.Discovery)))
	}
	tp, err := startTracing(ctx, f.Tracing, "meridian-tier1", map[string]string{"meridian.cluster": f.Cluster, "meridian.replica": f.Replica})
	if err != nil {
		return fail(usage(err))
	}
	pxy := &proxy.Proxy{Gateway: gw, Logger: log, Tracer: tp.Tracer("github.com/meridian-router/meridian/tier1/proxy")}
	if f.AccessLog {
		pxy.AccessLog = log.With("log", "access", "component", "tier1")
	}
	px, err := listen("tier1 proxy", f.Listen, pxy.Handler())
	if err != nil {
		tp.Shutdown(ctx)
		return fail(err)
	}
	opened = append(opened, px.ln)
	inst.listeners = append(inst.listeners, px)
	if f.Metrics != "" {
		admin := metricsMux(reg)
		admin.Handle(hygiene.Path, prompts.Handler(gw.PrefillSeconds))
		ms, err := listen("tier1 metrics", f.Metrics, admin)
		if err != nil {
			return fail(err)
		}
		opened = append(opened, ms.ln)
		inst.listeners = append(inst.listeners, ms)
	}
	var healthLn net.Listener
	var pub *health.Publisher
	if f.Health != "" {
		if healthLn, err = net.Listen("tcp", f.Health); err != nil {
			return fail(fmt.Errorf("tier1 health feed: listen %s: %w", f.Health, err))
		}
		opened = append(opened, healthLn)
		gwCfg := src.Snapshot().Gateway(f.Cluster)
		region, cluster := f.Region, f.Cluster
		if gwCfg != nil {
			region = cmp.Or(region, gwCfg.Spec.Region)
			cluster = cmp.Or(cluster, gwCfg.Spec.Cluster, gwCfg.Metadata.Name)
		}
		pub = health.NewPublisher(gw, health.Config{Region: region, Cluster: cluster, Replica: f.Replica, Window: 10 * time.Second, Registerer: reg, Logger: log})
	}
	var extLn net.Listener
	var ext *extproc.Server
	if f.ExtProc != "" {
		if extLn, err = net.Listen("tcp", f.ExtProc); err != nil {
			return fail(fmt.Errorf("tier1 ext_proc: listen %s: %w", f.ExtProc, err))
		}
		ext = &extproc.Server{Gateway: gw, Registerer: reg, Logger: log}
		inst.extAddr = extLn.Addr().String()
	}
	inst.run = func(ctx context.Context) error {
		defer src.close()
		defer shutdownTracing(tp, log)
		updates := src.Subscribe()
		go src.run(ctx)
		gw.Start(ctx, updates)
		g, gctx := errgroup.WithContext(ctx)
		for _, s := range inst.listeners {
			g.Go(func() error { return s.serve(gctx, log) })
		}
		if kube != nil {
			g.Go(func() error { return kube.Run(gctx, gw.SetPods) })
		}
		if pub != nil {
			gs := grpc.NewServer()
			pub.Register(gs)
			if exchange != nil {
				exchange.Register(gs)
				exchange.Start(gctx, gw)
			}
			g.Go(func() error { pub.Run(gctx); return nil })
			g.Go(func() error { return gs.Serve(healthLn) })
			g.Go(func() error { <-gctx.Done(); gs.Stop(); return nil })
		}
		if ext != nil {
			g.Go(func() error { return ext.Serve(gctx, extLn, drainTimeout) })
		}
		log.Info("tier1 serving", "cluster", f.Cluster, "proxy", px.Addr(), "revision", src.Snapshot().Revision)
		return g.Wait()
	}
	return inst, nil
}
