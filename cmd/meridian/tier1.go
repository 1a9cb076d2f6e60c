package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/meridian-router/meridian/platform"
)

func init() { extraCommands = append(extraCommands, newTier1Cmd) }

type tier1Flags struct {
	gcPercent int
	tier1     platform.Tier1Config
}

func newTier1Cmd() *cobra.Command {
	var f tier1Flags
	t := &f.tier1
	cmd := newProxyCmd("tier1", "Run one cluster's endpoint picker (standalone streaming proxy)",
		"Tier-1 picks the model-server pod for each request of one cluster. It reads the cluster's\n"+
			"InferenceGatewayConfig, discovers the pods of every scheduler, scrapes their metrics and\n"+
			"forwards OpenAI requests to the pod its scorers pick, with fallbacks.",
		"  meridian tier1 --config deploy/examples --cluster us-east-1a --listen :8080 --metrics :9090",
		&t.Source, &f.gcPercent, func(ctx context.Context, log *slog.Logger) error { return runTier1(ctx, f, log) })
	t.Version = versionString()
	host, _ := os.Hostname()
	cmd.Flags().StringVar(&t.Cluster, "cluster", "", "cluster whose InferenceGatewayConfig to serve (spec.cluster or metadata.name)")
	cmd.Flags().StringVar(&t.Replica, "replica", host, "name of this replica among the cluster's Tier-1s")
	cmd.Flags().StringVar(&t.Listen, "listen", ":8080", "address of the OpenAI proxy")
	cmd.Flags().StringVar(&t.Metrics, "metrics", ":9090", "address of the Prometheus /metrics endpoint (empty: off)")
	cmd.Flags().StringVar(&t.Health, "health", "", "address of the pool-health gRPC feed Tier-2 subscribes to (empty: off)")
	cmd.Flags().StringVar(&t.Region, "region", "", "Region named in health digests (default: the gateway's spec.region)")
	cmd.Flags().StringVar(&t.ExtProc, "extproc", "", "address of the Envoy ext_proc endpoint picker (GIE protocol; conventional :9002; empty: off)")
	cmd.Flags().StringSliceVar(&t.Peers, "peers", nil, "the other Tier-1 replicas of this cluster (their --health addresses), to share prefix-index events")
	cmd.Flags().StringVar(&t.Discovery, "discovery", "static", "pod discovery: static (StaticEndpoints only) or kubernetes (also watch pods)")
	cmd.Flags().StringVar(&t.IdentityKeyFile, "identity-key-file", "", "file of the key Tier-2s sign x-meridian-tenant/x-meridian-band with (same file as tier2's); unsigned tenant or band headers are then refused (empty: trusted unsigned, keep Tier-1 unreachable except from Tier-2)")
	cmd.Flags().DurationVar(&t.ScrapeInterval, "scrape-interval", 50*time.Millisecond, "how often each pod's metrics are polled")
	cmd.Flags().DurationVar(&t.MaxMetricsAge, "max-metrics-age", time.Second, "a pod whose last scrape is older is avoided (all stale: fail open)")
	tracingFlags(cmd.Flags(), &t.Tracing)
	cmd.Flags().BoolVar(&t.AccessLog, "access-log", false, "log a line per proxied request (request id, path, status, pod, duration) at info")
	cmd.Flags().BoolVar(&t.PromptSamples, "prompt-samples", false, "keep a short redacted sample of where each tenant's prompts diverge, for 'meridian diagnose prompts' (prompt text leaves the process)")
	return cmd
}

func runTier1(ctx context.Context, f tier1Flags, log *slog.Logger) error {
	applyGC(f.gcPercent, log)
	// --kubeconfig and --namespace serve pod discovery and the
	// Kubernetes configuration source alike.
	f.tier1.Kubeconfig, f.tier1.Namespace = f.tier1.Source.Kubeconfig, f.tier1.Source.Namespace
	inst, err := platform.StartTier1(ctx, f.tier1, log)
	if err != nil {
		return err
	}
	if err := inst.Run(ctx); err != nil {
		return fmt.Errorf("tier1: %w", err)
	}
	return nil
}
