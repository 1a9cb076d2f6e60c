package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/sim"
)

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// testPlatform writes a two-Region platform on free loopback ports and
// starts it as `meridian up --config` would.
func testPlatform(t *testing.T) *Platform {
	t.Helper()
	return testPlatformWith(t, nil)
}

// testPlatformWith is testPlatform with its flags changed by tune first.
func testPlatformWith(t *testing.T, tune func(*upFlags)) *Platform {
	t.Helper()
	// The ports are picked free and bound only when the platform starts:
	// another test may take one in between; then it starts again on new
	// ones.
	attempt := 0
retry:
	attempt++
	dir := t.TempDir()
	ports := map[string]string{}
	port := func(name string) string {
		if _, ok := ports[name]; !ok {
			ports[name] = freePort(t)
		}
		return ports[name]
	}
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: meridian.dev/v1alpha1
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
`+testkit.JWTAuth+`      requiredClaims: {present: [sub, tenant]}
  schedulers:
  - name: fast
    modelName: fast
    modelSelector: {matchLabels: {pool: fast}}%s
`, c.name, c.region, c.name, c.extra)
	}
	b.WriteString(`---
apiVersion: meridian.dev/v1alpha1
kind: StaticEndpoints
metadata: {name: pods}
spec:
  endpoints:
`)
	for _, p := range []struct{ name, cluster, pool, gpu string }{
		{"us-fast-0", "use1", "fast", "h100"}, {"us-fast-1", "use1", "fast", "a10g"}, {"us-chat-0", "use1", "chat", "h100"},
		{"eu-fast-0", "euw1", "fast", "h100"}, {"eu-fast-1", "euw1", "fast", "l40s"}, {"eu-chat-0", "euw1", "chat-next", "h100"},
	} {
		fmt.Fprintf(&b, "  - {name: %s, address: %q, labels: {pool: %s, gpu: %s}}\n", p.name, port(p.name), p.pool, p.gpu)
	}
	// StaticEndpoints scope pods to their cluster by the pool labels being
	// distinct per cluster here; fast exists in both, so split them.
	cfg := strings.Replace(b.String(), "metadata: {name: pods}\nspec:\n  endpoints:\n", "", 1)
	var pods strings.Builder
	for _, cl := range []string{"use1", "euw1"} {
		fmt.Fprintf(&pods, "---\napiVersion: meridian.dev/v1alpha1\nkind: StaticEndpoints\nmetadata: {name: pods-%s}\nspec:\n  cluster: %s\n  endpoints:\n", cl, cl)
		for _, line := range strings.Split(b.String(), "\n") {
			if strings.HasPrefix(line, "  - {name: us-") && cl == "use1" || strings.HasPrefix(line, "  - {name: eu-") && cl == "euw1" {
				pods.WriteString(line + "\n")
			}
		}
	}
	cfg = cfg[:strings.LastIndex(cfg, "---\napiVersion: meridian.dev/v1alpha1\nkind: StaticEndpoints")] + pods.String()
	cfg += `---
` + testkit.ChatRewrite + `    targets:
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
`
	// The prompt-hygiene test's three teams (unknown tenants are refused).
	for _, tenant := range []string{"prompt-a", "prompt-b", "prompt-c"} {
		cfg += "---\napiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: " + tenant + "}\nspec: {maxBand: Standard}\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "platform.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := upFlags{dir: dir, timeScale: 50, crossDelay: 5 * time.Millisecond, tenant: "team-a"}
	if tune != nil {
		tune(&f)
	}
	p, err := startUp(ctx, f, slog.New(slog.DiscardHandler))
	if err != nil {
		cancel()
		if attempt < 5 && (errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")) {
			t.Logf("start platform, attempt %d: %v; again on other ports", attempt, err)
			goto retry
		}
		t.Fatalf("start platform: %v\n%s", err, cfg)
	}
	done := make(chan error, 1)
	go func() { done <- p.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("platform stopped with: %v", err)
		}
	})
	// Ready when both Tier-2s hold fresh digests of every pool with all its
	// pods ready (tests that fail one cluster need the other one to be a
	// candidate already), and answer for every model.
	want := map[string]int{"use1/fast": 2, "euw1/fast": 2, "use1/chat-v1": 1, "euw1/chat-v2": 1}
	for _, region := range p.Regions {
		testkit.Eventually(t, region+" Tier-2 holds every pool's digest with its pods ready", func() bool {
			ready := 0
			for _, d := range p.fleets[region].Digests().Digests() {
				if n, ok := want[d.Cluster+"/"+d.Model]; ok && d.ReadyPods >= n {
					ready++
				}
			}
			return ready == len(want)
		})
	}
	for _, region := range p.Regions {
		testkit.Eventually(t, region+" Tier-2 ready with both Regions' digests", func() bool {
			c := client(p, region, p.Token)
			for _, m := range []string{"fast", "chat-v1", "chat-v2"} {
				if _, err := c.Models.Get(context.Background(), m); err != nil {
					return false
				}
			}
			return true
		})
	}
	return p
}

func client(p *Platform, region, token string) openai.Client {
	return openai.NewClient(option.WithBaseURL(p.Endpoints[region]+"/v1/"), option.WithAPIKey(token), option.WithMaxRetries(0))
}

func ask(model string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")}}
}

func TestPlatformEndToEnd(t *testing.T) {
	p := testPlatform(t)
	ctx := context.Background()
	us := client(p, "us-east-1", p.Token)

	t.Run("non-streaming", func(t *testing.T) {
		var resp *http.Response
		out, err := us.Chat.Completions.New(ctx, ask("fast"), option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		if out.Model != "fast" || len(out.Choices) == 0 || out.Usage.TotalTokens == 0 {
			t.Fatalf("response %+v", out)
		}
		if resp.Header.Get("x-ratelimit-limit-requests") != "" {
			t.Fatal("rate-limit headers for a tenant without limits")
		}
		// Nothing in the answer names the pod: not its address, not its
		// name in the id.
		if !regexp.MustCompile(`^chatcmpl-[0-9a-f]{32}$`).MatchString(out.ID) {
			t.Fatalf("response id %q: want an opaque chatcmpl-<32 hex>", out.ID)
		}
		if v := resp.Header.Get("x-gateway-destination-endpoint-served"); v != "" {
			t.Fatalf("pod address %q shown to the caller", v)
		}
	})

	t.Run("streaming", func(t *testing.T) {
		params := ask("fast")
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		s := us.Chat.Completions.NewStreaming(ctx, params)
		chunks, text := 0, ""
		for s.Next() {
			c := s.Current()
			chunks++
			if len(c.Choices) > 0 {
				text += c.Choices[0].Delta.Content
			}
			if c.Model != "fast" {
				t.Fatalf("chunk model %q", c.Model)
			}
		}
		if err := s.Err(); err != nil || chunks < 3 || text == "" {
			t.Fatalf("stream: %d chunks, text %q, err %v", chunks, text, err)
		}
	})

	t.Run("streaming without usage requested", func(t *testing.T) {
		// Tier-2 asks upstream for usage (token limits settle on real
		// counts) but must not show the caller a chunk it did not ask for.
		s := us.Chat.Completions.NewStreaming(ctx, ask("fast"))
		for s.Next() {
			if c := s.Current(); len(c.Choices) == 0 {
				t.Fatalf("unrequested usage chunk relayed: %+v", c)
			}
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("canary split answers with the public name", func(t *testing.T) {
		seen := map[string]bool{}
		for i := range 16 {
			var resp *http.Response
			out, err := us.Chat.Completions.New(ctx, ask("chat"), option.WithResponseInto(&resp),
				option.WithHeader("x-session-id", fmt.Sprint(i)))
			if err != nil {
				t.Fatal(err)
			}
			if out.Model != "chat" {
				t.Fatalf("response model %q, want the public name chat", out.Model)
			}
			seen[resp.Header.Get("x-meridian-cluster")] = true
		}
		// chat-v1 lives in use1 and chat-v2 in euw1: a 50/50 split by
		// tenant is sticky, so one tenant sees one cluster.
		if len(seen) != 1 {
			t.Fatalf("one tenant's requests went to clusters %v; the split must be sticky per tenant", seen)
		}
	})

	t.Run("401 for bad tokens", func(t *testing.T) {
		for _, tok := range []string{"", "not-a-jwt", p.Token[:len(p.Token)-4] + "AAAA"} {
			c := client(p, "us-east-1", tok)
			_, err := c.Chat.Completions.New(ctx, ask("fast"))
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
				t.Fatalf("token %q: err %v, want 401", tok, err)
			}
		}
	})

	t.Run("unknown model 404", func(t *testing.T) {
		_, err := us.Chat.Completions.New(ctx, ask("gpt-nine"))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
			t.Fatalf("err %v, want 404", err)
		}
	})

	t.Run("rate limit 429 with headers", func(t *testing.T) {
		tok := mustToken(t, p, "tiny")
		c := client(p, "us-east-1", tok)
		var last error
		var resp *http.Response
		for range 4 {
			_, last = c.Chat.Completions.New(ctx, ask("fast"), option.WithResponseInto(&resp))
		}
		var apiErr *openai.Error
		if !errors.As(last, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("4th request of a 2-per-hour tenant: %v, want 429", last)
		}
		h := apiErr.Response.Header
		if h.Get("Retry-After") == "" || h.Get("x-ratelimit-limit-requests") != "2" || h.Get("x-ratelimit-remaining-requests") == "" {
			t.Fatalf("429 headers %v", h)
		}
	})

	// A cluster whose pods answer 5xx stops getting traffic — through Tier-2's
	// retry on the next cluster at once, then the error rate in its health
	// digest or an outlier ejection, whichever comes first — and gets it back
	// once it recovers. (Ejection on its own is covered in regions.)
	t.Run("failing cluster avoided and readmitted", func(t *testing.T) {
		var bad []*sim.LivePod
		for _, lp := range p.Pods {
			if strings.HasPrefix(lp.Name(), "us-fast") {
				bad = append(bad, lp)
			}
		}
		if len(bad) != 2 {
			t.Fatalf("found %d us-fast pods", len(bad))
		}
		for _, lp := range bad {
			lp.SetFaults(sim.Faults{ErrorRate: 1})
		}
		for i := range 30 {
			var resp *http.Response
			if _, err := us.Chat.Completions.New(ctx, ask("fast"), option.WithResponseInto(&resp)); err != nil {
				t.Fatalf("request %d failed while use1 returned 5xx: %v", i, err)
			}
			if c := resp.Header.Get("x-meridian-cluster"); c != "euw1" {
				t.Fatalf("request %d served by %s while it fails", i, c)
			}
		}
		for _, lp := range bad {
			lp.SetFaults(sim.Faults{})
		}
		testkit.Eventually(t, "use1 readmitted and serving again", func() bool {
			var resp *http.Response
			_, err := us.Chat.Completions.New(ctx, ask("fast"), option.WithResponseInto(&resp))
			return err == nil && resp.Header.Get("x-meridian-cluster") == "use1"
		})
	})

	t.Run("Region failover", func(t *testing.T) {
		// Concurrent traffic while us-east-1's only cluster dies: requests
		// that had not started streaming must not fail.
		var failed, ok atomic.Int64
		var firstErr atomic.Value
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := us.Chat.Completions.New(ctx, ask("fast")); err != nil {
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					} else {
						ok.Add(1)
					}
				}
			}()
		}
		testkit.Eventually(t, "some traffic before the failure", func() bool { return ok.Load() > 20 })
		if !p.Stop("tier1/use1") {
			t.Fatal("no component tier1/use1")
		}
		before := ok.Load()
		testkit.Eventually(t, "traffic served from eu-west-1", func() bool { return ok.Load() > before+40 })
		close(stop)
		wg.Wait()
		if n := failed.Load(); n > 0 {
			t.Fatalf("%d requests failed during the failover (first: %v)", n, firstErr.Load())
		}
		var resp *http.Response
		if _, err := us.Chat.Completions.New(ctx, ask("fast"), option.WithResponseInto(&resp)); err != nil {
			t.Fatal(err)
		}
		if got := resp.Header.Get("x-meridian-region"); got != "eu-west-1" {
			t.Fatalf("after the failure served by %q, want eu-west-1", got)
		}
	})
}

func mustToken(t *testing.T, p *Platform, tenant string) string {
	t.Helper()
	tok, err := p.sign(tenant)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
