package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/meridian-router/meridian/canary"
	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/kube"
)

func init() { extraCommands = append(extraCommands, newCanaryCmd) }

// canaryFlags select the configuration store the commands change.
type canaryFlags struct {
	dir       string
	endpoints []string
	prefix    string
	tier2     []string
	// kubeconfig and namespace select the cluster's objects.
	kubeconfig, namespace string
}

// open returns the rollouts of the selected store and its cleanup.
func (f *canaryFlags) open() (*canary.Rollouts, func(), error) {
	switch {
	case btoi(f.dir != "")+btoi(len(f.endpoints) > 0)+btoi(f.kubeconfig != "") > 1:
		return nil, nil, &exitError{2, errors.New("set one of --config, --etcd and --kubeconfig")}
	case f.kubeconfig != "":
		clients, ns, err := kube.Connect(f.kubeconfig, f.namespace, "meridian-canary")
		if err != nil {
			return nil, nil, err
		}
		store := &kube.Store{Dynamic: clients.Dynamic, Client: clients.Client, Namespace: ns}
		return &canary.Rollouts{Backend: canary.NewKubernetes(store)}, func() {}, nil
	case f.dir != "":
		return &canary.Rollouts{Backend: &canary.Dir{Path: f.dir}}, func() {}, nil
	case len(f.endpoints) > 0:
		cli, err := clientv3.New(clientv3.Config{Endpoints: f.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, nil, fmt.Errorf("etcd: %w", err)
		}
		return &canary.Rollouts{Backend: canary.NewEtcd(&config.Store{Client: cli, Prefix: f.prefix})}, func() { cli.Close() }, nil
	}
	return nil, nil, &exitError{2, errors.New("set --etcd ENDPOINTS or --kubeconfig PATH (or --config DIR for a local directory)")}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func newCanaryCmd() *cobra.Command {
	var f canaryFlags
	cmd := &cobra.Command{
		Use:   "canary",
		Short: "Roll a model version out behind a public name, and back",
		Long: "Canary commands change an InferenceModelRewrite's rollout with one validated, revision-checked\n" +
			"write each: when two operators race, one wins and the other gets a conflict. Tier-2 picks the\n" +
			"change up within seconds; during a stepped rollout it compares canary and stable (P99 TTFT,\n" +
			"error rate, 429 rate), advances each step that passes, pauses one that is inconclusive and\n" +
			"aborts one that fails. MODEL is the public model name (or the rewrite's name).",
		Example: "  meridian canary start support-agent --to support-agent-v4 --steps 5,25,50,100 --interval 10m --etcd 127.0.0.1:2379\n" +
			"  meridian canary status support-agent --watch --etcd 127.0.0.1:2379 --tier2 http://127.0.0.1:9090\n" +
			"  meridian canary abort support-agent --etcd 127.0.0.1:2379",
	}
	cmd.PersistentFlags().StringSliceVar(&f.endpoints, "etcd", nil, "etcd endpoints (host:port,...) holding the configuration")
	cmd.PersistentFlags().StringVar(&f.prefix, "prefix", config.DefaultPrefix, "etcd key prefix")
	cmd.PersistentFlags().StringVar(&f.kubeconfig, "kubeconfig", "", "change the InferenceModelRewrite objects of this cluster (instead of etcd)")
	cmd.PersistentFlags().StringVar(&f.namespace, "namespace", "", "with --kubeconfig: the namespace of Meridian's objects (default: the context's)")
	cmd.PersistentFlags().StringVar(&f.dir, "config", "", "directory of YAML configuration to change instead of etcd (local use)")
	cmd.PersistentFlags().StringSliceVar(&f.tier2, "tier2", nil, "Tier-2 admin (--metrics) base URLs (http://host:9090,...) whose live analysis status shows")
	cmd.AddCommand(canaryStartCmd(&f), canarySetWeightCmd(&f), canaryPromoteCmd(&f), canaryAbortCmd(&f),
		canaryUndoCmd(&f), canaryStatusCmd(&f), canaryListCmd(&f))
	return cmd
}

// canaryChange runs one state-changing command and prints the new state.
func canaryChange(cmd *cobra.Command, f *canaryFlags, verb string, run func(context.Context, *canary.Rollouts) (canary.Status, error)) error {
	r, done, err := f.open()
	if err != nil {
		return err
	}
	defer done()
	st, err := run(cmd.Context(), r)
	if errors.Is(err, config.ErrConflict) {
		return &exitError{1, fmt.Errorf("%w\nretry: someone changed the rollout since it was read; nothing was written", err)}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", st.Rewrite, verb)
	return canary.WriteTable(cmd.OutOrStdout(), []canary.Status{st})
}

func canaryStartCmd(f *canaryFlags) *cobra.Command {
	var o canary.StartOptions
	var lim config.AnalysisLimit
	cmd := &cobra.Command{
		Use:   "start MODEL --to TARGET [--weight 5 | --steps 5,25,50,100 --interval 10m]",
		Short: "Start a canary of TARGET behind MODEL (manual with --weight, stepped with --steps)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Model = args[0]
			if lim != (config.AnalysisLimit{}) {
				o.Analysis = &lim
			}
			return canaryChange(cmd, f, "rollout started", func(ctx context.Context, r *canary.Rollouts) (canary.Status, error) {
				return r.Start(ctx, o)
			})
		},
	}
	cmd.Flags().StringVar(&o.To, "to", "", "the canary's target model (required)")
	cmd.Flags().Int64Var(&o.Weight, "weight", 0, "a manual canary's weight in percent, 1..99 (default 5 without --steps)")
	cmd.Flags().Int64SliceVar(&o.Steps, "steps", nil, "a stepped rollout's canary weights in `percents`, increasing (e.g. 5,25,50,100)")
	cmd.Flags().Lookup("steps").DefValue = "" // no "(default [])" in the help
	cmd.Flags().DurationVar(&o.Interval, "interval", 0, "time per step of a stepped rollout (e.g. 10m)")
	cmd.Flags().StringVar(&o.Salt, "salt", "", "stickiness salt of this rollout (default: a fresh one, REWRITE/ROLLOUT-ID, so each rollout draws a new cohort of callers)")
	cmd.Flags().Float64Var(&lim.MaxTTFTP99Ratio, "max-ttft-ratio", 0, "fail when canary P99 TTFT / stable P99 TTFT exceeds this (default 1.5)")
	cmd.Flags().Float64Var(&lim.MaxErrorRateDelta, "max-error-rate-delta", 0, "fail when the canary's error rate exceeds stable's by this fraction (default 0.05)")
	cmd.Flags().Float64Var(&lim.Max429RateDelta, "max-429-rate-delta", 0, "fail when the canary's 429 rate exceeds stable's by this fraction (default 0.1)")
	cmd.Flags().Int64Var(&lim.MinRequests, "min-requests", 0, "requests per side before a step can pass (default 20)")
	cmd.MarkFlagRequired("to")
	return cmd
}

func canarySetWeightCmd(f *canaryFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "set-weight MODEL PERCENT",
		Short: "Hold the canary at PERCENT (1..99); a stepped rollout becomes manual",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pct, err := strconv.ParseInt(args[1], 10, 64)
			if err != nil {
				return &exitError{2, fmt.Errorf("PERCENT: want an integer 1..99, got %q", args[1])}
			}
			return canaryChange(cmd, f, fmt.Sprintf("canary weight set to %d%%", pct), func(ctx context.Context, r *canary.Rollouts) (canary.Status, error) {
				return r.SetWeight(ctx, args[0], pct)
			})
		},
	}
}

func canaryPromoteCmd(f *canaryFlags) *cobra.Command {
	var full bool
	cmd := &cobra.Command{
		Use:   "promote MODEL [--full]",
		Short: "Move to the next step (resuming a paused rollout), or with --full give the canary everything",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return canaryChange(cmd, f, "promoted", func(ctx context.Context, r *canary.Rollouts) (canary.Status, error) {
				return r.Promote(ctx, args[0], full)
			})
		},
	}
	cmd.Flags().BoolVar(&full, "full", false, "skip the remaining steps: the canary replaces stable")
	return cmd
}

func canaryAbortCmd(f *canaryFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "abort MODEL",
		Short: "Send all of the canary's traffic back to stable (weight 0, status Aborted)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return canaryChange(cmd, f, "aborted", func(ctx context.Context, r *canary.Rollouts) (canary.Status, error) {
				return r.Abort(ctx, args[0])
			})
		},
	}
}

func canaryUndoCmd(f *canaryFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "undo MODEL",
		Short: "Restore the rewrite's targets as they were before `canary start` and remove the rollout",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return canaryChange(cmd, f, "undone", func(ctx context.Context, r *canary.Rollouts) (canary.Status, error) {
				return r.Undo(ctx, args[0])
			})
		},
	}
}

// statusOutput flags of status and list.
type statusOutput struct {
	json  bool
	watch bool
	every time.Duration
}

func (o *statusOutput) register(cmd *cobra.Command, watch bool) {
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON instead of a table")
	if watch {
		cmd.Flags().BoolVarP(&o.watch, "watch", "w", false, "print the status again every --every until interrupted")
		cmd.Flags().DurationVar(&o.every, "every", 2*time.Second, "how often --watch refreshes")
	}
}

// canaryShow prints statuses (with the Tier-2s' live analyses), once or
// until the context ends.
func canaryShow(cmd *cobra.Command, f *canaryFlags, o statusOutput, get func(context.Context, *canary.Rollouts) ([]canary.Status, error)) error {
	r, done, err := f.open()
	if err != nil {
		return err
	}
	defer done()
	ctx := cmd.Context()
	client := &http.Client{Timeout: 3 * time.Second}
	for {
		sts, err := get(ctx, r)
		if err != nil {
			return err
		}
		for _, u := range f.tier2 {
			live, err := canary.FetchLive(ctx, client, u)
			if err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: %v\n", err)
				continue
			}
			canary.Attach(sts, live)
		}
		if err := printStatus(cmd.OutOrStdout(), sts, o.json); err != nil {
			return err
		}
		if !o.watch {
			return nil
		}
		t := time.NewTimer(o.every)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if !o.json {
			fmt.Fprintf(cmd.OutOrStdout(), "\n--- %s\n", time.Now().Format(time.TimeOnly))
		}
	}
}

func printStatus(w io.Writer, sts []canary.Status, asJSON bool) error {
	if !asJSON {
		if len(sts) == 0 {
			_, err := fmt.Fprintln(w, "no rollouts")
			return err
		}
		return canary.WriteTable(w, sts)
	}
	if sts == nil {
		sts = []canary.Status{}
	}
	b, err := json.MarshalIndent(sts, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func canaryStatusCmd(f *canaryFlags) *cobra.Command {
	var o statusOutput
	cmd := &cobra.Command{
		Use:   "status MODEL [--watch] [--json]",
		Short: "Show weights, step, time in step and (with --tier2) the live canary/stable comparison",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return canaryShow(cmd, f, o, func(ctx context.Context, r *canary.Rollouts) ([]canary.Status, error) {
				st, err := r.Status(ctx, args[0])
				return []canary.Status{st}, err
			})
		},
	}
	o.register(cmd, true)
	return cmd
}

func canaryListCmd(f *canaryFlags) *cobra.Command {
	var o statusOutput
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List every rewrite that has a rollout",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return canaryShow(cmd, f, o, func(ctx context.Context, r *canary.Rollouts) ([]canary.Status, error) {
				return r.List(ctx)
			})
		},
	}
	o.register(cmd, false)
	return cmd
}
