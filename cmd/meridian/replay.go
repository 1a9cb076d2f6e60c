package main

import (
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/meridian-router/meridian/replay"
)

func init() { extraCommands = append(extraCommands, newReplayCmd) }

// newReplayCmd is `meridian replay`: a trace through routing policies on
// simulated pods in virtual time (package replay).
func newReplayCmd() *cobra.Command {
	var inv replay.Invocation
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Replay a trace through routing policies on simulated pods",
		Long: `Replay a request trace (Mooncake JSONL or Azure CSV) through one or more routing
policies against simulated vLLM pods in virtual time, and report TTFT, end-to-end
latency, throughput, prefix-cache hits, queue spread and preemptions.

Policies: ` + strings.Join(replay.PolicyKinds, ", ") + `. gie-default and meridian run the
real Tier-1 scheduler (GIE and Meridian scoring), fed pod metrics scraped every 50 ms
of virtual time. Weights: queue, kvCache, prefix, loraAffinity, runningRequests,
predictedLatency, lru. See docs/tuning.md.`,
		Example: `  meridian replay --trace conversation_trace.jsonl --fleet deploy/examples/fleets/mixed-h100-a10g.yaml \
    --compare round-robin,gie-default,meridian --jitter
  meridian replay --trace conversation_trace.jsonl --fleet fleet.yaml --policy meridian \
    --weights queue=2,kvCache=2,prefix=3 --sweep prefix=0,1,3,5,8
  meridian replay --trace AzureLLMInferenceTrace_conv.csv --fleet fleet.yaml \
    --compare round-robin,meridian --goodput-slo 2s --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 && cmd.ErrOrStderr() == os.Stderr {
				inv.Progress = true
			}
			return inv.Execute(cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&inv.Trace, "trace", "", "trace file (Mooncake .jsonl or Azure .csv)")
	f.StringVar(&inv.Load.Format, "format", "", "trace format: mooncake or azure (default: from the file name)")
	f.StringVar(&inv.Fleet, "fleet", "", "fleet file (pools of simulated pods; see deploy/examples/fleets)")
	f.StringVar(&inv.Policy, "policy", "", "the policy to replay")
	f.StringVar(&inv.Compare, "compare", "", "policies to compare, comma-separated")
	f.StringVar(&inv.Weights, "weights", "", "Meridian's weights, e.g. queue=2,kvCache=2,prefix=3 (unnamed weights are 0)")
	f.StringVar(&inv.Gateway, "gateway", "", "take Meridian's policy from this gateway config directory (with --scheduler)")
	f.StringVar(&inv.Scheduler, "scheduler", "", "the scheduler of --gateway to replay (name or gateway/name)")
	f.IntVar(&inv.Options.Replicas, "replicas", 1, "Tier-1 replicas taking requests in turn")
	f.Float64Var(&inv.Options.RateScale, "rate-scale", 1, "multiply the trace's arrival rate")
	f.BoolVar(&inv.Load.Jitter, "jitter", false, "spread arrivals that share a quantised timestamp over their 3 s bucket")
	f.Uint64Var(&inv.Options.Seed, "seed", 1, "random seed (same seed, same results)")
	f.DurationVar(&inv.Load.Duration, "duration", 0, "replay only the first D of the trace (trace time, before --rate-scale)")
	f.IntVar(&inv.Load.Limit, "limit", 0, "replay only the first N requests")
	f.BoolVar(&inv.Load.UniquePrompts, "unique-prompts", false, "ignore the trace's prefix hash ids: every prompt unique")
	f.BoolVar(&inv.JSON, "json", false, "write results as JSON")
	f.StringVar(&inv.Plot, "plot", "", "write a TTFT CDF of the policies to this SVG file")
	f.StringVar(&inv.Sweep, "sweep", "", "vary one Meridian weight, e.g. prefix=0,1,3,5; table sorted by P99 TTFT")
	f.DurationVar(&inv.GoodputSLO, "goodput-slo", 0, "find each policy's highest rate scale whose P99 TTFT meets this SLO")
	f.IntVar(&inv.Load.ZipfAdapters, "zipf-adapters", 0, "give requests one of N SYNTHETIC LoRA adapters, Zipf popularity")
	f.Float64Var(&inv.Load.ZipfS, "zipf-s", 2.3, "Zipf exponent for --zipf-adapters (2.3: top 3 of 40 carry 90%)")
	return cmd
}
