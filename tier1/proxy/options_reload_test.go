package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/configtest"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/request"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/simtest"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/proxy"
	"github.com/meridian-router/meridian/tier1/scrape"
)

// TestSchedulerOptionsReloadLive changes each scorer option of
// spec.schedulers[].options — queueHalf, runningHalf, queueSaturation,
// kvSaturation, latencyScale and prefix.lruCapacityPerServer — through the
// directory source and through etcd while requests flow through the
// proxy to simulated model servers, and sees each change the decision it
// governs. No flowing request fails.
//
// Pool "chat" (two pods) carries the flowing traffic. Pool "obs" has two
// pods held in a fixed state, by requests sent to them directly and the
// engine then stopped (sim's Hang): pod a runs one long-prompt request
// and has two waiting (it batches one at a time), pod b runs eight; a
// prompt is in the prefix index for a. Which of them the live scheduler
// picks first for that prompt is the observed behaviour, under weights
// that make the option decide. Pool "lru" is one pod that reports no
// cache configuration (SGLang's metrics), whose prefix index is sized by
// lruCapacityPerServer. Every option is set on every scheduler.
func TestSchedulerOptionsReloadLive(t *testing.T) {
	configtest.Sources(t, configtest.SourceOptions{Logger: optionsQuiet}, func(t *testing.T, start func(string, map[string][]byte) configtest.Live) {
		h := newOptionsHarness(t)
		live := start(h.yaml("", ""), nil)
		h.start(t, live.Snapshot, live.Updates)
		h.scenario(t, live.Apply)
	})
}

var optionsQuiet = slog.New(slog.DiscardHandler)

type optionsHarness struct {
	chat []*sim.LivePod
	a, b *sim.LivePod // pool obs
	lru  *sim.LivePod
	gw   *gateway.Gateway
	url  string
}

func newOptionsHarness(t *testing.T) *optionsHarness {
	t.Helper()
	prof := simtest.Profile(t, "h100")
	start := func(name, model string, p sim.Profile, scale float64, names sim.MetricNames, k int) []*sim.LivePod {
		return simtest.StartPods(t, sim.PodSpec{Pod: sim.PodConfig{Name: name, Profile: p, Model: model},
			TimeScale: scale, DefaultMaxTokens: 4, Metrics: names}, k)
	}
	one := prof
	one.MaxNumSeqs = 1
	h := &optionsHarness{
		chat: start("chat", "chat-model", prof, 50, "", 2),
		// Real time: the held requests would take minutes to finish.
		a:   start("obs-a", "obs-model", one, 1, "", 1)[0],
		b:   start("obs-b", "obs-model", prof, 1, "", 1)[0],
		lru: start("lru", "lru-model", prof, 50, sim.MetricsSGLang, 1)[0],
	}
	return h
}

// yaml is the configuration with the obs pool's weights (a YAML flow
// mapping) and every scheduler's options: maxMetricsAge 1h (the held pods'
// numbers do not change, so a scrape delayed on a loaded machine must not
// take a pod out of the decision) and the given fields ("" for none).
func (h *optionsHarness) yaml(obsWeights, options string) string {
	if obsWeights == "" {
		obsWeights = "{queue: 1}"
	}
	if options != "" {
		options = ", " + options
	}
	opts := "    options: {maxMetricsAge: 1h" + options + "}\n"
	var eps []testkit.Endpoint
	for i, lp := range h.chat {
		eps = append(eps, testkit.Endpoint{Name: fmt.Sprintf("chat-%d", i), Address: lp.Addr(), Pool: "chat"})
	}
	eps = append(eps, testkit.Endpoint{Name: "obs-a", Address: h.a.Addr(), Pool: "obs"}, testkit.Endpoint{Name: "obs-b", Address: h.b.Addr(), Pool: "obs"},
		testkit.Endpoint{Name: "lru", Address: h.lru.Addr(), Pool: "lru"})
	return testkit.ChatGateway + opts + fmt.Sprintf(`  - name: obs
    modelName: obs-model
    modelSelector: {matchLabels: {pool: obs}}
    weights: %s
%s  - name: lru
    modelName: lru-model
    modelSelector: {matchLabels: {pool: lru}}
    weights: {prefix: 1}
%s  bbr: {enabled: true}
`, obsWeights, opts, opts) + testkit.StaticEndpoints(eps...)
}

func (h *optionsHarness) start(t *testing.T, first *config.Snapshot, updates <-chan *config.Snapshot) {
	t.Helper()
	gw, err := gateway.New(gateway.Config{Cluster: "c1", Logger: optionsQuiet, Scrape: scrape.Config{Interval: 20 * time.Millisecond}}, first)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	gw.Start(ctx, updates)
	h.gw = gw
	srv := httptest.NewServer((&proxy.Proxy{Gateway: gw, Logger: optionsQuiet}).Handler())
	t.Cleanup(srv.Close)
	h.url = srv.URL
}

// endpoint is the gateway's endpoint for pod lp.
func (h *optionsHarness) endpoint(t *testing.T, lp *sim.LivePod) *tier1.Endpoint {
	t.Helper()
	for _, v := range h.gw.Pools() {
		for _, ep := range v.Pool.Endpoints() {
			if ep.Address == lp.Addr() {
				return ep
			}
		}
	}
	t.Fatalf("no endpoint for pod %s", lp.Addr())
	return nil
}

func (h *optionsHarness) pool(name string) gateway.PoolView {
	for _, v := range h.gw.Pools() {
		if v.Name == name {
			return v
		}
	}
	return gateway.PoolView{}
}

func completion(model, prompt string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "stream": stream})
	return string(b)
}

// post sends one completion through the proxy.
func (h *optionsHarness) post(model, prompt string) (int, error) {
	resp, err := http.Post(h.url+"/v1/completions", "application/json", strings.NewReader(completion(model, prompt, 2, false)))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// hold sends n streaming requests straight to pod lp (not through
// Tier-1) that run for minutes, and returns when lp reports the state
// done wants. The requests end when the test does.
func hold(t *testing.T, lp *sim.LivePod, n int, prompt string, done func(sim.Metrics) bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, lp.URL()+"/v1/completions",
				strings.NewReader(completion(lp.Model(), prompt, 20000, true)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return // cancelled at the end of the test
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	wctx, wcancel := context.WithTimeout(ctx, testkit.EventuallyTimeout)
	defer wcancel()
	if _, err := lp.WaitFor(wctx, done); err != nil {
		t.Fatalf("pod %s did not reach the held state: %v (metrics %+v)", lp.Name(), err, lp.Metrics())
	}
}

// reload writes y through the source (write returns the revision it
// became) while four clients send requests to the chat pool, waits until
// the gateway serves it, and fails if any of those requests failed.
func (h *optionsHarness) reload(t *testing.T, write func(string) int64, y string) {
	t.Helper()
	var rev int64
	testkit.UnderTraffic(t, 4, func(c, n int) string {
		code, err := h.post("chat-model", fmt.Sprintf("client %d request %d", c, n))
		return testkit.Failure(code, err, "")
	}, func() string {
		rev = write(y)
		return fmt.Sprintf("revision %d", rev)
	}, func() bool { return h.gw.Snapshot().Revision >= rev })
}

func (h *optionsHarness) scenario(t *testing.T, write func(string) int64) {
	// The obs pool's held state.
	long := strings.Repeat("a long prompt that fills the KV cache. ", 200) // ~2000 tokens
	hold(t, h.a, 1, long, func(m sim.Metrics) bool { return m.Running == 1 })
	hold(t, h.a, 2, "short", func(m sim.Metrics) bool { return m.Running == 1 && m.Waiting == 2 })
	if err := h.a.SetFaults(sim.Faults{Hang: true}); err != nil {
		t.Fatal(err)
	}
	hold(t, h.b, 8, "short", func(m sim.Metrics) bool { return m.Running == 8 })
	if err := h.b.SetFaults(sim.Faults{Hang: true}); err != nil {
		t.Fatal(err)
	}
	epA, epB := h.endpoint(t, h.a), h.endpoint(t, h.b)
	testkit.Eventually(t, "Tier-1 scraped the held state", func() bool {
		ma, mb := epA.Metrics(), epB.Metrics()
		return ma != nil && mb != nil && ma.Waiting == 2 && ma.Running == 1 && mb.Waiting == 0 && mb.Running == 8
	})
	kvA := epA.Metrics().KVCacheUsage
	if !(kvA > 0 && kvA < 0.2) {
		t.Fatalf("pod a's KV use %v; want in (0, 0.2) for the saturation cases", kvA)
	}
	// The probe prompt is in the index for pod a only.
	probe := &request.Body{Model: "obs-model", Kind: request.Completion, Prompt: strings.Repeat("probe prompt ", 30)}
	d, err := h.gw.Decide(probe, gateway.Meta{})
	if err != nil {
		t.Fatal(err)
	}
	h.gw.Dispatch(d, epA).Done(http.StatusOK, false)
	d.Release()
	primary := func() string {
		t.Helper()
		d, err := h.gw.Decide(probe, gateway.Meta{})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Release()
		switch d.Endpoints[0] {
		case epA:
			return "a"
		case epB:
			return "b"
		}
		return d.Endpoints[0].Address
	}

	cases := []struct {
		name, weights, option string
		before, after         string // primary under the defaults, then with option
	}{
		// queue + running: a (2 waiting, 1 running) 1.65 against b (8
		// running) 1.89; with queueHalf 64, a 1.95.
		{"queueHalf", "{queue: 1, runningRequests: 1}", "queueHalf: 64", "b", "a"},
		// With runningHalf 8: a 1.56 against b 1.5.
		{"runningHalf", "{queue: 1, runningRequests: 1}", "runningHalf: 8", "b", "a"},
		// prefix + queue: a's cached prefix is worth 1 − 2/8 = 0.75 (+0.67
		// queue) against b's empty queue (1); with queueSaturation 2 it is
		// worth nothing.
		{"queueSaturation", "{prefix: 1, queue: 1}", "queueSaturation: 2", "a", "b"},
		// With kvSaturation below a's KV use, likewise.
		{"kvSaturation", "{prefix: 1, queue: 1}", fmt.Sprintf("kvSaturation: %.6f", kvA/4), "a", "b"},
		// predictedLatency ×10 + prefix: the prior predicts about 0.21 s
		// for a (two waiting) and 0.08 s for b, which at the default scale
		// (0.5 s) outweighs a's prefix; at 1h both predictions score about
		// 1 and the prefix decides.
		{"latencyScale", "{predictedLatency: 10, prefix: 1}", "latencyScale: 1h", "b", "a"},
	}
	for _, tc := range cases {
		h.reload(t, write, h.yaml(tc.weights, ""))
		if got := primary(); got != tc.before {
			t.Fatalf("%s: primary %s with weights %s and the default options; want %s", tc.name, got, tc.weights, tc.before)
		}
		h.reload(t, write, h.yaml(tc.weights, tc.option))
		if got := primary(); got != tc.after {
			t.Fatalf("%s: primary %s with weights %s and options %s; want %s", tc.name, got, tc.weights, tc.option, tc.after)
		}
	}

	// prefix.lruCapacityPerServer: a 640-character prompt is 10 blocks of
	// 64; the default capacity keeps them all, a capacity of 4 keeps at
	// most 4 (none of this prompt: its one anchor stands for 10 blocks).
	h.reload(t, write, h.yaml("", ""))
	index := h.pool("lru").Pool.PrefixIndex()
	lruPrompt := strings.Repeat("0123456789", 64)
	if code, err := h.post("lru-model", lruPrompt); err != nil || code != http.StatusOK {
		t.Fatalf("lru-model: %d, %v", code, err)
	}
	// Meridian's index holds a prompt's anchors, each charged the blocks
	// it stands for: count blocks, not entries.
	blocks := func() int {
		held, _ := index.Blocks()
		n := 0
		for _, b := range held {
			n += b
		}
		return n
	}
	if n := blocks(); n < 10 {
		t.Fatalf("%d prefix index blocks after a 10-block prompt with the default lruCapacityPerServer", n)
	}
	h.reload(t, write, h.yaml("", "prefix: {lruCapacityPerServer: 4}"))
	if code, err := h.post("lru-model", lruPrompt+" and more"); err != nil || code != http.StatusOK {
		t.Fatalf("lru-model: %d, %v", code, err)
	}
	if n := blocks(); n > 4 {
		t.Fatalf("%d prefix index blocks for the pod with lruCapacityPerServer 4", n)
	}
}
