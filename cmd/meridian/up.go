package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/platform"
)

func init() { extraCommands = append(extraCommands, newUpCmd) }

type upFlags struct {
	platform platform.Config
	targets  string
	verbose  bool
}

func newUpCmd() *cobra.Command {
	var f upFlags
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a local multi-Region platform with simulated model servers",
		Long: "Start, in one process on loopback, the example platform (deploy/examples/platform, embedded\n" +
			"in the binary): every Region's Tier-2, every cluster's Tier-1 and simulated model-server pods\n" +
			"of mixed GPU generations. Cross-Region hops get an injected delay so Region proximity is real.\n" +
			"It prints the endpoint, a development token and a sample request. Ctrl-C stops everything.",
		Example: "  meridian up\n  meridian up --ports auto --tenant claims-team\n  meridian up --criticality critical\n  meridian up --otlp-endpoint http://127.0.0.1:4317\n  meridian up --listen 127.0.0.1:9000 --config deploy/examples/platform",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level := slog.LevelWarn
			if f.verbose {
				level = slog.LevelInfo
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			return runUp(cmd.Context(), f, cmd.OutOrStdout(), log)
		},
	}
	p := &f.platform
	p.Version = versionString()
	cmd.Flags().StringVar(&p.Dir, "config", "", "configuration directory (default: the embedded example platform)")
	cmd.Flags().StringVar(&p.Listen, "listen", "", "address of the first Region's Tier-2 (default: the Topology's)")
	cmd.Flags().Float64Var(&p.TimeScale, "time-scale", 10, "simulated model seconds per wall-clock second")
	cmd.Flags().DurationVar(&p.CrossRegionDelay, "cross-region-delay", 40*time.Millisecond, "one-way delay injected on cross-Region hops")
	cmd.Flags().StringVar(&p.Tenant, "tenant", "support-team", "tenant of the printed development token")
	cmd.Flags().StringVar(&p.Criticality, "criticality", "Standard", "band the printed token claims: Critical, Standard or Sheddable (refused above the tenant's maxBand)")
	tracingFlags(cmd.Flags(), &p.Tracing)
	cmd.Flags().BoolVar(&p.AccessLog, "access-log", false, "log a line per request of every Tier-2 and Tier-1 (with -v)")
	cmd.Flags().StringVar(&p.Ports, "ports", platform.PortsConfig, "listen ports: config (the configuration's, moving any that is taken to a free one) or auto (free ports for everything)")
	cmd.Flags().StringVar(&f.targets, "prometheus-targets", "", "write a Prometheus file_sd JSON of every metrics endpoint to this file")
	cmd.Flags().BoolVarP(&f.verbose, "verbose", "v", false, "log at info level")
	cmd.Flags().StringSliceVar(&p.Etcd, "etcd", nil, "serve the configuration from etcd (seeded with --config or the example when the prefix is empty), so that 'meridian canary --etcd' can change it")
	cmd.Flags().StringVar(&p.Prefix, "prefix", config.DefaultPrefix, "etcd key prefix (with --etcd)")
	cmd.Flags().DurationVar(&p.DrainTimeout, "drain-timeout", 30*time.Second, "on SIGTERM or Ctrl-C, how long the Tier-2s wait for open requests (then each open stream gets a shutting_down event); Tier-1s and pods stop after them")
	registerKubernetes(cmd, &p.Kubernetes, &p.Kubeconfig, &p.Namespace)
	return cmd
}

func runUp(ctx context.Context, f upFlags, out io.Writer, log *slog.Logger) error {
	p, err := platform.Start(ctx, f.platform, log)
	if err != nil {
		return err
	}
	if f.targets != "" {
		if err := p.WriteTargets(f.targets); err != nil {
			return err
		}
	}
	// The endpoint is printed once a request to it can be served (every
	// Tier-2 knows every pool ready), or after readyWait in any case.
	done := make(chan error, 1)
	wait, stopWaiting := context.WithTimeout(ctx, readyWait)
	defer stopWaiting()
	go func() { done <- p.Run(ctx); stopWaiting() }()
	if err := p.Ready(wait); err != nil {
		select {
		case err := <-done: // a component failed
			return err
		default:
		}
		if ctx.Err() != nil { // stopped before it was ready
			return <-done
		}
		log.Warn("not every pool is ready yet; the endpoint may answer 503 for a while", "waited", readyWait)
	}
	printUp(out, f.platform.Tenant, f.platform.Criticality, p)
	return <-done
}

// readyWait bounds how long up waits for the platform to be ready before
// printing the endpoint.
const readyWait = 30 * time.Second

// printUp tells the operator where the platform listens and how to call it.
func printUp(out io.Writer, tenant, band string, p *platform.Platform) {
	first := p.Endpoints[p.Regions[0]]
	fmt.Fprintf(out, "Meridian is up: %d Regions, %d simulated pods.\n", len(p.Endpoints), len(p.Pods))
	for _, r := range p.Regions {
		fmt.Fprintf(out, "  %-10s %s\n", r, p.Endpoints[r])
	}
	for _, c := range slices.Sorted(maps.Keys(p.Tier1)) {
		fmt.Fprintf(out, "  tier1 %-14s http://%s\n", c, p.Tier1[c])
	}
	moved := slices.SortedFunc(slices.Values(p.Moved), func(a, b platform.PortMove) int { return strings.Compare(a.What, b.What) })
	for _, m := range moved {
		fmt.Fprintf(out, "  moved %-20s %s → %s (port taken or --ports auto)\n", m.What, m.From, m.To)
	}
	admin := p.Admin()
	for _, r := range p.Regions {
		fmt.Fprintf(out, "  admin %-14s %s (GET /metrics, /meridian/canary, /meridian/drift: canary status --tier2, config drift --tier2)\n", r, admin[r])
	}
	fmt.Fprintf(out, "metrics: %d endpoints on free ports (--prometheus-targets writes them); gossip: in-process loopback network\n", len(p.Metrics))
	fmt.Fprintf(out, "endpoint: %s\n", first)
	fmt.Fprintf(out, "tenant: %s (the token's tenant; another with --tenant)\n", tenant)
	fmt.Fprintf(out, "criticality: %s (the token's band; another with --criticality)\n", cmp.Or(band, "Standard"))
	fmt.Fprintf(out, "token: %s\n", p.Token)
	fmt.Fprintf(out, "\nTry:\n  curl -s %s/v1/chat/completions \\\n    -H \"Authorization: Bearer %s\" \\\n    -H 'Content-Type: application/json' \\\n    -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'\n", first, p.Token, p.SampleModel(tenant))
	fmt.Fprintf(out, "\nModels:\n  curl -s %s/v1/models -H \"Authorization: Bearer %s\"\n\nCtrl-C (or SIGTERM) drains and stops everything.\n", first, p.Token)
}
