package tier2

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/internal/trust"
	"github.com/meridian-router/meridian/ratelimit"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/request"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/simtest"
)

// door is a front door over real upstreams (simulated pods or HTTP
// servers standing in for Tier-1), with a real limiter.
type door struct {
	url     string
	r       *Router
	key     testKey
	m       *Metrics
	handled chan struct{} // one value per request the router finished
}

// doorConfig: clusters c1 (and c2 when two upstreams) serve chat-model;
// tenant "team" has ample limits, "tight" one request a minute,
// "claims-team" may call chat-model only; "support" has the example
// platform's support-team limits and "few-tokens" 1000 tokens a minute.
func doorConfig(upstreams ...string) string {
	var clusters []testkit.Cluster
	for i, u := range upstreams {
		clusters = append(clusters, testkit.Cluster{Region: "r1", Name: fmt.Sprintf("c%d", i+1), Tier1: u})
	}
	var b strings.Builder
	b.WriteString(testkit.Topology(clusters...))
	for _, c := range clusters {
		b.WriteString(testkit.Gateway("r1", c.Name) + "  bbr: {enabled: true}\n" + testkit.ChatScheduler + `  - name: other
    modelName: other-model
    modelSelector: {matchLabels: {pool: other}}
`)
	}
	b.WriteString(`---
apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: claims-team}
spec:
  models: [chat-model]
---
apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: team}
spec:
  limits:
    requests: {limit: 1000000, per: 1m}
    tokens: {limit: 1000000000, per: 1m}
---
apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: tight}
spec:
  limits:
    requests: {limit: 1, per: 1m}
---
apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: support}
spec:
  limits:
    requests: {limit: 1200, per: 1m, burst: 100}
    tokens: {limit: 4000000, per: 1m}
---
apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: few-tokens}
spec:
  limits:
    tokens: {limit: 1000, per: 1m}
`)
	return b.String()
}

func newDoor(t *testing.T, mod func(*Config), upstreams ...string) *door {
	t.Helper()
	d := newDoorRouter(t, mod, upstreams...)
	d.url = serveFront(t, d.r.Handler(), func() { d.handled <- struct{}{} })
	return d
}

// newDoorRouter is newDoor without the HTTP server (d.url is empty): for
// tests that call d.r.Handler() directly, such as inside a synctest
// bubble, where a real listener would stop the fake clock.
func newDoorRouter(t *testing.T, mod func(*Config), upstreams ...string) *door {
	t.Helper()
	snap := testkit.Snapshot(t, 1, doorConfig(upstreams...))
	_, ecK, _ := newKeys(t)
	fleet := localFleet(t, snap)
	// c1 has the most headroom, so it is tried first.
	for i := range upstreams {
		for _, model := range []string{"chat-model", "other-model"} {
			if ok, err := fleet.Digests().Put(regions.Digest{Region: "r1", Cluster: fmt.Sprintf("c%d", i+1), Pool: model, Model: model, ReadyPods: 1, TotalPods: 1,
				Headroom: float64(len(upstreams)-i) / float64(len(upstreams)), Version: 1, Produced: time.Now()}); !ok || err != nil {
				t.Fatalf("digest of c%d refused: %v", i+1, err)
			}
		}
	}
	lim, err := ratelimit.New(ratelimit.DefaultConfig("door"))
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(nil)
	cfg := Config{Region: "r1", Fleet: fleet, Limiter: lim, Metrics: m,
		Auth:   NewAuthenticator(jwtCfg, StaticKeySet(jwk(ecK)), time.Minute, nil),
		Logger: slog.New(slog.DiscardHandler)}
	if mod != nil {
		mod(&cfg)
	}
	r, err := NewRouter(cfg, snap)
	if err != nil {
		t.Fatal(err)
	}
	return &door{r: r, key: ecK, m: m, handled: make(chan struct{}, 64)}
}

func (d *door) token(t *testing.T, tenant string, edit func(jwt.MapClaims)) string {
	c := goodClaims()
	c["tenant"] = tenant
	c["iat"] = time.Now().Add(-time.Minute).Unix()
	c["exp"] = time.Now().Add(time.Hour).Unix()
	delete(c, "criticality")
	if edit != nil {
		edit(c)
	}
	return "Bearer " + sign(t, d.key, c)
}

func (d *door) post(t *testing.T, ctx context.Context, tok, path, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url+path, strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", tok)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func (d *door) charged(tenant string) float64 {
	var m dto.Metric
	d.m.charged.WithLabelValues(tenant).Write(&m)
	return m.GetCounter().GetValue()
}

type apiErr struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func readErr(t *testing.T, resp *http.Response, status int) apiErr {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, b)
	}
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("not an OpenAI error: %s", b)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Fatalf("error body lacks %q: %s", k, b)
		}
	}
	var e apiErr
	json.Unmarshal(b, &e)
	return e
}

// simTokens counts the simulator's output tokens in text: its token i is
// the i-th of these words, cyclically (sim/openai.go).
func simTokens(t *testing.T, text string) int64 {
	words := []string{" The", " sim", "ulated", " model", " is", " answering", " your", " request", "."}
	n := int64(0)
	for len(text) > 0 {
		w := words[n%int64(len(words))]
		if !strings.HasPrefix(text, w) {
			t.Fatalf("unexpected simulated text at token %d: %.20q", n, text)
		}
		text = text[len(w):]
		n++
	}
	return n
}

func startSim(t *testing.T) *sim.LivePod {
	t.Helper()
	return simtest.StartPods(t, sim.PodSpec{Pod: sim.PodConfig{Name: "p", Profile: simtest.Profile(t, "h100"), Model: "chat-model"}, TimeScale: 5}, 1)[0]
}

// A stream is charged what it delivered: the prompt plus every output
// token relayed, however it ends and whatever the body says about usage.
// On today's main each of these was charged about its prompt only.
func TestStreamChargedWhatWasDelivered(t *testing.T) {
	pod := startSim(t)
	const prompt = `"messages":[{"role":"user","content":"Tell me a long story about routers, please."}]`
	cases := []struct {
		name, body string
		stopAfter  int64 // disconnect after this many tokens (0: read to the end)
		wantUsage  bool  // the caller asked for the usage chunk
	}{
		{"no usage asked", `{"model":"chat-model","stream":true,"max_tokens":1000,` + prompt + `}`, 0, false},
		{"caller disconnects", `{"model":"chat-model","stream":true,"max_tokens":1000,` + prompt + `}`, 500, false},
		{"decoy nested include_usage", `{"model":"chat-model","stream":true,"max_tokens":1000,"x":{"include_usage":true},` + prompt + `}`, 0, false},
		{"repeated stream_options", `{"model":"chat-model","stream":true,"max_tokens":1000,"stream_options":{"include_usage":true},"stream_options":{"include_usage":false},` + prompt + `}`, 0, false},
		{"spaced include_usage keeps the usage chunk", `{"model":"chat-model","stream":true,"max_tokens":1000,"stream_options" : {"include_usage" : true},` + prompt + `}`, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDoor(t, nil, pod.URL())
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			resp := d.post(t, ctx, d.token(t, "team", nil), "/v1/chat/completions", tc.body, nil)
			if resp.StatusCode != 200 {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			var text strings.Builder
			var usage *struct{ PromptTokens, CompletionTokens, TotalTokens int64 }
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				line, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok || line == "[DONE]" {
					continue
				}
				var ev struct {
					Choices []struct {
						Delta struct{ Content string }
					}
					Usage json.RawMessage
				}
				if err := json.Unmarshal([]byte(line), &ev); err != nil {
					t.Fatalf("bad event %q: %v", line, err)
				}
				if len(ev.Choices) > 0 && ev.Usage != nil {
					t.Fatalf("per-chunk usage the caller did not ask for reached it: %s", line)
				}
				if len(ev.Choices) == 0 && ev.Usage != nil {
					usage = &struct{ PromptTokens, CompletionTokens, TotalTokens int64 }{}
					var u map[string]int64
					json.Unmarshal(ev.Usage, &u)
					usage.PromptTokens, usage.CompletionTokens, usage.TotalTokens = u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]
				}
				for _, c := range ev.Choices {
					text.WriteString(c.Delta.Content)
				}
				if tc.stopAfter > 0 && simTokens(t, text.String()) >= tc.stopAfter {
					cancel()
					break
				}
			}
			resp.Body.Close()
			<-d.handled
			delivered := simTokens(t, text.String())
			if tc.stopAfter == 0 && delivered != 1000 {
				t.Fatalf("delivered %d tokens, want 1000", delivered)
			}
			if tc.wantUsage != (usage != nil) {
				t.Fatalf("usage chunk relayed = %v, caller asked = %v", usage != nil, tc.wantUsage)
			}
			if usage != nil && usage.CompletionTokens != delivered {
				t.Fatalf("usage says %d completion tokens, %d delivered", usage.CompletionTokens, delivered)
			}
			// The prompt is 11 words of text: the simulator counts 4
			// characters a token, as Tier-2 estimates.
			promptTokens := float64(len("Tell me a long story about routers, please.")+3) / 4
			output := d.charged("team") - float64(int64(promptTokens))
			if output < float64(delivered) || output > 1.02*float64(delivered) {
				t.Fatalf("charged %.0f output tokens (total %.0f) for %d delivered: want within 2%%", output, d.charged("team"), delivered)
			}
		})
	}
}

// Parameters of the wrong type or out of range are refused with a 400
// naming the param before admission: nothing is charged (the "tight"
// tenant's one request a minute is still there afterwards).
func TestValidatedBeforeCharge(t *testing.T) {
	pod := startSim(t)
	d := newDoor(t, nil, pod.URL())
	tok := d.token(t, "tight", nil)
	for _, tc := range []struct{ body, param string }{
		{`{"model":"chat-model","prompt":"x","max_tokens":9223372036854775807}`, "max_tokens"},
		{`{"model":"chat-model","prompt":"x","max_tokens":"5"}`, "max_tokens"},
		{`{"model":"chat-model","prompt":"x","max_tokens":1.5}`, "max_tokens"},
		{`{"model":"chat-model","prompt":"x","max_tokens":-5}`, "max_tokens"},
		{`{"model":"chat-model","prompt":"x","n":1000}`, "n"},
		{`{"model":"chat-model","prompt":"x","temperature":"hot"}`, "temperature"},
		{`{"model":"chat-model","prompt":"x","top_p":2}`, "top_p"},
		{`{"model":"chat-model","prompt":"x","stream_options":{"include_usage":true}}`, "stream_options"},
	} {
		e := readErr(t, d.post(t, t.Context(), tok, "/v1/completions", tc.body, nil), 400)
		if e.Error.Param == nil || *e.Error.Param != tc.param || e.Error.Type != "invalid_request_error" {
			t.Fatalf("%s: error %+v, want param %q", tc.body, e.Error, tc.param)
		}
		<-d.handled
	}
	resp := d.post(t, t.Context(), tok, "/v1/completions", `{"model":"chat-model","prompt":"x","max_tokens":2}`, nil)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a valid request after refused ones: %d %s (were the refused ones charged?)", resp.StatusCode, b)
	}
	<-d.handled
	// The next one is over the limit: a 429 in OpenAI's shape.
	resp = d.post(t, t.Context(), tok, "/v1/completions", `{"model":"chat-model","prompt":"x","max_tokens":2}`, nil)
	e := readErr(t, resp, 429)
	if e.Error.Type != "requests" || e.Error.Code == nil || *e.Error.Code != "rate_limit_exceeded" || e.Error.Param != nil {
		t.Fatalf("429 body %+v, want type requests, code rate_limit_exceeded, param null", e.Error)
	}
	// Its rate-limit headers agree with the decision: nothing remains.
	if got := resp.Header.Get("x-ratelimit-remaining-requests"); got != "0" || resp.Header.Get("x-ratelimit-limit-requests") != "1" || resp.Header.Get("retry-after") == "" {
		t.Fatalf("429 headers: remaining %q, limit %q, retry-after %q; want 0, 1 and a retry-after", got,
			resp.Header.Get("x-ratelimit-limit-requests"), resp.Header.Get("retry-after"))
	}
}

// A token whose tenant has no Tenant object is refused, unless a default
// tenant is configured on purpose.
func TestUnknownTenantRefused(t *testing.T) {
	d := newDoor(t, nil, "http://127.0.0.1:1")
	body := `{"model":"chat-model","prompt":"x"}`
	e := readErr(t, d.post(t, t.Context(), d.token(t, "ghost", nil), "/v1/completions", body, nil), 403)
	if *e.Error.Code != "unknown_tenant" || e.Error.Type != "permission_error" {
		t.Fatalf("unknown tenant: %+v", e.Error)
	}
	req, _ := http.NewRequest(http.MethodGet, d.url+"/v1/models", nil)
	req.Header.Set("Authorization", d.token(t, "ghost", nil))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readErr(t, resp, 403)

	// With a default tenant, the unknown tenant gets its policy: here
	// claims-team's, which allows chat-model only.
	d = newDoor(t, func(c *Config) { c.DefaultTenant = "claims-team" }, "http://127.0.0.1:1")
	e = readErr(t, d.post(t, t.Context(), d.token(t, "ghost", nil), "/v1/completions", `{"model":"other-model","prompt":"x"}`, nil), 403)
	if *e.Error.Code != "model_not_allowed" {
		t.Fatalf("default tenant's allow-list not applied: %+v", e.Error)
	}
}

// recorder stands in for a Tier-1: it records what reached it and answers
// like a model server.
type recorder struct {
	mu   sync.Mutex
	hdr  http.Header
	body []byte
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rec.mu.Lock()
	rec.hdr, rec.body = r.Header.Clone(), b
	rec.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Gateway-Destination-Endpoint-Served", "10.1.2.3:8000")
	w.Write([]byte(`{"id":"cmpl-1","object":"text_completion","model":"chat-model","choices":[{"index":0,"text":"hi"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`))
}

// Headers only Meridian may set are stripped from callers; the tenant and
// band Tier-2 sends are signed; pod addresses do not reach callers.
func TestInternalHeadersStripped(t *testing.T) {
	rec := &recorder{}
	up := httptest.NewServer(rec)
	defer up.Close()
	key := bytes.Repeat([]byte("k"), 32)
	d := newDoor(t, func(c *Config) { c.Tier1Key = key }, up.URL)
	resp := d.post(t, t.Context(), d.token(t, "team", nil), "/v1/completions", `{"model":"chat-model","prompt":"x"}`, map[string]string{
		"X-Gateway-Model-Name":             "other-model",
		"X-Gateway-Base-Model-Name":        "other-model",
		"x-gateway-destination-endpoint":   "10.9.9.9:8000",
		"X-Meridian-Tenant":                "claims-team",
		"X-Meridian-Band":                  "Critical",
		"X-Meridian-Signature":             "1.forged",
		"X-Gateway-Inference-Objective":    "critical",
		"X-Gateway-Inference-Fairness-Id":  "claims-team",
		"X-Meridian-Anything-Else":         "x",
		"X-Caller-Header-Passes-Unchanged": "yes",
	})
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	<-d.handled
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if v := resp.Header.Get("X-Gateway-Destination-Endpoint-Served"); v != "" {
		t.Fatalf("pod address shown to the caller: %s", v)
	}
	rec.mu.Lock()
	got := rec.hdr
	rec.mu.Unlock()
	for k, vs := range got {
		lk := strings.ToLower(k)
		switch lk {
		case "x-meridian-tenant", "x-meridian-band", "x-meridian-signature", "x-gateway-inference-fairness-id":
			if len(vs) != 1 {
				t.Fatalf("%s reached Tier-1 %d times: %q", k, len(vs), vs)
			}
			continue
		}
		if strings.HasPrefix(lk, "x-gateway-") || strings.HasPrefix(lk, "x-meridian-") {
			t.Fatalf("caller's %s: %q reached Tier-1", k, vs)
		}
	}
	if got.Get("X-Meridian-Tenant") != "team" || got.Get("X-Gateway-Inference-Fairness-Id") != "team" || got.Get("X-Meridian-Band") != "Standard" {
		t.Fatalf("identity sent to Tier-1: %v", got)
	}
	if got.Get("X-Caller-Header-Passes-Unchanged") != "yes" {
		t.Fatal("an ordinary caller header was dropped")
	}
	if err := trust.Verify(key, got.Get(trust.Header), "team", "Standard", time.Now()); err != nil {
		t.Fatalf("signature Tier-1 would check: %v", err)
	}

	// With the debug option the pod address is shown.
	d = newDoor(t, func(c *Config) { c.ExposeUpstream = true }, up.URL)
	resp = d.post(t, t.Context(), d.token(t, "team", nil), "/v1/completions", `{"model":"chat-model","prompt":"x"}`, nil)
	resp.Body.Close()
	if resp.Header.Get("X-Gateway-Destination-Endpoint-Served") == "" {
		t.Fatal("ExposeUpstream did not show the pod address")
	}
}

// hang answers nothing until the request ends: a stopped Tier-1 or a hung
// pod.
func hang(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body) // then the server notices the request end
	<-r.Context().Done()
}

// memTier1s is an in-memory transport to Tier-1s, by URL host: a test in a
// synctest bubble cannot use sockets (a goroutine waiting on the network
// is not durably blocked, so the fake clock would stop).
type memTier1s map[string]http.Handler

func (m memTier1s) RoundTrip(req *http.Request) (*http.Response, error) {
	h, ok := m[req.URL.Host]
	if !ok {
		return nil, fmt.Errorf("memTier1s: no Tier-1 at %s", req.URL.Host)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if err := req.Context().Err(); err != nil {
		return nil, err // the attempt ended before the handler answered
	}
	return rec.Result(), nil
}

// No response headers within the timeout: the next cluster is tried, and
// when none answers the caller gets a 504. In virtual time, with the
// shipped timeouts: a non-streaming request waits out the 10-minute
// response timeout, not the 60 s header timeout of streams, and the
// cluster that answers does so at once.
func TestUpstreamHeaderTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := memTier1s{"hung": http.HandlerFunc(hang), "ok": &recorder{}}
		send := func(d *door) (*httptest.ResponseRecorder, time.Duration) {
			req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/v1/completions", strings.NewReader(`{"model":"chat-model","prompt":"x"}`))
			req.Header.Set("Authorization", d.token(t, "team", nil))
			w := httptest.NewRecorder()
			start := time.Now()
			d.r.Handler().ServeHTTP(w, req)
			return w, time.Since(start)
		}
		withTransport := func(c *Config) { c.Transport = tr }

		d := newDoorRouter(t, withTransport, "http://hung", "http://ok")
		w, took := send(d)
		if w.Code != 200 || w.Header().Get("x-meridian-cluster") != "c2" {
			t.Fatalf("status %d from %q: want 200 from c2 after c1 timed out: %s", w.Code, w.Header().Get("x-meridian-cluster"), w.Body)
		}
		if took != 10*time.Minute {
			t.Fatalf("served after %s of virtual time, want the 10 min response timeout on c1, then c2 at once", took)
		}

		d = newDoorRouter(t, withTransport, "http://hung")
		w, took = send(d)
		e := readErr(t, w.Result(), 504)
		if *e.Error.Code != "upstream_timeout" || !strings.Contains(e.Error.Message, "10m0s") {
			t.Fatalf("504 body %+v", e.Error)
		}
		if took != 10*time.Minute {
			t.Fatalf("504 after %s of virtual time, want the 10 min response timeout", took)
		}
	})
}

// A stream whose Tier-1 goes quiet ends with an error event.
func TestStreamIdleTimeout(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(`data: {"id":"c","model":"chat-model","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer up.Close()
	d := newDoor(t, func(c *Config) { c.StreamIdleTimeout = 50 * time.Millisecond }, up.URL)
	resp := d.post(t, t.Context(), d.token(t, "team", nil), "/v1/chat/completions",
		`{"model":"chat-model","stream":true,"messages":[{"role":"user","content":"x"}]}`, nil)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	<-d.handled
	if !bytes.Contains(b, []byte(`"content":"hi"`)) || !bytes.Contains(b, []byte(`"code":"stream_idle_timeout"`)) {
		t.Fatalf("stream: %s", b)
	}
	if d.charged("team") < 2 {
		t.Fatalf("charged %.0f: the relayed chunk was not counted", d.charged("team"))
	}
}

// Abort (a drain's deadline) ends open streams with an error event.
func TestAbortEndsStreamsWithErrorEvent(t *testing.T) {
	started := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(`data: {"id":"c","model":"chat-model","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n"))
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	}))
	defer up.Close()
	d := newDoor(t, nil, up.URL)
	resp := d.post(t, t.Context(), d.token(t, "team", nil), "/v1/chat/completions",
		`{"model":"chat-model","stream":true,"messages":[{"role":"user","content":"x"}]}`, nil)
	<-started
	d.r.Abort()
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(b, []byte(`"code":"shutting_down"`)) {
		t.Fatalf("stream cut without an error event: %s", b)
	}
}

// A body that does not arrive within BodyReadTimeout gets a 408; too many
// header values a 431.
func TestRequestReadLimits(t *testing.T) {
	d := newDoor(t, func(c *Config) { c.BodyReadTimeout = 50 * time.Millisecond }, "http://127.0.0.1:1")
	conn, err := net.Dial("tcp", strings.TrimPrefix(d.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nContent-Length: 1000\r\n\r\n{\"model\":", d.token(t, "team", nil))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := readErr(t, resp, 408)
	if *e.Error.Code != "request_timeout" {
		t.Fatalf("408 body %+v", e.Error)
	}

	// A body announced longer than the limit is refused before it is sent
	// (the caller waits for nothing, Tier-2 reads nothing).
	big, err := net.Dial("tcp", strings.TrimPrefix(d.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	fmt.Fprintf(big, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nContent-Length: 1000000000\r\n\r\n{\"model\":", d.token(t, "team", nil))
	if resp, err = http.ReadResponse(bufio.NewReader(big), nil); err != nil {
		t.Fatal(err)
	}
	if e := readErr(t, resp, 413); *e.Error.Code != "body_too_large" {
		t.Fatalf("413 body %+v", e.Error)
	}

	hdr := map[string]string{}
	for i := range 150 {
		hdr[fmt.Sprintf("X-Pad-%d", i)] = "x"
	}
	readErr(t, d.post(t, t.Context(), d.token(t, "team", nil), "/v1/completions", `{"model":"chat-model","prompt":"x"}`, hdr), 431)
}

// Every route but /healthz and /readyz authenticates; /v1/models lists the
// caller's models only; unrouted endpoints are 404 and not charged.
func TestRoutesAuthenticate(t *testing.T) {
	d := newDoor(t, nil, "http://127.0.0.1:1")
	get := func(path, tok string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, d.url+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for _, p := range []string{"/v1/models", "/v1/models/chat-model", "/meridian/canary", "/v1/nope"} {
		readErr(t, get(p, ""), 401)
	}
	for _, p := range []string{"/healthz"} {
		resp := get(p, "")
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s without a token: %d", p, resp.StatusCode)
		}
	}
	list := func(tenant string) []string {
		resp := get("/v1/models", d.token(t, tenant, nil))
		defer resp.Body.Close()
		var v struct{ Data []struct{ ID string } }
		json.NewDecoder(resp.Body).Decode(&v)
		var ids []string
		for _, m := range v.Data {
			ids = append(ids, m.ID)
		}
		return ids
	}
	if got := list("claims-team"); len(got) != 1 || got[0] != "chat-model" {
		t.Fatalf("claims-team sees %v, want [chat-model]", got)
	}
	if got := list("team"); len(got) != 2 {
		t.Fatalf("team sees %v, want both models", got)
	}
	readErr(t, get("/v1/models/other-model", d.token(t, "claims-team", nil)), 404)
	readErr(t, d.post(t, t.Context(), d.token(t, "team", nil), "/v1/images/generations", `{"model":"chat-model","prompt":"x"}`, nil), 404)
	if c := d.charged("team"); c != 0 {
		t.Fatalf("an unrouted endpoint was charged %.0f tokens", c)
	}
}

// An answer that reports no usage is charged the prompt's estimate, taken
// when the body was read: the prompt itself is released once the request
// is scheduled, and the charge must not fall to what a released body
// estimates (nothing).
func TestChargedPromptEstimateWithoutUsage(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id":"c","object":"chat.completion","model":"chat-model","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`))
	}))
	defer up.Close()
	d := newDoor(t, nil, up.URL)
	body := `{"model":"chat-model","messages":[{"role":"user","content":"` + strings.Repeat("long prompt ", 400) + `"}]}`
	parsed, err := request.Parse([]byte(body), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := float64(parsed.EstimateTokens())
	resp := d.post(t, t.Context(), d.token(t, "team", nil), "/v1/chat/completions", body, nil)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	<-d.handled
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if got := d.charged("team"); got != want || want < 1000 {
		t.Fatalf("charged %.0f tokens, want the prompt's estimate %.0f", got, want)
	}
}

// A caller that hangs up before its answer starts (a non-streamed request
// waits for the whole completion) stops the pod's work on it, and is
// charged its prompt only. Otherwise a caller holding a valid token could
// open long completions, hang up at once, and keep the pods generating
// for no one. The front door learns of the hang-up only by watching the
// caller's connection while it waits (net/http's background read cancels
// the request's context); a server that does not, such as fasthttp's,
// fails this test.
func TestCallerHangsUpBeforeFirstByte(t *testing.T) {
	pod := startSim(t)
	d := newDoor(t, nil, pod.URL())
	const maxTokens = 4000 // about 8 s of wall time at the pod's speed
	body := `{"model":"chat-model","max_tokens":4000,"messages":[{"role":"user","content":"Tell me a long story about routers, please."}]}`
	m := simtest.HangUp(t, pod, d.url+"/v1/chat/completions", http.Header{"Authorization": {d.token(t, "team", nil)}}, body)
	<-d.handled
	if m.GenerationTokens >= maxTokens/2 {
		t.Fatalf("the pod generated %d of %d tokens for a caller that had hung up: the hang-up did not reach it", m.GenerationTokens, maxTokens)
	}
	// Charged the prompt it had computed, not the max_tokens reserved (nor
	// nothing: the pod did compute the prompt).
	parsed, err := request.Parse([]byte(body), 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.charged("team"), float64(parsed.EstimateTokens()); got != want {
		t.Fatalf("charged %.0f tokens for a request that delivered nothing, want the prompt estimate's %.0f", got, want)
	}
}

// meridian_tier2_ttft_seconds says whether the answer streamed: a
// non-streamed answer's first byte is its last, and mixed in it would
// inflate the P99 TTFT that dashboards, CloudWatch and canary analysis read.
func TestTTFTByStream(t *testing.T) {
	pod := startSim(t)
	d := newDoor(t, nil, pod.URL())
	tok := d.token(t, "team", nil)
	for _, stream := range []string{"true", "false", "false"} {
		resp := d.post(t, t.Context(), tok, "/v1/chat/completions",
			`{"model":"chat-model","max_tokens":3,"stream":`+stream+`,"messages":[{"role":"user","content":"hi"}]}`, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		<-d.handled
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream=%s: status %d", stream, resp.StatusCode)
		}
	}
	for stream, want := range map[string]uint64{"true": 1, "false": 2} {
		var m dto.Metric
		if err := d.m.ttft.WithLabelValues("chat-model", "chat-model", stream).(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := m.GetHistogram().GetSampleCount(); got != want {
			t.Errorf("stream=%q: %d observations, want %d", stream, got, want)
		}
	}
}

// What a caller sees of a Tier-1's response headers, on both front doors,
// for a whole response and a stream, on a token's first request (served
// on a goroutine) and its later ones (on the event loop when that is the
// front door): every header once, the Tier-1's own (several values of a
// key in order, its Date and Content-Type) passed on, Tier-2's rate-limit
// and cluster headers in place of any a Tier-1 sends, and neither the
// pod's address nor the Tier-1 hop's Keep-Alive.
func TestResponseHeadersPassedBack(t *testing.T) {
	const date = "Sat, 05 Dec 2026 04:00:00 GMT"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h := w.Header()
		h.Set("Date", date)
		h.Add("X-A", "1")
		h.Add("X-A", "2")
		h.Set("X-Ratelimit-Remaining-Requests", "12345")
		h.Set("X-Meridian-Region", "spoofed")
		h.Set("X-Gateway-Destination-Endpoint-Served", "10.0.0.9:8000")
		h.Set("Keep-Alive", "timeout=5")
		if strings.Contains(r.URL.Path, "chat") {
			h.Set("Content-Type", "text/event-stream")
			w.Write([]byte(`data: {"id":"c","model":"chat-model","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\ndata: [DONE]\n\n"))
			return
		}
		usageUpstream(w, r)
	}))
	defer up.Close()
	d := newDoor(t, nil, up.URL)
	tok := d.token(t, "team", nil)
	for i := range 4 {
		path, body, ctype := "/v1/completions", `{"model":"chat-model","prompt":"x","max_tokens":2}`, "application/json"
		if i%2 == 1 {
			path, body, ctype = "/v1/chat/completions", `{"model":"chat-model","stream":true,"messages":[{"role":"user","content":"x"}]}`, "text/event-stream"
		}
		resp := d.post(t, t.Context(), tok, path, body, nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		<-d.handled
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		h := resp.Header
		for k, want := range map[string][]string{"Date": {date}, "Content-Type": {ctype}, "X-A": {"1", "2"}, "X-Meridian-Region": {"r1"}, "X-Meridian-Cluster": {"c1"}} {
			if !slices.Equal(h[k], want) {
				t.Errorf("request %d: %s %q; want %q", i, k, h[k], want)
			}
		}
		if v := h["X-Ratelimit-Remaining-Requests"]; len(v) != 1 || v[0] == "12345" {
			t.Errorf("request %d: X-Ratelimit-Remaining-Requests %q; want Tier-2's one value", i, v)
		}
		if len(h["X-Ratelimit-Limit-Requests"]) != 1 {
			t.Errorf("request %d: X-Ratelimit-Limit-Requests %q; want one", i, h["X-Ratelimit-Limit-Requests"])
		}
		for _, k := range []string{"X-Gateway-Destination-Endpoint-Served", "Keep-Alive"} {
			if v, ok := h[k]; ok {
				t.Errorf("request %d: %s %q passed on", i, k, v)
			}
		}
	}
}
