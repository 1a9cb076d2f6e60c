package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/simtest"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/proxy"
	"github.com/meridian-router/meridian/tier1/scrape"
)

var quiet = slog.New(slog.DiscardHandler)

// platform is a Tier-1 proxy in front of live simulated pods.
type platform struct {
	gw     *gateway.Gateway
	srv    *httptest.Server
	pods   map[string][]*sim.LivePod // by pool label
	byAddr map[string]*sim.LivePod
}

func startPods(t *testing.T, profile, model string, adapters []string, k int) []*sim.LivePod {
	t.Helper()
	return simtest.StartPods(t, sim.PodSpec{
		Pod:              sim.PodConfig{Name: model, Profile: simtest.Profile(t, profile), Model: model, Adapters: adapters},
		TimeScale:        50,
		DefaultMaxTokens: 8,
	}, k)
}

const gatewayYAML = testkit.ChatGateway + `    weights: %s
  - name: lora
    modelName: base-8b
    modelSelector: {matchLabels: {pool: lora}}
    loraAdapters: [adapter-a, adapter-b]
  bbr: {enabled: true}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: adapters
  labels: {inference.networking.k8s.io/bbr-managed: "true"}
data:
  baseModel: base-8b
  adapters: |
    - adapter-a
    - adapter-b
`

func snapshot(t *testing.T, weights string, pods map[string][]*sim.LivePod, rev int64) *config.Snapshot {
	t.Helper()
	return snapshotWith(t, weights, pods, rev, "")
}

// snapshotWith is snapshot plus extra documents (YAML, each starting with
// "---").
func snapshotWith(t *testing.T, weights string, pods map[string][]*sim.LivePod, rev int64, extra string) *config.Snapshot {
	t.Helper()
	return testkit.Snapshot(t, rev, fmt.Sprintf(gatewayYAML, weights)+testkit.StaticEndpoints(testkit.PodEndpoints(pods)...)+extra)
}

func newPlatform(t *testing.T, weights string) *platform {
	t.Helper()
	return newPlatformOf(t, weights, 300*time.Millisecond, map[string][]*sim.LivePod{
		"chat": startPods(t, "h100", "chat-model", nil, 3),
		"lora": startPods(t, "a10g", "base-8b", []string{"adapter-a", "adapter-b"}, 2),
	})
}

// newPlatformOf puts a proxy in front of the given pods, by pool label;
// maxAge is the scheduler's MaxMetricsAge.
func newPlatformOf(t *testing.T, weights string, maxAge time.Duration, pods map[string][]*sim.LivePod) *platform {
	t.Helper()
	p := &platform{pods: pods, byAddr: map[string]*sim.LivePod{}}
	for _, lps := range p.pods {
		for _, lp := range lps {
			p.byAddr[lp.Addr()] = lp
		}
	}
	gw, err := gateway.New(gateway.Config{
		Cluster: "c1",
		Logger:  quiet,
		Scrape:  scrape.Config{Interval: 20 * time.Millisecond},
		Options: tier1.Options{MaxMetricsAge: maxAge},
	}, snapshot(t, weights, p.pods, 1))
	if err != nil {
		t.Fatal(err)
	}
	p.gw = gw
	p.srv = serve(t, gw)
	p.waitScraped(t)
	return p
}

// serve starts gw and a standalone proxy in front of it on loopback, both
// stopped when the test ends.
func serve(t *testing.T, gw *gateway.Gateway) *httptest.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	gw.Start(ctx, nil)
	srv := httptest.NewServer((&proxy.Proxy{Gateway: gw, Logger: quiet}).Handler())
	t.Cleanup(srv.Close)
	return srv
}

// waitScraped waits until every endpoint has been scraped once.
func (p *platform) waitScraped(t *testing.T) {
	t.Helper()
	eventually(t, "every endpoint scraped", func() bool {
		for _, v := range p.gw.Pools() {
			for _, ep := range v.Pool.Endpoints() {
				if ep.Metrics() == nil {
					return false
				}
			}
		}
		return true
	})
}

// eventually polls cond until it holds or 20 s pass. The live pods and
// scrapers run on the wall clock over real sockets, which synctest cannot
// host, so this waits on an observable condition rather than for a time.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		<-tick.C
	}
}

type result struct {
	status int
	served string
	body   string
}

func (p *platform) post(t *testing.T, path, body string) result {
	t.Helper()
	resp, err := http.Post(p.srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header.Get(gateway.HeaderServed), string(b)}
}

func chat(model, text string, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": model, "stream": stream, "max_tokens": 4,
		"messages": []map[string]string{{"role": "user", "content": text}}})
	return string(b)
}

func TestRoutesModelsAndAdapters(t *testing.T) {
	p := newPlatform(t, "{queue: 2, kvCache: 2, prefix: 3}")
	inPool := func(pool, addr string) bool {
		for _, lp := range p.pods[pool] {
			if lp.Addr() == addr {
				return true
			}
		}
		return false
	}
	cases := []struct {
		name, path, body string
		status           int
		pool             string
		contains         string
	}{
		{"base model", "/v1/chat/completions", chat("chat-model", "hello", false), 200, "chat", `"chat-model"`},
		{"streaming", "/v1/chat/completions", chat("chat-model", "hello", true), 200, "chat", "data: [DONE]"},
		{"completion", "/v1/completions", `{"model":"chat-model","prompt":"once upon","max_tokens":3}`, 200, "chat", `"text_completion"`},
		{"adapter via BBR", "/v1/chat/completions", chat("adapter-a", "triage this claim", false), 200, "lora", `"adapter-a"`},
		{"base of adapters", "/v1/chat/completions", chat("base-8b", "hi", false), 200, "lora", ""},
		{"unknown model", "/v1/chat/completions", chat("gpt-9", "hi", false), 404, "", "no matching model: set the model in the request body or the x-gateway-model-name header"},
		{"malformed body", "/v1/chat/completions", `{"model": "chat-model", "messages": [`, 400, "", `"invalid_request_error"`},
		{"missing model", "/v1/chat/completions", `{"messages": []}`, 400, "", `"missing_model"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := p.post(t, tc.path, tc.body)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			if tc.pool != "" && !inPool(tc.pool, r.served) {
				t.Fatalf("served by %q, not a %s pod", r.served, tc.pool)
			}
			if !strings.Contains(r.body, tc.contains) {
				t.Fatalf("body does not contain %q:\n%s", tc.contains, r.body)
			}
		})
	}
}

func TestPrefixAffinity(t *testing.T) {
	// Metrics never count as stale here: this is about prefix scoring, and
	// a pod avoided for a missed scrape (300 ms in newPlatform, easily
	// missed on a loaded machine) sent the next requests elsewhere.
	p := newPlatformOf(t, "{prefix: 5, queue: 1}", time.Minute, map[string][]*sim.LivePod{
		"chat": startPods(t, "h100", "chat-model", nil, 3),
	})
	system := strings.Repeat("You are a careful claims assistant. ", 60)
	served := map[string]int{}
	for i := range 12 {
		r := p.post(t, "/v1/chat/completions", chat("chat-model", system+fmt.Sprintf("question %d", i), false))
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		served[r.served]++
	}
	best := 0
	for _, n := range served {
		best = max(best, n)
	}
	if best < 10 {
		t.Fatalf("requests sharing a long prefix spread over pods %v; want at least 10 of 12 on one", served)
	}
}

func TestFallbackOnFailingPod(t *testing.T) {
	p := newPlatform(t, "{queue: 2, kvCache: 2, prefix: 3}")
	bad := p.pods["chat"][0]
	if err := bad.SetFaults(sim.Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 15 {
		r := p.post(t, "/v1/chat/completions", chat("chat-model", fmt.Sprintf("q%d", i), false))
		if r.status != 200 {
			t.Fatalf("request %d: status %d: %s", i, r.status, r.body)
		}
		if r.served == bad.Addr() {
			t.Fatalf("request %d served by the failing pod", i)
		}
	}
}

func TestStalePodAvoided(t *testing.T) {
	p := newPlatform(t, "{queue: 2, kvCache: 2, prefix: 3}")
	dead := p.pods["chat"][1]
	dead.Close() // stops answering: connect errors, then stale metrics
	var ep *tier1.Endpoint
	for _, v := range p.gw.Pools() {
		for _, e := range v.Pool.Endpoints() {
			if e.Address == dead.Addr() {
				ep = e
			}
		}
	}
	scraped := ep.Metrics().ScrapedAt
	eventually(t, "the dead pod's metrics to age past the staleness bound", func() bool {
		return time.Since(scraped) > 400*time.Millisecond
	})
	for i := range 15 {
		r := p.post(t, "/v1/chat/completions", chat("chat-model", fmt.Sprintf("q%d", i), true))
		if r.status != 200 || r.served == dead.Addr() {
			t.Fatalf("request %d: status %d served by %q (dead pod %s)", i, r.status, r.served, dead.Addr())
		}
	}
}

func TestReloadWithoutLoss(t *testing.T) {
	p := newPlatform(t, "{queue: 2, kvCache: 2, prefix: 3}")
	errs := make(chan string, 200)
	stop := testkit.Loop(4, func(w, i int) {
		resp, err := http.Post(p.srv.URL+"/v1/chat/completions", "application/json",
			bytes.NewReader([]byte(chat("chat-model", fmt.Sprintf("w%d-%d", w, i), i%2 == 0))))
		if err != nil {
			errs <- err.Error()
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			errs <- fmt.Sprintf("status %d", resp.StatusCode)
		}
	})
	weights := []string{"{queue: 5}", "{prefix: 4, kvCache: 1}", "{runningRequests: 2, lru: 1}", "{queue: 2, kvCache: 2, prefix: 3}"}
	for i, w := range weights {
		if err := p.gw.Apply(snapshot(t, w, p.pods, int64(i+2))); err != nil {
			t.Fatal(err)
		}
		r := p.post(t, "/v1/chat/completions", chat("chat-model", "between reloads", false))
		if r.status != 200 {
			t.Fatalf("after reload %d: status %d", i, r.status)
		}
	}
	stop()
	close(errs)
	for e := range errs {
		t.Errorf("request failed during reloads: %s", e)
	}
	if got := p.gw.Snapshot().Revision; got != int64(len(weights)+1) {
		t.Fatalf("revision %d after reloads", got)
	}
}

// Adapters registered on some pods only: /v1/models tells Tier-1 which
// pods serve which adapter (vllm:lora_requests_info lists only adapters in
// use), so no adapter request is answered 404. When Tier-1's view is wrong
// (an adapter unloaded since the last read), the pod's 404 is retried on a
// fallback before the first byte.
func TestAdaptersRegisteredOnSomePods(t *testing.T) {
	lora := append(startPods(t, "a10g", "base-8b", []string{"adapter-a"}, 2),
		startPods(t, "a10g", "base-8b", []string{"adapter-b"}, 2)...)
	// Metrics never count as stale here: every pod stays a candidate, so
	// the primary and two fallbacks include a pod that has the adapter
	// even when Tier-1 believes the two that lack it have it.
	p := newPlatformOf(t, "{queue: 2, kvCache: 2, prefix: 3, predictedLatency: 32, loraAffinity: 1}", time.Minute,
		map[string][]*sim.LivePod{"chat": startPods(t, "h100", "chat-model", nil, 1), "lora": lora})
	serves := func(addr, adapter string) bool {
		lp := p.byAddr[addr]
		return lp != nil && strings.Contains(lp.String(), "adapters="+adapter)
	}
	var loraPool *tier1.Pool
	for _, v := range p.gw.Pools() {
		if v.Model == "base-8b" {
			loraPool = v.Pool
		}
	}
	eventually(t, "every lora pod's /v1/models read", func() bool {
		for _, ep := range loraPool.Endpoints() {
			if ep.Capabilities() == nil {
				return false
			}
		}
		return true
	})
	send := func(t *testing.T, n int) {
		for i := range n {
			adapter := []string{"adapter-a", "adapter-b"}[i%2]
			r := p.post(t, "/v1/chat/completions", chat(adapter, fmt.Sprintf("claim %d", i), false))
			if r.status != 200 {
				t.Fatalf("request %d for %s: status %d: %s", i, adapter, r.status, r.body)
			}
			if !serves(r.served, adapter) {
				t.Fatalf("request %d for %s served by %s, which does not register it", i, adapter, r.served)
			}
		}
	}
	t.Run("capabilities known", func(t *testing.T) { send(t, 40) })
	t.Run("capabilities wrong: 404 retried", func(t *testing.T) {
		for _, ep := range loraPool.Endpoints() {
			// Until the next read (30 s away), Tier-1 believes every pod
			// serves both adapters.
			ep.SetCapabilities(&tier1.Capabilities{Models: []string{"base-8b"}, Adapters: []string{"adapter-a", "adapter-b"}})
		}
		send(t, 20)
	})
}

// TestModelNameRewrite: x-gateway-model-name-rewrite names the model the
// request is for, as in GIE: it is scheduled on that model's pool and the
// body reaches the server with the rewritten "model" (the simulator
// answers 404 for a model it does not serve, and echoes the one it got).
func TestModelNameRewrite(t *testing.T) {
	p := newPlatform(t, "{queue: 2, kvCache: 2, prefix: 3}")
	for _, tc := range []struct{ to, pool string }{{"chat-model", "chat"}, {"adapter-b", "lora"}} {
		t.Run(tc.to, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, p.srv.URL+"/v1/chat/completions", strings.NewReader(chat("public-alias", "hello", false)))
			req.Header.Set(gateway.HeaderModelRewrite, tc.to)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"model":"`+tc.to+`"`) {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			served := resp.Header.Get(gateway.HeaderServed)
			found := false
			for _, lp := range p.pods[tc.pool] {
				found = found || lp.Addr() == served
			}
			if !found {
				t.Fatalf("served by %q, not a %s pod", served, tc.pool)
			}
		})
	}
}

// A caller that hangs up before its answer starts (a non-streamed request
// waits for the whole completion) stops the pod's work on it, and its
// admission and in-flight count are released: a pod is the expensive
// part, and a caller hanging up on long completions must not keep it
// generating for no one.
func TestCallerHangsUpBeforeFirstByte(t *testing.T) {
	pods := simtest.StartPods(t, sim.PodSpec{
		Pod:       sim.PodConfig{Name: "chat-model", Profile: simtest.Profile(t, "h100"), Model: "chat-model"},
		TimeScale: 5, // 4000 tokens take about 8 s of wall time
	}, 1)
	p := newPlatformOf(t, "{queue: 2, kvCache: 2, prefix: 3}", 300*time.Millisecond, map[string][]*sim.LivePod{"chat": pods, "lora": nil})
	const maxTokens = 4000
	body := `{"model":"chat-model","max_tokens":4000,"messages":[{"role":"user","content":"Tell me a long story."}]}`
	m := simtest.HangUp(t, pods[0], p.srv.URL+"/v1/chat/completions", nil, body)
	if m.GenerationTokens >= maxTokens/2 {
		t.Fatalf("the pod generated %d of %d tokens for a caller that had hung up: the hang-up did not reach it", m.GenerationTokens, maxTokens)
	}
	eventually(t, "the pod's in-flight count back to 0", func() bool {
		for _, v := range p.gw.Pools() {
			for _, ep := range v.Pool.Endpoints() {
				if ep.InFlight() != 0 {
					return false
				}
			}
		}
		return true
	})
}
