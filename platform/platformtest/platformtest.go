// Package platformtest starts local platforms (package platform) for
// tests: a two-Region platform on free loopback ports (Start), any
// configuration started and stopped with the test (Run), and the OpenAI
// client and request its tests send.
package platformtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/meridian-router/meridian/platform"
)

// FreePort returns a loopback address that was free a moment ago.
func FreePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Run starts the platform cfg names and stops it when the test ends,
// failing the test if it stopped with an error.
func Run(t testing.TB, cfg platform.Config) (*platform.Platform, error) {
	t.Helper()
	p, _, err := run(t, cfg)
	return p, err
}

// run is Run, and also returns a func that stops the platform as SIGTERM
// does (its Run's context ends) and returns Run's result.
func run(t testing.TB, cfg platform.Config) (*platform.Platform, func() error, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p, err := platform.Start(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		cancel()
		return nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	var result error
	stop := func() error {
		once.Do(func() {
			cancel()
			result = <-done
		})
		return result
	}
	t.Cleanup(func() {
		if err := stop(); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("platform stopped with: %v", err)
		}
	})
	return p, stop, nil
}

// Start writes a two-Region platform on free loopback ports and starts
// it as `meridian up --config` would, with its configuration changed by
// tune first (nil: none). It returns once the platform is Ready: both
// Tier-2s hold digests of every pool with all its pods ready.
//
// us-east-1 has cluster use1 (pool fast: pods us-fast-0 and -1; chat-v1:
// us-chat-0), eu-west-1 has euw1 (fast: eu-fast-0 and -1; chat-v2:
// eu-chat-0); the public name chat splits 50/50 between chat-v1 and
// chat-v2. Tenants: team-a (the token's; maxBand Critical), tiny (two
// requests an hour), prompt-a, -b and -c.
func Start(t testing.TB, tune func(*platform.Config)) *platform.Platform {
	t.Helper()
	p, _ := StartStoppable(t, tune)
	return p
}

// StartStoppable is Start, and also returns a func that stops the
// platform as SIGTERM stops meridian up (Run's context ends) and returns
// Run's result once every component has stopped.
func StartStoppable(t testing.TB, tune func(*platform.Config)) (*platform.Platform, func() error) {
	t.Helper()
	// The ports are picked free and bound only when the platform starts:
	// another test may take one in between; then it starts again on new
	// ones.
	var (
		p    *platform.Platform
		stop func() error
	)
	for attempt := 1; ; attempt++ {
		cfg := platform.Config{Dir: writeTwoRegions(t), TimeScale: 50, CrossRegionDelay: 5 * time.Millisecond, Tenant: "team-a"}
		if tune != nil {
			tune(&cfg)
		}
		var err error
		if p, stop, err = run(t, cfg); err == nil {
			break
		}
		if attempt < 5 && (errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")) {
			t.Logf("start platform, attempt %d: %v; again on other ports", attempt, err)
			continue
		}
		t.Fatalf("start platform: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ReadyTimeout)
	defer cancel()
	if err := p.Ready(ctx); err != nil {
		t.Fatalf("platform not ready after %s: %v", ReadyTimeout, err)
	}
	return p, stop
}

// ReadyTimeout bounds Start's wait for the platform to be ready: long, for
// a loaded 2-core machine under -race, and still a bound.
const ReadyTimeout = 2 * time.Minute

// Topology is the Topology document of Start's two Regions: us-east-1
// with cluster use1 and eu-west-1 with euw1, each Region's Tier-2, each
// cluster's Tier-1 and pool-health feed at the addresses (host:port) port
// gives for "t2-us", "t1-us", "h-us", "t2-eu", "t1-eu" and "h-eu". It ends
// inside spec: more of its settings (indented two spaces) may follow.
func Topology(port func(name string) string) string {
	return fmt.Sprintf(`apiVersion: meridian.dev/v1alpha1
kind: Topology
metadata: {name: t}
spec:
  regions:
  - name: us-east-1
    tier2: [%q]
    clusters: [{name: use1, tier1: "http://%s", health: %q}]
  - name: eu-west-1
    tier2: [%q]
    clusters: [{name: euw1, tier1: "http://%s", health: %q}]
`, port("t2-us"), port("t1-us"), port("h-us"), port("t2-eu"), port("t1-eu"), port("h-eu"))
}

// writeTwoRegions writes Start's configuration into a new directory.
func writeTwoRegions(t testing.TB) string {
	t.Helper()
	ports := map[string]string{}
	port := func(name string) string {
		if _, ok := ports[name]; !ok {
			ports[name] = FreePort(t)
		}
		return ports[name]
	}
	var b strings.Builder
	b.WriteString(Topology(port))
	for _, c := range []struct{ name, region, extra string }{{"use1", "us-east-1", `
  - name: chat
    modelName: chat-v1
    modelSelector: {matchLabels: {pool: chat}}`}, {"euw1", "eu-west-1", `
  - name: chat-next
    modelName: chat-v2
    modelSelector: {matchLabels: {pool: chat-next}}`}} {
		fmt.Fprintf(&b, `---
apiVersion: meridian.dev/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: %s}
spec:
  region: %s
  cluster: %s
  bbr: {enabled: true}
  auth:
    jwt:
      issuer: https://auth.example.com/
      audiences: [meridian]
      jwksURL: https://auth.example.com/jwks.json
      requiredClaims: {present: [sub, tenant]}
  schedulers:
  - name: fast
    modelName: fast
    modelSelector: {matchLabels: {pool: fast}}%s
`, c.name, c.region, c.name, c.extra)
	}
	// Each cluster's pods in its own StaticEndpoints: pool fast exists in
	// both clusters.
	for _, cl := range []struct {
		name string
		pods [][3]string // name, pool, gpu
	}{
		{"use1", [][3]string{{"us-fast-0", "fast", "h100"}, {"us-fast-1", "fast", "a10g"}, {"us-chat-0", "chat", "h100"}}},
		{"euw1", [][3]string{{"eu-fast-0", "fast", "h100"}, {"eu-fast-1", "fast", "l40s"}, {"eu-chat-0", "chat-next", "h100"}}},
	} {
		fmt.Fprintf(&b, "---\napiVersion: meridian.dev/v1alpha1\nkind: StaticEndpoints\nmetadata: {name: pods-%s}\nspec:\n  cluster: %s\n  endpoints:\n", cl.name, cl.name)
		for _, p := range cl.pods {
			fmt.Fprintf(&b, "  - {name: %s, address: %q, labels: {pool: %s, gpu: %s}}\n", p[0], port(p[0]), p[1], p[2])
		}
	}
	b.WriteString(`---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {name: chat}
spec:
  rules:
  - matches: [{model: {value: chat}}]
    targets:
    - {modelRewrite: chat-v1, weight: 50}
    - {modelRewrite: chat-v2, weight: 50}
---
apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: team-a}
spec:
  maxBand: Critical
---
apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: tiny}
spec:
  limits:
    requests: {limit: 2, per: 1h, burst: 2}
`)
	// The prompt-hygiene test's three teams (unknown tenants are refused).
	for _, tenant := range []string{"prompt-a", "prompt-b", "prompt-c"} {
		b.WriteString("---\napiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: " + tenant + "}\nspec: {maxBand: Standard}\n")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "platform.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// clientHTTP is the transport every Client shares. openai-go otherwise
// builds one per client, whose idle connection is never closed: tests that
// make a client per request leaked a socket pair each (thousands in
// cmd/meridian's TestCanaryEndToEnd). Enough idle connections per Tier-2
// are kept that concurrent test traffic reuses them rather than dialling
// anew for every request (net/http's default keeps 2).
var clientHTTP = &http.Client{Transport: &http.Transport{
	MaxIdleConnsPerHost: 64,
	IdleConnTimeout:     30 * time.Second,
}}

// Client is an OpenAI client of region's Tier-2 with token, without retries.
func Client(p *platform.Platform, region, token string) openai.Client {
	return openai.NewClient(option.WithBaseURL(p.Endpoints[region]+"/v1/"), option.WithAPIKey(token), option.WithMaxRetries(0),
		option.WithHTTPClient(clientHTTP))
}

// Ask is a short chat completion request for model.
func Ask(model string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")}}
}

// Token is a development token of p for tenant.
func Token(t testing.TB, p *platform.Platform, tenant string) string {
	t.Helper()
	tok, err := p.Sign(tenant)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
