package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/meridian-router/meridian/tier1/hygiene"
)

func newDiagnoseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "diagnose",
		Short: "Explain how clients use the platform",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newDiagnosePromptsCmd())
	return cmd
}

func newDiagnosePromptsCmd() *cobra.Command {
	var (
		tier1s  []string
		tenant  string
		asJSON  bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "prompts",
		Short: "Rank tenants and models by the prefill their prompts lose to early divergence",
		Long: "Reads the prompt-hygiene report of one or more Tier-1s (their metrics listener, as\n" +
			"`meridian up --prometheus-targets` lists them) and ranks tenants and models by the prompt\n" +
			"tokens that shared content with a recent prompt but could not be cached because the prompt\n" +
			"changed near the top, worst first. See docs/prompt-hygiene.md.",
		Example: "  meridian diagnose prompts --tier1 127.0.0.1:9090\n  meridian diagnose prompts --tier1 http://t1-a:9090 --tier1 http://t1-b:9090 --tenant acme --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(tier1s) == 0 {
				return &exitError{2, fmt.Errorf("diagnose prompts: --tier1 is required (a Tier-1's metrics listener, e.g. 127.0.0.1:9090)")}
			}
			var reps []hygiene.Report
			for _, u := range tier1s {
				rep, err := hygiene.Fetch(cmd.Context(), u, tenant, timeout)
				if err != nil {
					return fmt.Errorf("diagnose prompts: %w", err)
				}
				reps = append(reps, rep)
			}
			rep, err := hygiene.Merge(reps...)
			if err != nil {
				return fmt.Errorf("diagnose prompts: %w", err)
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			return rep.WriteText(cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringSliceVar(&tier1s, "tier1", nil, "Tier-1 metrics listener URL (repeat for replicas and clusters; reports are merged)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "only this tenant")
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"entries":[{"tenant","model","requests","lostTokens","divergenceOffset","sample",…}]}`)
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for each Tier-1")
	return cmd
}
