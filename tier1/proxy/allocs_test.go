package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/proxy"
	"github.com/meridian-router/meridian/tier1/scrape"
)

// cannedPod answers every request with the same event stream, in memory:
// what is counted is the proxy's own work.
type cannedPod struct{ body []byte }

func (c cannedPod) RoundTrip(r *http.Request) (*http.Response, error) {
	io.Copy(io.Discard, r.Body)
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(bytes.NewReader(c.body)), Request: r}, nil
}

// proxyAllocs is the allocation budget of one streamed chat request
// through Proxy.Handler (parse, decision, dispatch, the relay of 17
// events, the test's own request and recorder) by prompt size: the
// figures when the budget was set. More fails TestProxyAllocs.
var proxyAllocs = map[int]float64{700: 63, 225280: 67}

// TestProxyAllocs pins Tier-1's allocations per request. The pod is
// scraped once, live, then scraping stops (metrics never age out here) so
// that nothing else allocates while the requests are counted.
func TestProxyAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	pods := map[string][]*sim.LivePod{"chat": startPods(t, "h100", "chat-model", nil, 1)}
	gw, err := gateway.New(gateway.Config{Cluster: "c1", Logger: quiet, Scrape: scrape.Config{Interval: 20 * time.Millisecond},
		Options: tier1.Options{MaxMetricsAge: time.Hour}}, snapshot(t, "", pods, 1))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gw.Start(ctx, nil)
	p := &platform{gw: gw}
	p.waitScraped(t)
	cancel()
	var events strings.Builder
	for range 16 {
		events.WriteString(`data: {"choices":[{"delta":{"content":" tok"},"index":0}],"model":"chat-model","object":"chat.completion.chunk"}` + "\n\n")
	}
	events.WriteString("data: [DONE]\n\n")
	h := (&proxy.Proxy{Gateway: gw, Logger: quiet, Transport: cannedPod{[]byte(events.String())}}).Handler()
	for size, budget := range proxyAllocs {
		body := []byte(chat("chat-model", strings.Repeat("x", size-100), true))
		serve := func() {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != 200 || w.Header().Get(gateway.HeaderServed) == "" || !strings.HasSuffix(w.Body.String(), "data: [DONE]\n\n") {
				t.Fatalf("status %d: %s", w.Code, w.Body.String())
			}
		}
		serve()
		got := testkit.AllocsPerRun(200, serve)
		t.Logf("%d-byte body: %.1f allocations per request (budget %.0f)", len(body), got, budget)
		if got > budget {
			t.Errorf("%d-byte body: %.1f allocations per request, budget %.0f", len(body), got, budget)
		}
	}
}
