package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/meridian-router/meridian/aws/cloudwatch"
	"github.com/meridian-router/meridian/internal/trust"
	"github.com/meridian-router/meridian/tier2"
)

func init() { extraCommands = append(extraCommands, newTier2Cmd) }

type tier2Flags struct {
	gcPercent      int
	src            sourceFlags
	region, name   string
	listen         string
	metrics        string
	gossipBind     string
	join           []string
	gossipProfile  string
	insecureNoAuth bool
	subscribeAll   bool
	tlsCert        string
	tlsKey         string
	canaryPeriod   time.Duration
	cloudwatch     bool   // export per-Region aggregates to CloudWatch
	cloudwatchAWS  string // AWS Region of the CloudWatch endpoint
	identityKey    string // file of the key tenant and band are signed with for Tier-1
	front          tier2.Config
}

func newTier2Cmd() *cobra.Command {
	var f tier2Flags
	cmd := &cobra.Command{
		Use:   "tier2",
		Short: "Run a Region's global router (the authenticated OpenAI front door)",
		Long: "Tier-2 authenticates callers, resolves canary splits, admits by priority band, enforces\n" +
			"global per-tenant rate limits, picks a cluster in some Region from gossiped pool health and\n" +
			"forwards to its Tier-1, failing over before the first response byte.",
		Example: "  meridian tier2 --config deploy/examples --region us-east-1 --listen :8080 \\\n" +
			"    --gossip-bind 10.0.0.5:7946 --join tier2.us-east-1:7946,tier2.eu-west-1:7946",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTier2(cmd.Context(), f, slog.Default())
		},
	}
	f.src.register(cmd)
	registerGC(cmd, &f.gcPercent)
	host, _ := os.Hostname()
	cmd.Flags().StringVar(&f.region, "region", "", "Region this instance serves (required)")
	cmd.Flags().StringVar(&f.name, "name", host, "unique name of this instance (gossip and rate-limit peer name)")
	cmd.Flags().StringVar(&f.listen, "listen", ":8080", "address of the OpenAI front door")
	cmd.Flags().StringVar(&f.metrics, "metrics", ":9090", "address of the Prometheus /metrics endpoint (empty: off)")
	cmd.Flags().StringVar(&f.gossipBind, "gossip-bind", "", "memberlist bind address host:port (empty: no gossip)")
	cmd.Flags().StringSliceVar(&f.join, "join", nil, "gossip addresses of other Tier-2 instances (any Region)")
	cmd.Flags().StringVar(&f.gossipProfile, "gossip-profile", "", "override the Topology's spec.gossip.profile (memberlist timing: lan, wan or local; default wan); read at start")
	cmd.Flags().BoolVar(&f.insecureNoAuth, "insecure-no-auth", false, "admit callers without a token, as tenant \"anonymous\" (development only)")
	cmd.Flags().BoolVar(&f.subscribeAll, "subscribe-all", false, "subscribe to every cluster's health feed, not only this Region's (a lone Tier-2 without gossip)")
	cmd.Flags().BoolVar(&f.cloudwatch, "cloudwatch", false, "publish per-Region aggregates (requests, P99 TTFT per model, 429 rate, failovers) to CloudWatch with PutMetricData (standard AWS credential chain)")
	cmd.Flags().StringVar(&f.cloudwatchAWS, "cloudwatch-region", "", "AWS Region of the CloudWatch endpoint (default: the SDK's: AWS_REGION, shared config)")
	cmd.Flags().StringVar(&f.tlsCert, "tls-cert", "", "TLS certificate file (with --tls-key: serve HTTPS and HTTP/2)")
	cmd.Flags().StringVar(&f.tlsKey, "tls-key", "", "TLS key file")
	cmd.Flags().StringVar(&f.identityKey, "identity-key-file", "", "file of the key that signs the tenant and band sent to Tier-1s (same file as tier1's --identity-key-file; empty: sent unsigned)")
	cmd.Flags().StringVar(&f.front.DefaultTenant, "default-tenant", "", "Tenant whose policy applies to callers whose tenant has no Tenant object (empty: they are refused with 403)")
	cmd.Flags().BoolVar(&f.front.ExposeUpstream, "expose-upstream", false, "show callers the pod address Tier-1 served from (x-gateway-destination-endpoint-served; debugging only)")
	cmd.Flags().DurationVar(&f.front.BodyReadTimeout, "body-read-timeout", 30*time.Second, "longest time to receive a request body (408 after it)")
	cmd.Flags().DurationVar(&f.front.UpstreamHeaderTimeout, "upstream-header-timeout", 60*time.Second, "longest wait for a Tier-1's response headers to a streaming request before failing over (504 when no cluster answers)")
	cmd.Flags().DurationVar(&f.front.UpstreamResponseTimeout, "upstream-response-timeout", 10*time.Minute, "the same for a non-streaming request, whose headers come with the whole completion")
	cmd.Flags().DurationVar(&f.front.StreamIdleTimeout, "stream-idle-timeout", 60*time.Second, "end a stream with an error event when its Tier-1 sends nothing for this long")
	cmd.Flags().IntVar(&f.front.MaxHeaders, "max-headers", 100, "most request header values accepted (431 beyond; header bytes are limited to 64 KiB)")
	cmd.Flags().DurationVar(&f.canaryPeriod, "canary-period", 0, "override the Topology's spec.routing.canaryAnalysis.period: longest time between two canary analyses (default 5s)")
	return cmd
}

type tier2Instance struct {
	inst    *tier2.Instance
	servers []*server
	run     func(ctx context.Context) error
}

func startTier2(ctx context.Context, f tier2Flags, keys *tier2.KeySet, transport http.RoundTripper, log *slog.Logger, gt memberlist.Transport) (*tier2Instance, error) {
	if f.region == "" {
		return nil, &exitError{2, fmt.Errorf("--region is required")}
	}
	switch f.gossipProfile {
	case "", "lan", "wan", "local":
	default:
		return nil, &exitError{2, fmt.Errorf("--gossip-profile %q: want lan, wan or local", f.gossipProfile)}
	}
	if f.canaryPeriod < 0 {
		return nil, &exitError{2, fmt.Errorf("--canary-period %s: must not be negative", f.canaryPeriod)}
	}
	reg := newRegistry()
	root, err := f.src.fileRoot()
	if err != nil {
		return nil, &exitError{2, err}
	}
	f.src.check = tier2.Usable
	src, err := f.src.open(ctx, reg, log)
	if err != nil {
		return nil, err
	}
	store, closeStore, err := canaryStore(f.src)
	if err != nil {
		src.close()
		return nil, err
	}
	closeSrc := src.close
	src.close = func() { closeStore(); closeSrc() }
	front := f.front
	if f.identityKey != "" {
		if front.Tier1Key, err = trust.ReadKey(f.identityKey); err != nil {
			src.close()
			return nil, &exitError{2, err}
		}
	}
	inst, err := tier2.NewInstance(ctx, tier2.InstanceConfig{
		Region: f.region, Name: f.name, GossipBind: f.gossipBind, GossipJoin: f.join, GossipProfile: f.gossipProfile,
		SubscribeAll: f.subscribeAll, InsecureNoAuth: f.insecureNoAuth, ConfigDir: root, Keys: keys,
		Transport: transport, Registerer: reg, Logger: log, GossipTransport: gt,
		Canary: tier2.CanaryConfig{Store: store, Period: f.canaryPeriod}, FrontDoor: front,
	}, src.Snapshot())
	if err != nil {
		src.close()
		return nil, err
	}
	out := &tier2Instance{inst: inst}
	fs, err := listen("tier2", f.listen, inst.Handler())
	if err != nil {
		src.close()
		return nil, err
	}
	frontDoorServer(fs, inst.Router.Abort)
	out.servers = append(out.servers, fs)
	if f.metrics != "" {
		admin := metricsHandler(reg).(*http.ServeMux)
		admin.Handle("GET /meridian/canary", inst.AdminHandler())
		ms, err := listen("tier2 metrics", f.metrics, admin)
		if err != nil {
			fs.ln.Close()
			src.close()
			return nil, err
		}
		out.servers = append(out.servers, ms)
	}
	var exporter *cloudwatch.Exporter
	if f.cloudwatch {
		c, err := cloudwatch.NewClient(ctx, cloudwatch.ClientOptions{Region: f.cloudwatchAWS})
		if err != nil {
			src.close()
			return nil, fmt.Errorf("tier2: --cloudwatch: %w", err)
		}
		if exporter, err = cloudwatch.New(c, cloudwatch.Config{Region: f.region}, cloudwatch.FromGatherer(reg)); err != nil {
			src.close()
			return nil, fmt.Errorf("tier2: --cloudwatch: %w", err)
		}
	}
	out.run = func(ctx context.Context) error {
		defer src.close()
		updates := src.Subscribe()
		go src.run(ctx)
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error { inst.Run(gctx, updates); return nil })
		if exporter != nil {
			g.Go(func() error {
				exporter.Run(gctx, func(err error) { log.Warn("tier2: CloudWatch export failed; will retry", "error", err) })
				return nil
			})
		}
		for i, s := range out.servers {
			if i == 0 && f.tlsCert != "" {
				g.Go(func() error { return s.serveTLS(gctx, log, f.tlsCert, f.tlsKey) })
				continue
			}
			g.Go(func() error { return s.serve(gctx, log) })
		}
		log.Info("tier2 serving", "region", f.region, "listen", fs.Addr(), "revision", src.Snapshot().Revision)
		return g.Wait()
	}
	return out, nil
}

// frontDoorServer sets up the front door's listener: HTTP/1.1 and h2c,
// at most 64 KiB of request headers (Go answers 431 beyond), and abort
// (the router's) called at a drain's deadline so that the streams still
// open get an error event before their connections close.
func frontDoorServer(s *server, abort func()) {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	protos.SetUnencryptedHTTP2(true)
	s.srv.Protocols = &protos
	s.srv.MaxHeaderBytes = 64 << 10
	s.abort = abort
}

func runTier2(ctx context.Context, f tier2Flags, log *slog.Logger) error {
	applyGC(f.gcPercent, log)
	t, err := startTier2(ctx, f, nil, nil, log, nil)
	if err != nil {
		return err
	}
	return t.run(ctx)
}
