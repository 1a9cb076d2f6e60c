package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/tier2"
)

func newConfigDriftCmd() *cobra.Command {
	var (
		urls    []string
		against string
		asJSON  bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "drift --tier2 URL[,URL...] [--against DIR]",
		Short: "Report pools that differ between clusters, or from a directory of configuration",
		Long: "Ask Tier-2s (their --metrics admin listeners) how the pools that serve each model name\n" +
			"differ between clusters: a field of the pool's definition as applied (weights, adapters,\n" +
			"selector, ...), the adapters the pods can serve, their context length. With --against DIR,\n" +
			"also compare every cluster's running pools with what DIR's configuration gives it. Exits 1\n" +
			"when anything differs, naming the cluster and the field; 0 when every pool agrees.",
		Example: "  meridian config drift --tier2 http://tier2-use1:9090,http://tier2-euw1:9090\n" +
			"  meridian config drift --tier2 http://127.0.0.1:9090 --against deploy/examples/platform --json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(urls) == 0 {
				return &exitError{2, errors.New("--tier2 names the Tier-2 admin URLs to ask (their --metrics listeners)")}
			}
			var want *config.Snapshot
			if against != "" {
				docs, _, err := config.ReadDir(against)
				if err == nil {
					want, err = config.Build(docs, 0)
				}
				if err != nil {
					return &exitError{2, fmt.Errorf("--against %s: %w", against, err)}
				}
			}
			client := &http.Client{Timeout: timeout}
			var reports []tier2.DriftReport
			for _, u := range urls {
				rep, err := tier2.FetchDrift(cmd.Context(), client, u)
				if err != nil {
					return &exitError{2, err}
				}
				reports = append(reports, rep)
			}
			divs := tier2.CompareDrift(reports, want)
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(map[string]any{"drift": divs != nil, "divergences": divs}); err != nil {
					return err
				}
			} else if len(divs) == 0 {
				fmt.Fprintf(out, "no drift: every pool agrees (%d Tier-2 report(s)%s)\n", len(reports), map[bool]string{true: ", and with " + against}[against != ""])
			} else {
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "MODEL\tCLUSTER\tPOOL\tKIND\tFIELDS\tRUNNING\tWANT\tSINCE")
				for _, d := range divs {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Model, d.Cluster, d.Pool, d.Kind, dash(strings.Join(d.Fields, ",")), dash(d.Running), dash(d.Want), dash(d.Since))
				}
				tw.Flush()
			}
			if len(divs) > 0 {
				return &exitError{1, fmt.Errorf("drift: %d divergence(s)", len(divs))}
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&urls, "tier2", nil, "Tier-2 admin (--metrics) base `urls` (http://host:9090,...)")
	cmd.Flags().StringVar(&against, "against", "", "a configuration `directory` (the Git truth) every cluster's running pools are compared with")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "per-request timeout")
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
