package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/simtest"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/scrape"
)

// TestLiveAgainstLeastOutstanding: the live comparison. The same
// open-loop client sends the same requests (four groups sharing a long
// system prompt, each with its own question) at the same instants to two
// H100 and two A10G simulated pods (the A10G prefills about eleven times
// slower), once through Tier-1's proxy with the shipped defaults (no
// weights, the binary's scrape interval and metrics age) and once through
// a least-outstanding-requests balancer (ALB's algorithm: the pod with the
// fewest requests in flight, ties broken at random). Each run has fresh
// pods. TTFT is measured by the client (time to the first streamed token).
//
// What it asserts: what Meridian's latency models learned in the run.
// An A10G prefills about eleven times slower than an H100, and each
// A10G's learned price of 1,000 uncached tokens must be at least twice
// every H100's; the pods carry their card as the gpu label, so the two
// pods of one card price alike (one shared model). Before the simulated pods sent the chat role chunk with
// the first token, as vLLM does, the proxy timed it at once: every pod
// learned a TTFT of a few milliseconds (an A10G that had taken 835 ms to
// answer priced 1,000 tokens at 26 ms, the H100s at 18–31 ms), the A10Gs
// looked as fast as the H100s and took 30 of 64 requests, the groups
// whose prefix they held (P50 37 ms against least-outstanding's 9 ms);
// earlier still, the first A10G to answer took all 64. The goal,
// P50 and P99 both no worse than least-outstanding's, is logged, not
// asserted (speed is shown, not asserted); docs/tuning.md records the
// figures, and that a group can still stay on the A10G that first
// prefilled its prompt (the prefix score's bonus outweighing the latency
// score's preference for an H100), 5 runs in 13.
//
// The pods run in real time (model time = wall time), so the figures are
// wall-clock.
func TestLiveAgainstLeastOutstanding(t *testing.T) {
	const (
		groups   = 4
		requests = 64
		gap      = 125 * time.Millisecond // 8 req/s
	)
	rng := rand.New(rand.NewPCG(1, 1))
	system := make([]string, groups)
	for g := range system {
		// ~2,000 tokens at 4 characters a token.
		system[g] = strings.Repeat(fmt.Sprintf("You are support agent %d for product line %d. ", g, g*7), 180)
	}
	type job struct {
		at   time.Duration
		body string
	}
	jobs := make([]job, requests)
	for i := range jobs {
		g := rng.IntN(groups)
		b, _ := json.Marshal(map[string]any{"model": "chat-model", "stream": true, "max_tokens": 4,
			"messages": []map[string]string{
				{"role": "system", "content": system[g]},
				{"role": "user", "content": fmt.Sprintf("Question %d: %s", i, strings.Repeat("why ", 50+rng.IntN(50)))},
			}})
		jobs[i] = job{at: time.Duration(i) * gap, body: string(b)}
	}
	// run returns the sorted TTFTs and how many requests the A10Gs served.
	run := func(t *testing.T, front func(t *testing.T, pods []*sim.LivePod) string) ([]time.Duration, int) {
		pods := append(startLivePods(t, "h100", 2), startLivePods(t, "a10g", 2)...)
		base := front(t, pods)
		ttfts := make([]time.Duration, len(jobs))
		served := make([]string, len(jobs))
		errs := make([]error, len(jobs))
		var wg sync.WaitGroup
		start := time.Now()
		tick := time.NewTicker(gap)
		defer tick.Stop()
		for i, j := range jobs {
			if i > 0 {
				<-tick.C // the open-loop arrival schedule, not a synchronisation
			}
			wg.Go(func() { ttfts[i], served[i], errs[i] = firstToken(t.Context(), base, j.body) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		slow := 0
		per := map[string][]time.Duration{}
		for i, addr := range served {
			per[addr] = append(per[addr], ttfts[i])
		}
		for _, lp := range pods {
			d := per[lp.Addr()]
			slices.Sort(d)
			med := time.Duration(0)
			if len(d) > 0 {
				med = d[len(d)/2]
			}
			t.Logf("  %s: %d requests, median TTFT %v", lp.Name(), len(d), med.Round(time.Millisecond))
			if strings.HasPrefix(lp.Name(), "a10g") {
				slow += len(d)
			}
		}
		t.Logf("%d requests in %v", len(jobs), time.Since(start).Round(time.Millisecond))
		slices.Sort(ttfts)
		return ttfts, slow
	}
	q := func(d []time.Duration, f float64) time.Duration { return d[int(f*float64(len(d)-1)+0.5)] }
	lor, _ := run(t, leastOutstandingFront)
	var gw *gateway.Gateway
	profile := map[string]string{} // pod address → profile
	mer, slow := run(t, func(t *testing.T, pods []*sim.LivePod) string {
		for _, lp := range pods {
			profile[lp.Addr()], _, _ = strings.Cut(lp.Name(), "-")
		}
		url, g := meridianGateway(t, pods)
		gw = g
		return url
	})
	t.Logf("least-outstanding: TTFT P50 %v P99 %v", q(lor, .5).Round(time.Millisecond), q(lor, .99).Round(time.Millisecond))
	t.Logf("meridian:          TTFT P50 %v P99 %v, %d requests to the A10Gs", q(mer, .5).Round(time.Millisecond), q(mer, .99).Round(time.Millisecond), slow)
	price := map[string][]float64{} // profile → each pod's learned price of 1,000 uncached tokens
	for _, v := range gw.Pools() {
		for _, ep := range v.Pool.Endpoints() {
			pr := tier1.PrefillSeconds([]*tier1.Endpoint{ep}, 1000)
			price[profile[ep.Address]] = append(price[profile[ep.Address]], pr)
		}
	}
	t.Logf("learned prefill of 1,000 tokens: h100 %.3f s, a10g %.3f s", price["h100"], price["a10g"])
	if len(price["h100"]) != 2 || len(price["a10g"]) != 2 {
		t.Fatalf("prices by profile %v, want two pods of each", price)
	}
	for card, p := range price {
		if p[0] != p[1] {
			t.Errorf("the two %s pods priced 1,000 tokens at %.3f and %.3f s: pods of one card share one latency model", card, p[0], p[1])
		}
	}
	if slices.Min(price["a10g"]) < 2*slices.Max(price["h100"]) {
		t.Errorf("an A10G priced 1,000 uncached tokens at %.3f s, less than twice an H100's %.3f s: its latency model did not learn its slower prefill",
			slices.Min(price["a10g"]), slices.Max(price["h100"]))
	}
}

func startLivePods(t *testing.T, profile string, k int) []*sim.LivePod {
	t.Helper()
	return simtest.StartPods(t, sim.PodSpec{
		Pod:       sim.PodConfig{Name: profile, Profile: simtest.Profile(t, profile), Model: "chat-model"},
		TimeScale: 1,
		OnOutcome: func(o sim.Outcome) {
			if o.Err != nil {
				t.Logf("pod outcome: %s: %v", o.Request.ID, o.Err)
			}
		},
	}, k)
}

// meridianGateway is Tier-1's proxy as `meridian tier1` runs it, with the
// shipped defaults: a scheduler that names no weights, the binary's
// --scrape-interval (50 ms) and --max-metrics-age (1 s). It returns the
// proxy's URL and its gateway.
func meridianGateway(t *testing.T, pods []*sim.LivePod) (string, *gateway.Gateway) {
	eps := make([]testkit.Endpoint, len(pods))
	for i, lp := range pods {
		// Labelled with its card, as a deployment's pods would be: the
		// pods of one card share a latency model (the default
		// latencyClassLabel, gpu).
		gpu, _, _ := strings.Cut(lp.Name(), "-")
		eps[i] = testkit.Endpoint{Name: fmt.Sprintf("pod-%d", i), Address: lp.Addr(), Pool: "chat", GPU: gpu}
	}
	snap := testkit.Snapshot(t, 1, testkit.ChatGateway+testkit.StaticEndpoints(eps...))
	gw, err := gateway.New(gateway.Config{
		Cluster: "c1",
		Logger:  quiet,
		Scrape:  scrape.Config{Interval: 50 * time.Millisecond},
		Options: tier1.Options{MaxMetricsAge: time.Second},
	}, snap)
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, gw)
	p := &platform{gw: gw}
	p.waitScraped(t)
	testkit.Eventually(t, "every pod's /v1/models read", func() bool {
		for _, v := range gw.Pools() {
			for _, ep := range v.Pool.Endpoints() {
				if ep.Capabilities() == nil {
					return false
				}
			}
		}
		return true
	})
	return srv.URL, gw
}

// leastOutstandingFront balances by least outstanding requests (ALB's
// algorithm: the pod with the fewest requests in flight until its
// response is read to the end, ties broken at random) in front of the
// pods, without a proxy hop: a local handler that forwards each request
// to the pod it picks and relays the stream, flushing every chunk.
func leastOutstandingFront(t *testing.T, pods []*sim.LivePod) string {
	var mu sync.Mutex
	inflight := make([]int, len(pods))
	rng := rand.New(rand.NewPCG(2, 2))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(client.CloseIdleConnections)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		best, ties := -1, 0
		for i, n := range inflight {
			switch {
			case best < 0 || n < inflight[best]:
				best, ties = i, 1
			case n == inflight[best]:
				ties++
				if rng.IntN(ties) == 0 {
					best = i
				}
			}
		}
		inflight[best]++
		mu.Unlock()
		defer func() { mu.Lock(); inflight[best]--; mu.Unlock() }()
		out, err := http.NewRequestWithContext(r.Context(), r.Method, pods[best].URL()+r.URL.Path, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		out.Header.Set("Content-Type", r.Header.Get("Content-Type"))
		resp, err := client.Do(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.Header().Set(gateway.HeaderServed, pods[best].Addr())
		w.WriteHeader(resp.StatusCode)
		rc := http.NewResponseController(w)
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				w.Write(buf[:n])
				rc.Flush()
			}
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// firstToken posts a streaming chat request and returns the time to the
// first data event that carries generated text (not the role chunk),
// reading the rest of the stream.
func firstToken(ctx context.Context, base, body string) (ttft time.Duration, served string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	served = resp.Header.Get(gateway.HeaderServed)
	if resp.StatusCode != http.StatusOK {
		return 0, served, fmt.Errorf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if ttft == 0 && strings.HasPrefix(line, "data: {") &&
			strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
			ttft = time.Since(start)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, served, err
	}
	if ttft == 0 {
		return 0, served, fmt.Errorf("no token in the stream")
	}
	return ttft, served, nil
}
