package tier2

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/ratelimit"
	"github.com/meridian-router/meridian/regions"
)

// canned is a Tier-1 that answers every request with the same event
// stream, in memory: the benchmark measures Tier-2's own work. A request
// that asks for vLLM's continuous_usage_stats gets usage in every chunk,
// as the simulator (and vLLM) sends it.
type canned struct{ body, continuous []byte }

func newCanned(model string, events int) canned {
	return canned{sseBody(model, events), sseBodyUsage(model, events, true)}
}

func (c canned) RoundTrip(r *http.Request) (*http.Response, error) {
	var sb strings.Builder
	io.Copy(&sb, r.Body)
	body := c.body
	if c.continuous != nil && strings.Contains(sb.String(), `"continuous_usage_stats":true`) {
		body = c.continuous
	}
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(bytes.NewReader(body)), Request: r}, nil
}

func sseBody(model string, events int) []byte { return sseBodyUsage(model, events, false) }

// sseBodyUsage is a stream of events one-token chunks and the final usage
// chunk; with continuous, every chunk carries the usage so far.
func sseBodyUsage(model string, events int, continuous bool) []byte {
	var b strings.Builder
	for i := 0; i < events; i++ {
		usage := ""
		if continuous {
			usage = fmt.Sprintf(`,"usage":{"completion_tokens":%d,"prompt_tokens":50,"total_tokens":%d}`, i+1, 51+i)
		}
		b.WriteString(`data: {"choices":[{"delta":{"content":" tok"},"finish_reason":null,"index":0}],"created":1,"id":"x","model":"` + model + `","object":"chat.completion.chunk"` + usage + "}\n\n")
	}
	b.WriteString(`data: {"choices":[],"model":"` + model + `","object":"chat.completion.chunk","usage":{"completion_tokens":16,"prompt_tokens":50,"total_tokens":66}}` + "\n\ndata: [DONE]\n\n")
	return []byte(b.String())
}

// inferenceFixture is a Router with every stage on (JWT verification,
// admission, rate limits, cluster choice) in front of a canned Tier-1.
type inferenceFixture struct {
	r       *Router
	h       http.Handler
	tok     string
	refresh func()
	last    time.Time
}

func newInferenceFixture(tb testing.TB) *inferenceFixture {
	return newInferenceFixtureUpstream(tb, "")
}

// newInferenceFixtureUpstream is newInferenceFixture forwarding to the
// Tier-1 at url over the shipped transport ("": the canned one).
func newInferenceFixtureUpstream(tb testing.TB, url string) *inferenceFixture {
	tier1 := url
	if tier1 == "" {
		tier1 = noTier1
	}
	snap := testkit.Snapshot(tb, 1, frontDoorConfig(tier1)+testkit.Tenant("team")+`spec:
  limits:
    requests: {limit: 1000000000, per: 1m}
    tokens: {limit: 1000000000000, per: 1m}
`)
	fleet := localFleet(tb, snap)
	f := &inferenceFixture{}
	version := uint64(0)
	f.refresh = func() {
		version++
		f.last = time.Now()
		fleet.Digests().Put(regions.Digest{Region: "r1", Cluster: "c1", Pool: "chat", Model: "chat-model", ReadyPods: 4, TotalPods: 4,
			Headroom: 1, Version: version, Produced: f.last})
	}
	f.refresh()
	lim, err := ratelimit.New(ratelimit.DefaultConfig("bench"))
	if err != nil {
		tb.Fatal(err)
	}
	_, ecK, _ := newKeys(&testing.T{})
	var tr http.RoundTripper = newCanned("chat-model", 16)
	if url != "" {
		tr = nil // NewTransport()
	}
	r, err := NewRouter(Config{
		Region: "r1", Fleet: fleet, Limiter: lim, Transport: tr,
		Auth:     NewAuthenticator(jwtCfg, StaticKeySet(jwk(ecK)), time.Minute, nil),
		Priority: &Admission{Region: "r1", Fleet: fleet},
		Logger:   slog.New(slog.DiscardHandler),
	}, snap)
	if err != nil {
		tb.Fatal(err)
	}
	claims := goodClaims()
	claims["tenant"] = "team"
	claims["iat"] = time.Now().Unix()
	claims["exp"] = time.Now().Add(time.Hour).Unix()
	delete(claims, "criticality")
	tok := jwt.NewWithClaims(ecK.method, claims)
	tok.Header["kid"] = ecK.kid
	s, err := tok.SignedString(ecK.priv)
	if err != nil {
		tb.Fatal(err)
	}
	f.tok, f.r, f.h = "Bearer "+s, r, r.Handler()
	return f
}

// chatBody is a streamed chat request whose user message makes the body
// about size bytes (at least ~700: a 600-byte system prompt).
func chatBody(size int) []byte {
	head := `{"model":"chat-model","stream":true,"max_tokens":16,"messages":[{"role":"system","content":"` +
		strings.Repeat("You are a helpful assistant. ", 20) + `"},{"role":"user","content":"`
	tail := `"}]}`
	user := "hello"
	if n := size - len(head) - len(tail); n > len(user) {
		user = strings.Repeat("The quick brown fox jumps over the lazy dog. ", n/45+1)[:n]
	}
	return []byte(head + user + tail)
}

// serve runs one request through the handler and fails unless it is
// relayed whole.
func (f *inferenceFixture) serve(tb testing.TB, body []byte) {
	if time.Since(f.last) > time.Second {
		f.refresh() // digests expire after 5 s
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", f.tok)
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, req)
	if w.Code != 200 || !bytes.HasSuffix(w.Body.Bytes(), []byte("data: [DONE]\n\n")) {
		tb.Fatalf("status %d: %s", w.Code, w.Body.String())
	}
}

// BenchmarkServeInference is one streamed request through every stage:
// JWT verification, parsing, validation, resolution, admission, rate
// limits, cluster choice, relaying 16 events and settling usage; with a
// short prompt and with a 225,280-byte one.
func BenchmarkServeInference(b *testing.B) {
	for _, size := range []int{700, 225280} {
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			f := newInferenceFixture(b)
			body := chatBody(size)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				f.serve(b, body)
			}
		})
	}
}

// serveInferenceAllocs is the allocation budget of one streamed request
// through Router.Handler (the stages, the relay of 16 events and the
// test's own request and recorder, and the canned upstream reading the
// body to see whether usage is asked for in every chunk), short prompt and
// 225 KB prompt: BenchmarkServeInference's figures when the budget was
// set. The short prompt's edited body is joined into one buffer (one
// allocation, which saves three writes to the Tier-1: sendBody.joined).
// 75 and 75 before the rate-limit headers were formatted into one string
// and the cached caller shared, 68 and 69 after. A change that allocates
// more per request fails TestServeInferenceAllocs.
var serveInferenceAllocs = map[int]float64{700: 70, 225280: 71}

func TestServeInferenceAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	f := newInferenceFixture(t)
	checkAllocs(t, serveInferenceAllocs, func(size int) func() {
		body := chatBody(size)
		f.serve(t, body) // warm the token cache and the pools
		return func() { f.serve(t, body) }
	})
}

// checkAllocs fails when a request of any size in budgets allocates more
// than its budget; prepare warms a size up and returns one request of it.
func checkAllocs(t *testing.T, budgets map[int]float64, prepare func(size int) func()) {
	t.Helper()
	for size, budget := range budgets {
		got := testkit.AllocsPerRun(200, prepare(size))
		t.Logf("%d-byte body: %.1f allocations per request (budget %.0f)", size, got, budget)
		if got > budget {
			t.Errorf("%d-byte body: %.1f allocations per request, budget %.0f", size, got, budget)
		}
	}
}

// BenchmarkServeInferenceHTTP is BenchmarkServeInference over loopback
// HTTP: a real client, Tier-2's handler in an http.Server, and an upstream
// http.Server streaming the 16 events (each flushed, as a model server
// does) through the shipped transport. cpu-ns/op is the process's CPU
// time per request (client and upstream included).
func BenchmarkServeInferenceHTTP(b *testing.B) {
	c := newCanned("chat-model", 16)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var sb strings.Builder
		io.Copy(&sb, r.Body)
		events := c.body
		if strings.Contains(sb.String(), `"continuous_usage_stats":true`) {
			events = c.continuous
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for rest := events; len(rest) > 0; {
			i := bytes.Index(rest, []byte("\n\n")) + 2
			w.Write(rest[:i])
			fl.Flush()
			rest = rest[i:]
		}
	}))
	defer up.Close()
	f := newInferenceFixtureUpstream(b, up.URL)
	front := httptest.NewServer(f.h)
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
	body := chatBody(700)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // digests expire after 5 s
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				f.refresh()
			}
		}
	}()
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 32<<10)
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodPost, front.URL+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Authorization", f.tok)
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			for {
				if _, err := resp.Body.Read(buf); err != nil {
					break
				}
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}
