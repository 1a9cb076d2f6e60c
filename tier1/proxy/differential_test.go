package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/proxy"
	"github.com/meridian-router/meridian/tier1/scrape"
)

// recordedPod is a simulated pod behind a recorder (testkit.WireRecorder)
// of the inference requests that reach it; its address is the recorder's.
type recordedPod struct{ addr string }

func (p recordedPod) Addr() string { return p.addr }

// TestProxyDifferential is tier2's TestFrontDoorDifferential for Tier-1's
// proxy: the same kinds of raw bytes, and each request reaches a pod
// exactly once with its own body and tenant, or not at all.
func TestProxyDifferential(t *testing.T) {
	pod := startPods(t, "h100", "chat-model", nil, 1)[0]
	target, _ := url.Parse(pod.URL())
	passOn := httputil.NewSingleHostReverseProxy(target)
	rec := testkit.NewWireRecorder(passOn, func(r *http.Request, body []byte) string {
		var b struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		name := "unparsed"
		if json.Unmarshal(body, &b) == nil && len(b.Messages) > 0 {
			name = b.Messages[0].Content
		}
		name += "@" + r.Header.Get("X-Gateway-Inference-Fairness-Id")
		if r.Header.Get("Expect") != "" {
			name += "+expect"
		}
		return name
	})
	// Only inference requests are recorded; the scraper's pass straight on.
	podFront := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") && r.Method == http.MethodPost {
			rec.ServeHTTP(w, r)
			return
		}
		passOn.ServeHTTP(w, r)
	}))
	t.Cleanup(podFront.Close)
	pods := map[string][]recordedPod{"chat": {{podFront.Listener.Addr().String()}}}
	snap := testkit.Snapshot(t, 1, testkit.ChatGateway+"    weights: {queue: 1}\n"+testkit.StaticEndpoints(testkit.PodEndpoints(pods)...))
	gw, err := gateway.New(gateway.Config{Cluster: "c1", Logger: quiet, Scrape: scrape.Config{Interval: 20 * time.Millisecond},
		Options: tier1.Options{MaxMetricsAge: time.Minute}}, snap)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	gw.Start(ctx, nil)
	testkit.Eventually(t, "the pod scraped", func() bool {
		for _, v := range gw.Pools() {
			for _, ep := range v.Pool.Endpoints() {
				if ep.Metrics() == nil {
					return false
				}
			}
		}
		return true
	})
	front := testkit.Track((&proxy.Proxy{Gateway: gw, Logger: quiet}).Handler())
	srv := httptest.NewUnstartedServer(front)
	srv.Config.ReadHeaderTimeout = 2 * time.Second
	srv.Start()
	t.Cleanup(srv.Close)
	wire := testkit.Wire{Addr: srv.Listener.Addr().String(), Front: front, Upstream: rec,
		Sentinel: "GET /healthz HTTP/1.1\r\nHost: t1\r\n\r\n", SentinelBody: "ok\n", ReadFor: 20 * time.Second}

	body := func(marker string, size int) string {
		b := `{"model":"chat-model","max_tokens":2,"messages":[{"role":"user","content":"` + marker + `"}]}`
		if len(b) < size {
			b = b[:len(b)-1] + strings.Repeat(" ", size-len(b)) + "}"
		}
		return b
	}
	head := func(tenant string, extra ...string) string {
		h := "POST /v1/chat/completions HTTP/1.1\r\nHost: t1\r\nContent-Type: application/json\r\nX-Gateway-Inference-Fairness-Id: " + tenant + "\r\n"
		for _, e := range extra {
			h += e + "\r\n"
		}
		return h
	}
	post := func(tenant, marker string) string {
		b := body(marker, 0)
		return head(tenant, fmt.Sprintf("Content-Length: %d", len(b))) + "\r\n" + b
	}
	chunkedHead := head("t1", "Transfer-Encoding: chunked") + "\r\n"
	body256 := body("C", 0x100)
	inner := post("t1", "SMUGGLED")
	closes := func(t *testing.T, i int, r *http.Response, _ []byte) {
		if !r.Close {
			t.Errorf("response %d leaves the connection open", i)
		}
	}
	cases := []testkit.WireCase{
		{Name: "one request", Pieces: testkit.Pieces(post("t1", "A")), Statuses: []int{200}, Upstream: []string{"A@t1"}},
		{Name: "two tenants on one connection", Pieces: testkit.Pieces(post("t1", "A") + post("t2", "B")),
			Statuses: []int{200, 200}, Upstream: []string{"A@t1", "B@t2"}},
		{Name: "pipelined after a GET", Pieces: testkit.Pieces("GET /healthz HTTP/1.1\r\nHost: t1\r\n\r\n" + post("t1", "A")),
			Methods: []string{"GET"}, Statuses: []int{200, 200}, Upstream: []string{"A@t1"}},
		{Name: "head after a pipelined GET, body (itself a request) in a later write",
			Pieces:   testkit.Pieces("GET /healthz HTTP/1.1\r\nHost: t1\r\n\r\n"+head("t1", fmt.Sprintf("Content-Length: %d", len(inner)))+"\r\n", inner),
			Methods:  []string{"GET"},
			Statuses: []int{200, 400}},
		{Name: "chunk size line split across writes, a request in the chunk",
			Pieces: testkit.Pieces(chunkedHead, "1", "000\r\n\r\n"+inner), HalfClose: true, Statuses: []int{400}},
		{Name: "chunk size line split across writes", Pieces: testkit.Pieces(chunkedHead, "1", "00\r\n"+body256+"\r\n0\r\n\r\n"),
			Statuses: []int{200}, Upstream: []string{"C@t1"}, Check: closes},
		{Name: "chunked, a zero chunk then a pipelined request", Pieces: testkit.Pieces(chunkedHead + "0\r\n\r\n" + post("t2", "B")),
			Statuses: []int{400}, Check: closes},
		{Name: "Content-Length and Transfer-Encoding", Pieces: testkit.Pieces(head("t1", "Content-Length: 5", "Transfer-Encoding: chunked") + "\r\n100\r\n" + body256 + "\r\n0\r\n\r\n"),
			Statuses: []int{200}, Upstream: []string{"C@t1"}, Check: closes},
		{Name: "Transfer-Encoding xchunked", Pieces: testkit.Pieces(head("t1", "Transfer-Encoding: xchunked") + "\r\n100\r\n" + body256 + "\r\n0\r\n\r\n"),
			Statuses: []int{501}},
		{Name: "bare LF after a chunk size", Pieces: testkit.Pieces(chunkedHead + "100\n" + body256 + "\r\n0\r\n\r\n"), Statuses: []int{400}},
		{Name: "conflicting Content-Lengths", Pieces: testkit.Pieces(head("t1", "Content-Length: 10", "Content-Length: 20") + "\r\n" + body("A", 20)),
			Statuses: []int{400}},
		{Name: "Expect: 100-continue", Pieces: []testkit.WirePiece{
			{Bytes: []byte(head("t1", "Expect: 100-continue", fmt.Sprintf("Content-Length: %d", len(body("E", 3000)))) + "\r\n")},
			{Bytes: []byte(body("E", 3000)), AwaitInterim: true}},
			Interim: 1, Statuses: []int{200}, Upstream: []string{"E@t1"}},
		{Name: "oversized head", Pieces: testkit.Pieces(head("t1", "X-Big: "+strings.Repeat("a", 2<<20)) + "Content-Length: 2\r\n\r\n{}"),
			Statuses: []int{431}},
		{Name: "half-closed after the head", Pieces: testkit.Pieces(head("t1", "Content-Length: 100") + "\r\n"), HalfClose: true,
			Statuses: []int{400}},
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) { wire.Check(t, c) })
	}
}
