package tier2

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/ratelimit"
	"github.com/meridian-router/meridian/regions"
)

// canned is a Tier-1 that answers every request with the same event
// stream, in memory: the benchmark measures Tier-2's own work.
type canned struct{ body []byte }

func (c canned) RoundTrip(r *http.Request) (*http.Response, error) {
	io.Copy(io.Discard, r.Body)
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(bytes.NewReader(c.body)), Request: r}, nil
}

func sseBody(model string, events int) []byte {
	var b strings.Builder
	for i := 0; i < events; i++ {
		b.WriteString(`data: {"choices":[{"delta":{"content":" tok"},"finish_reason":null,"index":0}],"created":1,"id":"x","model":"` + model + `","object":"chat.completion.chunk"}` + "\n\n")
	}
	b.WriteString(`data: {"choices":[],"model":"` + model + `","object":"chat.completion.chunk","usage":{"completion_tokens":16,"prompt_tokens":50,"total_tokens":66}}` + "\n\ndata: [DONE]\n\n")
	return []byte(b.String())
}

// BenchmarkServeInference is one streamed request through every stage:
// JWT verification, parsing, resolution, admission, rate limits, cluster
// choice, relaying 16 events and settling usage.
func BenchmarkServeInference(b *testing.B) {
	docs, errs := config.Decode("bench.yaml", []byte(frontDoorConfig+`---
apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: team}
spec:
  limits:
    requests: {limit: 1000000000, per: 1m}
    tokens: {limit: 1000000000000, per: 1m}
`))
	if len(errs) > 0 {
		b.Fatal(errs)
	}
	snap, err := config.Build(docs, 1)
	if err != nil {
		b.Fatal(err)
	}
	fleet, err := regions.NewFleet(regions.Config{LocalRegion: "r1", Clusters: regions.ClustersFromTopology(snap.Topology)})
	if err != nil {
		b.Fatal(err)
	}
	version := uint64(0)
	refresh := func() {
		version++
		fleet.Digests().Put(regions.Digest{Region: "r1", Cluster: "c1", Pool: "chat", Model: "chat-model", ReadyPods: 4, TotalPods: 4,
			Headroom: 1, Version: version, Produced: time.Now()})
	}
	refresh()
	lim, err := ratelimit.New(ratelimit.DefaultConfig("bench"))
	if err != nil {
		b.Fatal(err)
	}
	_, ecK, _ := newKeys(&testing.T{})
	r, err := NewRouter(Config{
		Region: "r1", Fleet: fleet, Limiter: lim, Transport: canned{sseBody("chat-model", 16)},
		Auth:     NewAuthenticator(jwtCfg, StaticKeySet(jwk(ecK)), time.Minute, nil),
		Priority: &Admission{Region: "r1", Fleet: fleet},
		Logger:   slog.New(slog.DiscardHandler),
	}, snap)
	if err != nil {
		b.Fatal(err)
	}
	claims := goodClaims()
	claims["tenant"] = "team"
	claims["iat"] = time.Now().Unix()
	claims["exp"] = time.Now().Add(time.Hour).Unix()
	delete(claims, "criticality")
	tok := "Bearer " + signB(b, ecK, claims)
	body := []byte(`{"model":"chat-model","stream":true,"max_tokens":16,"messages":[{"role":"system","content":"` +
		strings.Repeat("You are a helpful assistant. ", 20) + `"},{"role":"user","content":"hello"}]}`)
	h := r.Handler()
	refresh() // after the set-up, which takes seconds on a loaded machine
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%100 == 99 {
			refresh() // digests expire after 5 s
		}
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Authorization", tok)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatalf("status %d: %s", w.Code, w.Body.String())
		}
	}
}

func signB(b *testing.B, k testKey, claims jwt.MapClaims) string {
	tok := jwt.NewWithClaims(k.method, claims)
	tok.Header["kid"] = k.kid
	s, err := tok.SignedString(k.priv)
	if err != nil {
		b.Fatal(err)
	}
	return s
}
