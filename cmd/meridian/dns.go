package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/meridian-router/meridian/aws/route53"
	"github.com/meridian-router/meridian/config"
)

// dnsFlags are the flags of `meridian dns plan` and `meridian dns apply`.
type dnsFlags struct {
	cfg       route53.Config
	configDir string
	targets   []string
	endpoint  string
	profile   string
	timeout   time.Duration
}

func (f *dnsFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.cfg.Zone, "zone", "", "Route 53 hosted zone: its ID (Z...) or its name (example.com)")
	fl.StringVar(&f.cfg.Name, "name", "", "the global DNS name (api.example.com)")
	fl.StringVar(&f.configDir, "config", "", "configuration directory whose Topology lists each Region's Tier-2 load balancer")
	fl.StringArrayVar(&f.targets, "target", nil, "REGION=HOST:PORT: a Region's Tier-2 load balancer (repeatable; overrides the Topology)")
	fl.Int64Var(&f.cfg.TTL, "ttl", 60, "record TTL in seconds")
	fl.StringVar(&f.cfg.HealthPath, "health-path", "/readyz", "path the Route 53 health checks request")
	fl.BoolVar(&f.cfg.HTTPS, "https", false, "health checks use HTTPS")
	fl.IntVar(&f.cfg.HealthInterval, "interval", 30, "seconds between health checks: 10 or 30")
	fl.IntVar(&f.cfg.FailureThreshold, "failure-threshold", 3, "consecutive failures that mark a Region unhealthy (1-10)")
	fl.BoolVar(&f.cfg.Prune, "prune", false, "delete latency records of the name for Regions not in the targets")
	fl.StringVar(&f.endpoint, "endpoint-url", "", "Route 53 endpoint to use instead of AWS's (testing)")
	fl.StringVar(&f.profile, "profile", "", "AWS shared-config profile (default: the SDK's standard credential chain)")
	fl.DurationVar(&f.timeout, "timeout", 2*time.Minute, "time limit for the Route 53 calls")
}

// plan reads the targets, connects and makes the plan.
func (f *dnsFlags) plan(ctx context.Context) (*route53.Plan, func(context.Context, *route53.Plan) error, error) {
	if f.cfg.Zone == "" || f.cfg.Name == "" {
		return nil, nil, &exitError{2, errors.New("--zone and --name are required")}
	}
	if f.configDir == "" && len(f.targets) == 0 {
		return nil, nil, &exitError{2, errors.New("name the Regions' load balancers: --config DIR (its Topology) or --target REGION=HOST:PORT")}
	}
	var top *config.Topology
	if f.configDir != "" {
		snap, err := config.LoadDir(f.configDir)
		if err != nil {
			return nil, nil, err
		}
		top = snap.Topology
		if top == nil && len(f.targets) == 0 {
			return nil, nil, fmt.Errorf("%s has no Topology; add --target REGION=HOST:PORT", f.configDir)
		}
	}
	targets, err := route53.ResolveTargets(top, f.targets)
	if err != nil {
		return nil, nil, err
	}
	cfg := f.cfg
	cfg.Targets = targets
	client, err := route53.NewClient(ctx, route53.ClientOptions{EndpointURL: f.endpoint, Profile: f.profile})
	if err != nil {
		return nil, nil, err
	}
	p, err := route53.MakePlan(ctx, client, cfg)
	if err != nil {
		return nil, nil, err
	}
	apply := func(ctx context.Context, p *route53.Plan) error { return route53.Apply(ctx, client, p) }
	return p, apply, nil
}

func newDNSCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dns",
		Short: "Keep the global DNS name in Route 53: one latency record per Region, health-checked on /readyz",
		Long: "Route 53 answers the global name with the Region of lowest latency to the caller among the\n" +
			"Regions whose Tier-2 passes its health check. `plan` shows what would change; `apply` changes\n" +
			"it; a second apply changes nothing. Credentials come from the AWS SDK's standard chain\n" +
			"(environment, shared config, IRSA, instance role).",
	}
	var pf, af dnsFlags
	plan := &cobra.Command{
		Use:     "plan",
		Short:   "Show the changes apply would make",
		Args:    cobra.NoArgs,
		Example: "  meridian dns plan --zone example.com --name api.example.com --config platform/   # its Topology names the load balancers",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), pf.timeout)
			defer cancel()
			p, _, err := pf.plan(ctx)
			if err != nil {
				return err
			}
			return p.Write(cmd.OutOrStdout())
		},
	}
	pf.register(plan)
	apply := &cobra.Command{
		Use:   "apply",
		Short: "Create or update the records and health checks",
		Args:  cobra.NoArgs,
		Example: "  meridian dns apply --zone example.com --name api.example.com \\\n" +
			"    --target us-east-1=meridian-use1.elb.us-east-1.amazonaws.com:80 \\\n" +
			"    --target eu-west-1=meridian-euw1.elb.eu-west-1.amazonaws.com:80",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), af.timeout)
			defer cancel()
			p, applyPlan, err := af.plan(ctx)
			if err != nil {
				return err
			}
			if err := p.Write(cmd.OutOrStdout()); err != nil {
				return err
			}
			if p.Empty() {
				return nil
			}
			if err := applyPlan(ctx, p); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "applied: %d health check(s) created, %d record change(s), %d health check(s) deleted\n",
				len(p.CreateHealthChecks), len(p.Changes), len(p.DeleteHealthChecks))
			return nil
		},
	}
	af.register(apply)
	cmd.AddCommand(plan, apply)
	return cmd
}
