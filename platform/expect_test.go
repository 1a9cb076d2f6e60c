package platform_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/platform"
	"github.com/meridian-router/meridian/platform/platformtest"
)

// A request with Expect: 100-continue (what curl sends for a body over
// 1 KB) through the local platform: the front door answers 100 itself,
// the request is served once and charged once. Tier-1 was once sent the
// header, and its own 100 failed every attempt: 503, clusters ejected,
// the request still charged.
func TestExpectContinueThroughPlatform(t *testing.T) {
	p := platformtest.Start(t, nil)
	token := platformtest.Token(t, p, "tiny") // two requests an hour
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: 30 * time.Second}}
	body := `{"model":"fast","max_tokens":3,"messages":[{"role":"user","content":"` + strings.Repeat("x", 3000) + `"}]}`
	send := func(expect bool) (int, int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, p.Endpoints["us-east-1"]+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		interim := 0
		if expect {
			req.Header.Set("Expect", "100-continue")
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{Got100Continue: func() { interim++ }}))
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, interim, string(b)
	}
	code, interim, b := send(true)
	if code != 200 || interim != 1 {
		t.Fatalf("with Expect: 100-continue: status %d after %d interim responses, want 200 after 1: %s", code, interim, b)
	}
	var served struct {
		Usage struct {
			TotalTokens float64 `json:"total_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(b), &served); err != nil || served.Usage.TotalTokens == 0 {
		t.Fatalf("no usage in the answer: %s", b)
	}
	// Charged = served, once: the Tier-2's charged tokens are the usage
	// of the one answer, and it counted one request and no retry.
	g := testkit.Scraped(tier2Metrics(t, p, "us-east-1"))
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"meridian_tier2_charged_tokens_total", map[string]string{"tenant": "tiny"}, served.Usage.TotalTokens},
		{"meridian_tier2_requests_total", map[string]string{"model_name": "fast", "code": "200"}, 1},
		{"meridian_tier2_retries_total", nil, 0},
	} {
		if got := testkit.Metric(t, g, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}
}

// tier2Metrics is the metrics address of region's Tier-2.
func tier2Metrics(t *testing.T, p *platform.Platform, region string) string {
	t.Helper()
	for _, m := range p.Metrics {
		if m.Labels["job"] == "meridian-tier2" && m.Labels["region"] == region {
			return m.Addr
		}
	}
	t.Fatalf("no Tier-2 metrics target for %s", region)
	return ""
}
