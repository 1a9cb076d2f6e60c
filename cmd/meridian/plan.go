package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/meridian-router/meridian/plan"
)

// newPlanCmd is `meridian plan capacity|lora`: pool sizes and LoRA pool
// layouts searched by replaying peak traffic (package plan).
func newPlanCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Plan pods per pool and LoRA pools from replayed peak traffic",
		Long: `Size model-server pools by replaying peak traffic through Meridian's shipped scheduler
on simulated pods: the cheapest GPU mix meeting a P99 TTFT SLO (capacity), and the split
of LoRA adapters into a hot-set pool and a long-tail pool (lora). See docs/planning.md.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newPlanCapacityCmd(), newPlanLoRACmd())
	return cmd
}

func newPlanCapacityCmd() *cobra.Command {
	inv := new(plan.Invocation)
	cmd := newPlanSubCmd(inv, "capacity", "The fewest pods per pool (the cheapest GPU mix) that meet a TTFT SLO at peak",
		`  meridian plan capacity --trace testdata/traces/AzureLLMInferenceTrace_conv.csv \
    --fleet deploy/examples/fleets/mixed-h100-a10g.yaml --slo-ttft-p99 2s --peak-scale 4 --out planned.yaml
  meridian plan capacity --from-prometheus http://prometheus:9090 --prometheus-pool chat \
    --fleet fleet.yaml --gpus h100,a100,l40s,a10g --slo-ttft-p99 2s --json`,
		inv.Capacity)
	f := cmd.Flags()
	f.StringVar(&inv.Source.Prometheus.URL, "from-prometheus", "", "take the peak rate and length distributions from this Prometheus instead of a trace")
	f.DurationVar(&inv.Source.Prometheus.Window, "prometheus-window", 0, "how far back Prometheus is searched for the peak (default 24h)")
	f.DurationVar(&inv.Source.Span, "prometheus-span", 0, "virtual time of the synthetic peak workload (default 10m, at most 20,000 requests)")
	f.StringVar(&inv.Out, "out", "", "write the plan as a fleet file (meridian replay --fleet reads it)")
	f.StringVar(&inv.Plot, "plot", "", "write an SVG of P99 TTFT against pods per pool around the plan")
	return cmd
}

func newPlanLoRACmd() *cobra.Command {
	inv := new(plan.Invocation)
	cmd := newPlanSubCmd(inv, "lora", "Split LoRA adapters into a hot-set pool and a long-tail pool, sized and replayed",
		`  meridian plan lora --trace testdata/traces/AzureLLMInferenceTrace_conv.csv --adapters-from zipf:40,2.3 \
    --fleet deploy/examples/fleets/uniform-h100.yaml --peak-scale 2`,
		inv.LoRA)
	f := cmd.Flags()
	f.StringVar(&inv.AdaptersFrom, "adapters-from", "", "adapter popularity: trace, zipf:N,s (SYNTHETIC, e.g. zipf:40,2.3) or a Prometheus URL (Tier-1's requests by model)")
	f.Float64Var(&inv.HotShare, "hot-share", 0.9, "share of adapter requests the hot set carries")
	return cmd
}

// newPlanSubCmd is a `meridian plan` subcommand that runs do, a method of
// inv, with the flags every plan takes (planFlags) and progress lines.
func newPlanSubCmd(inv *plan.Invocation, use, short, example string, do func(context.Context, io.Writer) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			inv.Progress = progressLines(cmd)
			return do(cmd.Context(), cmd.OutOrStdout())
		},
	}
	planFlags(cmd.Flags(), inv)
	return cmd
}

func planFlags(f *pflag.FlagSet, inv *plan.Invocation) {
	f.StringVar(&inv.Source.Trace, "trace", "", "trace file (Mooncake .jsonl or Azure .csv) of the traffic to plan for")
	f.StringVar(&inv.Source.Load.Format, "format", "", "trace format: mooncake or azure (default: from the file name)")
	f.BoolVar(&inv.Source.Load.Jitter, "jitter", false, "spread arrivals that share a quantised timestamp over their 3 s bucket")
	f.IntVar(&inv.Source.Load.Limit, "limit", 0, "use only the first N requests of the trace")
	f.Float64Var(&inv.Source.PeakScale, "peak-scale", 0, "the peak is the trace at X times its rate (default 1)")
	f.Float64Var(&inv.Source.PeakRPS, "peak-rps", 0, "the peak is the trace scaled to R requests per second")
	f.StringVar(&inv.Source.Prometheus.Pool, "prometheus-pool", "", "with Prometheus: keep series with this pool label")
	f.StringVar(&inv.Fleet, "fleet", "", "fleet file: the pools to size (see deploy/examples/fleets) and their prices")
	f.StringVar(&inv.GPUs, "gpus", "", "GPU profiles the plan may use, e.g. h100,a100,l40s,a10g (default: the fleet's)")
	f.DurationVar(&inv.SLO, "slo-ttft-p99", 0, "the SLO: P99 time to first token, e.g. 2s (required)")
	f.IntVar(&inv.MaxPods, "max-pods", 0, "most pods per pool the search tries (default 64)")
	f.Uint64Var(&inv.Seed, "seed", 1, "random seed (same seed, same plan)")
	f.BoolVar(&inv.JSON, "json", false, "write the plan as JSON")
}

// progressLines prints one line per replay on stderr when it is a
// terminal.
func progressLines(cmd *cobra.Command) func(string) {
	fi, err := os.Stderr.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 || cmd.ErrOrStderr() != os.Stderr {
		return nil
	}
	return func(line string) { fmt.Fprintln(os.Stderr, line) }
}
