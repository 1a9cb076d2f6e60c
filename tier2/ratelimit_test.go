package tier2

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/ratelimit"
	"github.com/meridian-router/meridian/regions"
)

// frozenLimiter is a Limiter on a fake clock, so that "no time passes"
// between two requests and retry-after can be checked to the millisecond.
func frozenLimiter(t *testing.T) (*ratelimit.Limiter, *testkit.Clock) {
	t.Helper()
	clk := testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rcfg := ratelimit.DefaultConfig("door")
	rcfg.Now = clk.Now
	lim, err := ratelimit.New(rcfg)
	if err != nil {
		t.Fatal(err)
	}
	return lim, clk
}

// usageUpstream stands in for a Tier-1 whose every answer used 300
// tokens, so that the token limits settle on a known figure.
func usageUpstream(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{"id":"cmpl-1","object":"text_completion","model":"chat-model","choices":[{"index":0,"text":"hi"}],"usage":{"prompt_tokens":1,"completion_tokens":299,"total_tokens":300}}`))
}

// TestRateLimitHeadersThroughTier2 checks issue 16's header contract on
// the real Tier-2 handler over HTTP, with the Limiter on a frozen clock:
// sequential requests read x-ratelimit-remaining-requests and -tokens
// falling at every request (the support-team case: 1200/min, burst 100,
// first answer 99, and every one of 25 requests admitted); on a 429 the
// exhausted kind reads 0 remaining, retry-after-ms and retry-after are
// when the request is admitted (refused 1 ms before, admitted at it),
// and the body is OpenAI's rate-limit error. Both for a requests limit
// and a tokens limit.
func TestRateLimitHeadersThroughTier2(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(usageUpstream))
	defer up.Close()
	lim, clk := frozenLimiter(t)
	var fleet *regions.Fleet
	d := newDoor(t, func(c *Config) { c.Limiter, fleet = lim, c.Fleet }, up.URL)
	// The cluster's digest is refreshed before every request: on a loaded
	// machine this test outlasts a digest's maximum age.
	version := uint64(1)
	fresh := func() {
		version++
		fleet.Digests().Put(regions.Digest{Region: "r1", Cluster: "c1", Pool: "chat-model", Model: "chat-model", ReadyPods: 1, TotalPods: 1,
			Headroom: 1, Version: version, Produced: time.Now()})
	}
	// As Limiter.Run would: past the warm-up with no peer heard, the lone
	// instance holds whole limits.
	clk.Advance(3 * time.Second)
	lim.Sync()

	type answer struct {
		status                 int
		req, tok, ms, secs     int64
		hasReq, hasTok, has429 bool
		body                   []byte
		hdr                    http.Header
	}
	send := func(tenant, body string) answer {
		t.Helper()
		fresh()
		resp := d.post(t, t.Context(), d.token(t, tenant, nil), "/v1/completions", body, nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		<-d.handled // settled: the next request sees this one's real usage
		a := answer{status: resp.StatusCode, body: b, hdr: resp.Header}
		num := func(k string) (int64, bool) {
			v := resp.Header.Get(k)
			if v == "" {
				return 0, false
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %q is not a number", k, v)
			}
			return n, true
		}
		a.req, a.hasReq = num("x-ratelimit-remaining-requests")
		a.tok, a.hasTok = num("x-ratelimit-remaining-tokens")
		var okMs, okS bool
		a.ms, okMs = num("retry-after-ms")
		a.secs, okS = num("retry-after")
		a.has429 = okMs && okS
		return a
	}
	const small = `{"model":"chat-model","prompt":"x","max_tokens":10}`

	// Requests: 25 sequential requests after idling are all admitted and
	// both figures fall at every one; then the limit runs dry.
	lastReq, lastTok := int64(101), int64(4_000_001)
	var a answer
	for i := 0; ; i++ {
		a = send("support", small)
		if !a.hasReq || !a.hasTok {
			t.Fatalf("request %d: status %d, rate-limit headers missing: %v", i, a.status, a.hdr)
		}
		if a.status != http.StatusOK {
			break
		}
		if i == 0 && a.req != 99 {
			t.Fatalf("first request after idling: %d requests remaining, want 99 (burst 100)", a.req)
		}
		if a.req >= lastReq || a.tok >= lastTok {
			t.Fatalf("request %d: remaining %d requests, %d tokens after %d, %d with no time passing: want both to fall", i, a.req, a.tok, lastReq, lastTok)
		}
		lastReq, lastTok = a.req, a.tok
		if i > 200 {
			t.Fatal("a burst of 100 never ran out")
		}
	}
	if lastReq != 0 {
		t.Fatalf("rejected with %d requests still remaining before it: %d %s %v", lastReq, a.status, a.body, a.hdr)
	}
	check429 := func(what string, a answer, remaining int64, kind string) {
		t.Helper()
		if a.status != http.StatusTooManyRequests || remaining != 0 || !a.has429 || a.ms <= 0 {
			t.Fatalf("%s: status %d, remaining %d, retry-after-ms %d, retry-after %d, want 429, 0 and both set: %v", what, a.status, remaining, a.ms, a.secs, a.hdr)
		}
		if a.secs != (a.ms+999)/1000 || a.hdr.Values("Retry-After")[0] != strconv.FormatInt(a.secs, 10) || len(a.hdr.Values("Retry-After")) != 1 {
			t.Fatalf("%s: retry-after %v, want one value, retry-after-ms %d rounded up to seconds", what, a.hdr.Values("Retry-After"), a.ms)
		}
		e := readErr(t, &http.Response{StatusCode: a.status, Body: io.NopCloser(bytes.NewReader(a.body))}, 429)
		if e.Error.Type != kind || e.Error.Code == nil || *e.Error.Code != "rate_limit_exceeded" {
			t.Fatalf("%s: 429 body %+v, want type %s, code rate_limit_exceeded", what, e.Error, kind)
		}
	}
	check429("requests", a, a.req, "requests")
	ms := a.ms
	// 20 a second refill one request in 50 ms (rounded up: 51 at most).
	if ms < 50 || ms > 51 {
		t.Fatalf("retry-after-ms %d on an empty 1200/min bucket, want 50", ms)
	}
	clk.Advance(time.Duration(ms-1) * time.Millisecond)
	if a := send("support", small); a.status != http.StatusTooManyRequests {
		t.Fatalf("1 ms before retry-after-ms: status %d, want 429", a.status)
	}
	clk.Advance(time.Millisecond)
	if a := send("support", small); a.status != http.StatusOK {
		t.Fatalf("at retry-after-ms: status %d %s, want 200", a.status, a.body)
	}

	// Tokens: 1000 a minute; each request is charged its estimate and
	// settled at 300. The fourth finds fewer than its estimate left.
	const big = `{"model":"chat-model","prompt":"x","max_tokens":300}`
	lastTok = 1001
	for i := 0; ; i++ {
		a = send("few-tokens", big)
		if a.hasReq || !a.hasTok {
			t.Fatalf("few-tokens request %d: headers %v, want tokens only", i, a.hdr)
		}
		if a.status != http.StatusOK {
			break
		}
		if a.tok >= lastTok {
			t.Fatalf("few-tokens request %d: %d tokens remaining after %d, want fewer", i, a.tok, lastTok)
		}
		lastTok = a.tok
		if i > 10 {
			t.Fatal("1000 tokens never ran out")
		}
	}
	check429("tokens", a, a.tok, "tokens")
	clk.Advance(time.Duration(a.ms-1) * time.Millisecond)
	if a := send("few-tokens", big); a.status != http.StatusTooManyRequests {
		t.Fatalf("tokens: 1 ms before retry-after-ms: status %d, want 429", a.status)
	}
	clk.Advance(time.Millisecond)
	if a := send("few-tokens", big); a.status != http.StatusOK {
		t.Fatalf("tokens: at retry-after-ms: status %d %s, want 200", a.status, a.body)
	}
}

// A Tier-2 without gossip is alone: once its warm-up has passed with no
// peer heard it holds every limit whole. Before it synced its Limiter
// without a gossip node, so it kept the warm-up share (InitialShare, 5%)
// for ever: 5 of support-team's burst of 100.
func TestLoneInstanceHoldsWholeLimits(t *testing.T) {
	dir := t.TempDir()
	_, ecK, _ := newKeys(t)
	b, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{jwk(ecK)}})
	if err := os.WriteFile(filepath.Join(dir, "ec.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		snap := reloadSnapshot(t, dir, `      issuer: https://auth.example.com/
      audiences: [meridian]
      jwksFile: ec.json
      requiredClaims: {present: [sub, tenant]}`, 1)
		docs, errs := config.Decode(filepath.Join(dir, "support.yaml"), []byte(`apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: support}
spec:
  limits:
    requests: {limit: 1200, per: 1m, burst: 100}
`))
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		snap.Tenants["support"] = docs[0].Value.(*config.Tenant)
		ctx, cancel := context.WithCancel(t.Context())
		in, err := NewInstance(ctx, InstanceConfig{Region: "r1", Name: "t", Logger: slog.New(slog.DiscardHandler)}, snap)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { in.Run(ctx, nil); close(done) }()
		time.Sleep(3 * time.Second) // past the 2 s warm-up, on the bubble's clock
		synctest.Wait()
		admitted := 0
		for range 100 {
			if in.Limiter.Allow(ratelimit.Request{Tenant: "support"}).Allowed {
				admitted++
			}
		}
		cancel()
		<-done
		if admitted < 99 {
			t.Fatalf("a lone Tier-2 admitted %d of a burst of 100 after 3 s, want the burst", admitted)
		}
	})
}

// TestUnservedRequestsAreRefunded: a request admitted by the rate limits
// but never served because every cluster failed before responding (503
// upstream_unavailable) gets its token estimate back, so a tenant is
// charged tokens only for what it was served; its request unit stays
// charged, since the clusters were tried and the requests limit is what
// bounds a caller flooding failing clusters. Without the refund each
// would be charged its prompt estimate.
func TestUnservedRequestsAreRefunded(t *testing.T) {
	dead := httptest.NewServer(http.HandlerFunc(usageUpstream))
	dead.Close() // connections refused: the cluster fails before responding
	lim, clk := frozenLimiter(t)
	d := newDoor(t, func(c *Config) { c.Limiter = lim }, dead.URL)
	clk.Advance(3 * time.Second)
	lim.Sync()
	post := func(tenant, body string) int {
		resp := d.post(t, t.Context(), d.token(t, tenant, nil), "/v1/completions", body, nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		<-d.handled
		if resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("status %d %s", resp.StatusCode, b)
		}
		return resp.StatusCode
	}
	const big = `{"model":"chat-model","prompt":"x","max_tokens":300}`
	for i := range 10 {
		if code := post("few-tokens", big); code != http.StatusServiceUnavailable {
			t.Fatalf("unserved request %d: status %d, want 503", i, code)
		}
	}
	if got := lim.Allow(ratelimit.Request{Tenant: "few-tokens", Model: "chat-model", Tokens: 1}); !got.Allowed || got.Tokens.Remaining != 999 {
		t.Fatalf("after 10 unserved requests: %+v, want 999 of 1000 tokens left", got.Tokens)
	}
	// The request unit stays charged: support's burst of 100 runs out.
	codes := map[int]int{}
	for range 101 {
		codes[post("support", `{"model":"chat-model","prompt":"x","max_tokens":10}`)]++
	}
	if codes[http.StatusServiceUnavailable] != 100 || codes[http.StatusTooManyRequests] != 1 {
		t.Fatalf("101 requests to failing clusters under a burst of 100: %v, want 100 × 503 and 1 × 429", codes)
	}
}
