package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/meridian-router/meridian/internal/tracing"
	"github.com/meridian-router/meridian/sim"
)

func init() { extraCommands = append(extraCommands, newSimCmd) }

// newSimCmd is `meridian sim`: simulated vLLM pods on consecutive ports.
func newSimCmd() *cobra.Command {
	var (
		profile, model, adapters, host, metrics, fleet, endpoints string
		port, pods, maxTokens                                     int
		timeScale                                                 float64
		faults                                                    sim.Faults
		labels                                                    map[string]string
		labelMetrics                                              bool
		tracingCfg                                                tracing.Config
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run simulated vLLM model-server pods",
		Long: `Start K simulated vLLM pods on consecutive ports. Each serves the OpenAI API
(/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses,
/v1/models), /health, /metrics with vLLM's
metric names, and /sim/faults (GET, PUT a JSON Faults object to inject errors,
slowness, hangs or mid-stream crashes at run time, e.g.
curl -X PUT localhost:8000/sim/faults -d '{"hang":true}').

GPU profiles: ` + strings.Join(sim.ProfileNames(), ", ") + `. See docs/simulator.md.`,
		Example: `  meridian sim --profile h100 --model llama --adapters sql,chat --port 8000 --pods 4
  meridian sim --fleet fleet.yaml --port 9000 --time-scale 10`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			names, err := sim.ParseMetricNames(metrics)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			tracingCfg.Service = "meridian-sim"
			tp, err := tracing.Start(ctx, tracingCfg)
			if err != nil {
				return err
			}
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				tp.Shutdown(sctx)
			}()
			spec := sim.PodSpec{
				Host: host, BasePort: port, TimeScale: timeScale, Metrics: names, DefaultMaxTokens: maxTokens,
				LabelMetrics: labelMetrics, Tracer: tp.Tracer("github.com/meridian-router/meridian/sim"),
			}
			var live []*sim.LivePod
			if fleet != "" {
				for _, name := range []string{"profile", "model", "adapters", "pods", "labels",
					"error-rate", "reject-rate", "slow-factor", "crash-after-tokens"} {
					if cmd.Flags().Changed(name) {
						return fmt.Errorf("sim: --fleet describes the pods (faults and labels included); do not combine it with --%s", name)
					}
				}
				f, err := sim.LoadFleet(fleet)
				if err != nil {
					return err
				}
				live, err = sim.StartFleet(ctx, f, spec)
				if err != nil {
					return err
				}
			} else {
				prof, err := sim.LookupProfile(profile)
				if err != nil {
					return err
				}
				spec.Pod = sim.PodConfig{Name: prof.Name, Profile: prof, Model: model, Faults: faults, Labels: map[string]string{"gpu": prof.Name}}
				for k, v := range labels {
					spec.Pod.Labels[k] = v
				}
				if adapters != "" {
					spec.Pod.Adapters = strings.Split(adapters, ",")
				}
				live, err = sim.StartPods(ctx, spec, pods)
				if err != nil {
					return err
				}
			}
			out := cmd.OutOrStdout()
			// Comment lines, so that stdout stays valid YAML with
			// --endpoints-out -.
			for _, p := range live {
				fmt.Fprintln(out, "#", p)
			}
			if endpoints != "" {
				b, err := sim.StaticEndpoints("sim", live)
				if err == nil {
					err = writeOut(cmd, endpoints, b)
				}
				if err != nil {
					for _, p := range live {
						p.Close()
					}
					return err
				}
			}
			fmt.Fprintf(out, "# %d pod(s) running at %gx real time; Ctrl-C to stop\n", len(live), scaleOrOne(timeScale))
			<-ctx.Done()
			for _, p := range live {
				p.Close()
			}
			return nil
		},
	}
	fl := cmd.Flags()
	tracingFlags(fl, &tracingCfg)
	fl.StringVar(&profile, "profile", "h100", "GPU profile: "+strings.Join(sim.ProfileNames(), ", "))
	fl.StringVar(&model, "model", "", "served model name (default: the profile's model)")
	fl.StringVar(&adapters, "adapters", "", "comma-separated LoRA adapter names the pods serve")
	fl.StringVar(&host, "host", "127.0.0.1", "address to listen on")
	fl.IntVar(&port, "port", 8000, "port of the first pod; pod i listens on port+i (0: ephemeral ports)")
	fl.IntVar(&pods, "pods", 1, "number of pods")
	fl.Float64Var(&timeScale, "time-scale", 1, "model seconds per wall-clock second (10 runs ten times faster than real time)")
	fl.StringVar(&metrics, "metrics", "vllm", "metric names: vllm, vllm-legacy (vllm:gpu_cache_usage_perc) or sglang")
	fl.IntVar(&maxTokens, "default-max-tokens", 64, "output tokens of a request that sets no max_tokens")
	fl.StringVar(&fleet, "fleet", "", "YAML fleet file (pools of pods) instead of --profile/--pods")
	fl.StringVar(&endpoints, "endpoints-out", "", "write a StaticEndpoints object listing the pods to this file (- for stdout)")
	fl.BoolVar(&labelMetrics, "label-metrics", false, "add each pod's labels and pod=<name> to its metrics (for dashboards grouping by pool without relabelling)")
	fl.StringToStringVar(&labels, "labels", nil, "extra pod `labels` printed for each pod, as key=value pairs (e.g. region=us-east-1,zone=a)")
	fl.Lookup("labels").DefValue = "" // no "(default [])" in the help
	fl.Float64Var(&faults.ErrorRate, "error-rate", 0, "fraction of requests answered 500")
	fl.Float64Var(&faults.RejectRate, "reject-rate", 0, "fraction of requests answered 429")
	fl.Float64Var(&faults.SlowFactor, "slow-factor", 0, "multiply every engine step's duration (3 = three times slower)")
	fl.IntVar(&faults.CrashAfterTokens, "crash-after-tokens", 0, "cut every response after this many tokens (0: never)")
	return cmd
}

func scaleOrOne(s float64) float64 {
	if s == 0 {
		return 1
	}
	return s
}

// writeOut writes b to path, or to the command's output for "-".
func writeOut(cmd *cobra.Command, path string, b []byte) error {
	if path == "-" {
		_, err := cmd.OutOrStdout().Write(b)
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
