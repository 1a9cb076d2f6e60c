package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"

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

func init() { extraCommands = append(extraCommands, newTier1Cmd) }

type tier1Flags struct {
	gcPercent      int
	src            sourceFlags
	cluster        string
	replica        string
	listen         string
	metrics        string
	scrapeInterval time.Duration
	maxMetricsAge  time.Duration
	health         string // pool-health feed address (empty: off)
	region         string // Region named in health digests
	discovery      string // static | kubernetes
	kubeconfig     string
	namespace      string
	extproc        string   // ext_proc picker address (empty: off)
	peers          []string // other replicas' --health addresses
	promptSamples  bool     // keep redacted prompt samples for the hygiene report
	identityKey    string   // file of the key Tier-2 signs tenant and band with
	identity       []byte   // the key itself (meridian up generates one); wins over identityKey
}

func newTier1Cmd() *cobra.Command {
	var f tier1Flags
	cmd := &cobra.Command{
		Use:   "tier1",
		Short: "Run one cluster's endpoint picker (standalone streaming proxy)",
		Long: "Tier-1 picks the model-server pod for each request of one cluster. It reads the cluster's\n" +
			"InferenceGatewayConfig, discovers the pods of every scheduler, scrapes their metrics and\n" +
			"forwards OpenAI requests to the pod its scorers pick, with fallbacks.",
		Example: "  meridian tier1 --config deploy/examples --cluster us-east-1a --listen :8080 --metrics :9090",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTier1(cmd.Context(), f, slog.Default())
		},
	}
	f.src.register(cmd)
	registerGC(cmd, &f.gcPercent)
	host, _ := os.Hostname()
	cmd.Flags().StringVar(&f.cluster, "cluster", "", "cluster whose InferenceGatewayConfig to serve (spec.cluster or metadata.name)")
	cmd.Flags().StringVar(&f.replica, "replica", host, "name of this replica among the cluster's Tier-1s")
	cmd.Flags().StringVar(&f.listen, "listen", ":8080", "address of the OpenAI proxy")
	cmd.Flags().StringVar(&f.metrics, "metrics", ":9090", "address of the Prometheus /metrics endpoint (empty: off)")
	cmd.Flags().StringVar(&f.health, "health", "", "address of the pool-health gRPC feed Tier-2 subscribes to (empty: off)")
	cmd.Flags().StringVar(&f.region, "region", "", "Region named in health digests (default: the gateway's spec.region)")
	cmd.Flags().StringVar(&f.extproc, "extproc", "", "address of the Envoy ext_proc endpoint picker (GIE protocol; conventional :9002; empty: off)")
	cmd.Flags().StringSliceVar(&f.peers, "peers", nil, "the other Tier-1 replicas of this cluster (their --health addresses), to share prefix-index events")
	cmd.Flags().StringVar(&f.discovery, "discovery", "static", "pod discovery: static (StaticEndpoints only) or kubernetes (also watch pods)")
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig for --discovery kubernetes (default: in-cluster service account)")
	cmd.Flags().StringVar(&f.namespace, "namespace", "", "namespace whose pods to watch (default: the kubeconfig's, or this pod's)")
	cmd.Flags().StringVar(&f.identityKey, "identity-key-file", "", "file of the key Tier-2s sign x-meridian-tenant/x-meridian-band with (same file as tier2's); unsigned tenant or band headers are then refused (empty: trusted unsigned, keep Tier-1 unreachable except from Tier-2)")
	cmd.Flags().DurationVar(&f.scrapeInterval, "scrape-interval", 50*time.Millisecond, "how often each pod's metrics are polled")
	cmd.Flags().DurationVar(&f.maxMetricsAge, "max-metrics-age", time.Second, "a pod whose last scrape is older is avoided (all stale: fail open)")
	cmd.Flags().BoolVar(&f.promptSamples, "prompt-samples", false, "keep a short redacted sample of where each tenant's prompts diverge, for `meridian diagnose prompts` (prompt text leaves the process)")
	return cmd
}

// tier1Instance is a started Tier-1: its gateway and listeners.
type tier1Instance struct {
	gw       *gateway.Gateway
	exchange *peers.Exchange
	servers  []*server
	run      func(ctx context.Context) error
}

func startTier1(ctx context.Context, f tier1Flags, log *slog.Logger) (*tier1Instance, error) {
	reg := newRegistry()
	src, err := f.src.open(ctx, reg, log)
	if err != nil {
		return nil, err
	}
	var prompts *hygiene.Sketch // read only through the metrics listener
	if f.metrics != "" {
		prompts = hygiene.New(hygiene.Config{Samples: f.promptSamples})
		reg.MustRegister(prompts.Collector())
	}
	gcfg := gateway.Config{
		Cluster:    f.cluster,
		Replica:    f.replica,
		Scrape:     scrape.Config{Interval: f.scrapeInterval},
		Options:    tier1.Options{MaxMetricsAge: f.maxMetricsAge},
		Registerer: reg,
		Logger:     log,
		Prompts:    prompts,
	}
	gcfg.Tier2Key = f.identity
	if f.identityKey != "" && f.identity == nil {
		if gcfg.Tier2Key, err = trust.ReadKey(f.identityKey); err != nil {
			src.close()
			return nil, &exitError{2, err}
		}
	}
	var exchange *peers.Exchange
	if len(f.peers) > 0 {
		if f.health == "" {
			src.close()
			return nil, &exitError{2, fmt.Errorf("--peers needs --health: replicas exchange events on the health gRPC port")}
		}
		if exchange, err = peers.New(peers.Config{Replica: f.replica, Peers: f.peers, Registerer: reg, Logger: log}); err != nil {
			src.close()
			return nil, err
		}
		gcfg.OnDispatch = exchange.Publish
		gcfg.OnInFlight = exchange.PublishInFlight
	}
	gw, err := gateway.New(gcfg, src.Snapshot())
	if err != nil {
		src.close()
		return nil, err
	}
	inst := &tier1Instance{gw: gw, exchange: exchange}
	var kube *discovery.Kubernetes
	switch f.discovery {
	case "static", "":
	case "kubernetes":
		// client-go logs through klog; route it into this process's slog
		// so that its lines are structured like ours, not bare stderr.
		klog.SetSlogLogger(log.With("component", "client-go"))
		if kube, err = discovery.NewKubernetes(f.kubeconfig, f.namespace); err != nil {
			src.close()
			return nil, fmt.Errorf("tier1: kubernetes discovery: %w", err)
		}
		kube.Logger = log
	default:
		src.close()
		return nil, &exitError{2, fmt.Errorf("--discovery %q: want static or kubernetes", f.discovery)}
	}
	px, err := listen("tier1 proxy", f.listen, (&proxy.Proxy{Gateway: gw, Logger: log}).Handler())
	if err != nil {
		src.close()
		return nil, err
	}
	inst.servers = append(inst.servers, px)
	if f.metrics != "" {
		admin := http.NewServeMux()
		admin.Handle("/", metricsHandler(reg))
		admin.Handle(hygiene.Path, prompts.Handler(gw.PrefillSeconds))
		ms, err := listen("tier1 metrics", f.metrics, admin)
		if err != nil {
			px.ln.Close()
			src.close()
			return nil, err
		}
		inst.servers = append(inst.servers, ms)
	}
	var healthLn net.Listener
	var pub *health.Publisher
	if f.health != "" {
		if healthLn, err = net.Listen("tcp", f.health); err != nil {
			for _, s := range inst.servers {
				s.ln.Close()
			}
			src.close()
			return nil, fmt.Errorf("tier1 health feed: listen %s: %w", f.health, err)
		}
		gwCfg := src.Snapshot().Gateway(f.cluster)
		region, cluster := f.region, f.cluster
		if gwCfg != nil {
			region = cmp.Or(region, gwCfg.Spec.Region)
			cluster = cmp.Or(cluster, gwCfg.Spec.Cluster, gwCfg.Metadata.Name)
		}
		pub = health.NewPublisher(gw, health.Config{Region: region, Cluster: cluster, Replica: f.replica, Window: 10 * time.Second, Registerer: reg, Logger: log})
	}
	var extLn net.Listener
	var ext *extproc.Server
	if f.extproc != "" {
		if extLn, err = net.Listen("tcp", f.extproc); err != nil {
			for _, s := range inst.servers {
				s.ln.Close()
			}
			if healthLn != nil {
				healthLn.Close()
			}
			src.close()
			return nil, fmt.Errorf("tier1 ext_proc: listen %s: %w", f.extproc, err)
		}
		ext = &extproc.Server{Gateway: gw, Registerer: reg, Logger: log}
	}
	inst.run = func(ctx context.Context) error {
		defer src.close()
		updates := src.Subscribe()
		go src.run(ctx)
		gw.Start(ctx, updates)
		g, gctx := errgroup.WithContext(ctx)
		for _, s := range inst.servers {
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
		log.Info("tier1 serving", "cluster", f.cluster, "proxy", px.Addr(), "revision", src.Snapshot().Revision)
		return g.Wait()
	}
	return inst, nil
}

func runTier1(ctx context.Context, f tier1Flags, log *slog.Logger) error {
	applyGC(f.gcPercent, log)
	inst, err := startTier1(ctx, f, log)
	if err != nil {
		return err
	}
	if err := inst.run(ctx); err != nil {
		return fmt.Errorf("tier1: %w", err)
	}
	return nil
}
