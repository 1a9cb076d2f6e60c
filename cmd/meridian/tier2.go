package main

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/meridian-router/meridian/platform"
)

func init() { extraCommands = append(extraCommands, newTier2Cmd) }

type tier2Flags struct {
	gcPercent int
	eventLoop bool // --event-loop: accepted and ignored (deprecated)
	tier2     platform.Tier2Config
}

func newTier2Cmd() *cobra.Command { return tier2Command(new(tier2Flags)) }

// tier2Command is `meridian tier2` with its flags parsed into f.
func tier2Command(f *tier2Flags) *cobra.Command {
	t := &f.tier2
	cmd := newProxyCmd("tier2", "Run a Region's global router (the authenticated OpenAI front door)",
		"Tier-2 authenticates callers, resolves canary splits, admits by priority band, enforces\n"+
			"global per-tenant rate limits, picks a cluster in some Region from gossiped pool health and\n"+
			"forwards to its Tier-1, failing over before the first response byte.",
		"  meridian tier2 --config deploy/examples --region us-east-1 --listen :8080 \\\n"+
			"    --gossip-bind 10.0.0.5:7946 --join tier2.us-east-1:7946,tier2.eu-west-1:7946",
		&t.Source, &f.gcPercent, func(ctx context.Context, log *slog.Logger) error { return runTier2(ctx, *f, log) })
	t.Version = versionString()
	host, _ := os.Hostname()
	cmd.Flags().StringVar(&t.Region, "region", "", "Region this instance serves (required)")
	cmd.Flags().StringVar(&t.Name, "name", host, "unique name of this instance (gossip and rate-limit peer name)")
	cmd.Flags().StringVar(&t.Listen, "listen", ":8080", "address of the OpenAI front door")
	cmd.Flags().StringVar(&t.Metrics, "metrics", ":9090", "address of the Prometheus /metrics endpoint (empty: off)")
	cmd.Flags().StringVar(&t.GossipBind, "gossip-bind", "", "memberlist bind address host:port (empty: no gossip)")
	cmd.Flags().StringSliceVar(&t.Join, "join", nil, "gossip addresses of other Tier-2 instances (any Region)")
	cmd.Flags().StringVar(&t.GossipProfile, "gossip-profile", "", "override the Topology's spec.gossip.profile (memberlist timing: lan, wan or local; default wan); read at start")
	cmd.Flags().StringVar(&t.GossipKeyFile, "gossip-key-file", "", "encrypt gossip with the keys in this `file` (one base64 key of 16, 24 or 32 bytes per line, the one to send with first; reread every 10 s, so keys rotate without a restart: docs/deploy-eks.md)")
	cmd.Flags().BoolVar(&t.InsecureNoAuth, "insecure-no-auth", false, "admit callers without a token, as tenant \"anonymous\" (development only)")
	cmd.Flags().StringVar(&t.JWT.Issuer, "jwt-issuer", "", "verify callers' tokens against this issuer (iss) instead of the configuration's spec.auth.jwt; needs --jwks-url")
	cmd.Flags().StringVar(&t.JWT.JWKSURL, "jwks-url", "", "with --jwt-issuer: the https URL of the issuer's JSON Web Key Set")
	cmd.Flags().StringSliceVar(&t.JWT.Audiences, "jwt-audience", nil, "with --jwt-issuer: audiences (aud) a token may carry, one at least (empty: any)")
	cmd.Flags().StringSliceVar(&t.JWT.RequiredClaims.Present, "jwt-required-claim", nil, "with --jwt-issuer: claims every token must carry")
	cmd.Flags().StringVar(&t.JWT.RequiredClaims.Tenant, "jwt-tenant-claim", "", "with --jwt-issuer: the claim carrying the tenant (default tenant)")
	cmd.Flags().StringVar(&t.JWT.RequiredClaims.Criticality, "jwt-criticality-claim", "", "with --jwt-issuer: the claim carrying the band (default criticality)")
	cmd.Flags().DurationVar((*time.Duration)(&t.JWT.JWKSRefresh), "jwks-refresh", 0, "with --jwt-issuer: how often the key set is fetched again (0: 5m)")
	cmd.Flags().BoolVar(&t.SubscribeAll, "subscribe-all", false, "subscribe to every cluster's health feed, not only this Region's (a lone Tier-2 without gossip)")
	cmd.Flags().BoolVar(&t.CloudWatch, "cloudwatch", false, "publish per-Region aggregates (requests, P99 TTFT per model, 429 rate, failovers) to CloudWatch with PutMetricData (standard AWS credential chain)")
	cmd.Flags().StringVar(&t.CloudWatchRegion, "cloudwatch-region", "", "AWS Region of the CloudWatch endpoint (default: the SDK's: AWS_REGION, shared config)")
	cmd.Flags().StringVar(&t.TLSCert, "tls-cert", "", "TLS certificate file (with --tls-key: serve HTTPS and HTTP/2)")
	cmd.Flags().BoolVar(&f.eventLoop, "event-loop", false, "no effect: the front door is always net/http's server")
	cmd.Flags().MarkDeprecated("event-loop", "the front door is always net/http's server; remove the flag")
	cmd.Flags().StringVar(&t.TLSKey, "tls-key", "", "TLS key file")
	cmd.Flags().StringVar(&t.RedirectHTTP, "redirect-http", "", "with --tls-cert: a plain-HTTP `address` (e.g. :8000) that answers every request with a 308 to HTTPS and serves no API")
	cmd.Flags().IntVar(&t.RedirectPort, "redirect-port", 443, "the public HTTPS `port` --redirect-http sends callers to")
	cmd.Flags().StringVar(&t.IdentityKeyFile, "identity-key-file", "", "file of the key that signs the tenant and band sent to Tier-1s (same file as tier1's --identity-key-file; empty: sent unsigned)")
	cmd.Flags().StringVar(&t.FrontDoor.DefaultTenant, "default-tenant", "", "Tenant whose policy applies to callers whose tenant has no Tenant object (empty: they are refused with 403)")
	cmd.Flags().BoolVar(&t.FrontDoor.ExposeUpstream, "expose-upstream", false, "show callers the pod address Tier-1 served from (x-gateway-destination-endpoint-served; debugging only)")
	cmd.Flags().DurationVar(&t.FrontDoor.BodyReadTimeout, "body-read-timeout", 30*time.Second, "longest time to receive a request body (408 after it)")
	cmd.Flags().DurationVar(&t.FrontDoor.UpstreamHeaderTimeout, "upstream-header-timeout", 60*time.Second, "longest wait for a Tier-1's response headers to a streaming request before failing over (504 when no cluster answers)")
	cmd.Flags().DurationVar(&t.FrontDoor.UpstreamResponseTimeout, "upstream-response-timeout", 10*time.Minute, "the same for a non-streaming request, whose headers come with the whole completion")
	cmd.Flags().DurationVar(&t.FrontDoor.StreamIdleTimeout, "stream-idle-timeout", 60*time.Second, "end a stream with an error event when its Tier-1 sends nothing for this long")
	cmd.Flags().IntVar(&t.FrontDoor.MaxHeaders, "max-headers", 100, "most request header values accepted (431 beyond; header bytes are limited to 64 KiB)")
	tracingFlags(cmd.Flags(), &t.Tracing)
	cmd.Flags().BoolVar(&t.AccessLog, "access-log", false, "log a line per inference request (request id, tenant, models, status, cluster, tokens, duration) at info")
	cmd.Flags().DurationVar(&t.CanaryPeriod, "canary-period", 0, "override the Topology's spec.routing.canaryAnalysis.period: longest time between two canary analyses (default 5s)")
	return cmd
}

func runTier2(ctx context.Context, f tier2Flags, log *slog.Logger) error {
	applyGC(f.gcPercent, log)
	t, err := platform.StartTier2(ctx, f.tier2, log)
	if err != nil {
		return err
	}
	return t.Run(ctx)
}
