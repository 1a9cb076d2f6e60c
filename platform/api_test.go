package platform_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/platform"
	"github.com/meridian-router/meridian/platform/platformtest"
	"github.com/meridian-router/meridian/request"
)

// chargedTokens is a Region's Tier-2's meridian_tier2_charged_tokens_total
// for tenant, scraped from its metrics listener.
func chargedTokens(t *testing.T, p *platform.Platform, region, tenant string) float64 {
	t.Helper()
	for _, m := range p.Metrics {
		if m.Labels["job"] != "meridian-tier2" || m.Labels["region"] != region {
			continue
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.Addr+"/metrics", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range fams["meridian_tier2_charged_tokens_total"].GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "tenant" && l.GetValue() == tenant {
					return s.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	t.Fatalf("no Tier-2 metrics target for %s", region)
	return 0
}

// TestOpenAIEmbeddingsAndResponses: the OpenAI SDK calls /v1/embeddings
// and /v1/responses (whole and streamed) through the local platform; each
// answer carries x-request-id, and the tenant is charged exactly the
// usage the answers report.
func TestOpenAIEmbeddingsAndResponses(t *testing.T) {
	p := platformtest.Start(t, nil)
	const region = "us-east-1"
	c := platformtest.Client(p, region, platformtest.Token(t, p, "team-a"))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	before := chargedTokens(t, p, region, "team-a")

	var raw *http.Response
	emb, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "fast",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{strings.Repeat("abcd", 25), "abcd"}}},
		option.WithResponseInto(&raw), option.WithHeader("X-Request-Id", "sdk-embeddings-1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(emb.Data) != 2 || len(emb.Data[0].Embedding) == 0 || emb.Usage.PromptTokens != 26 || emb.Model != "fast" {
		t.Fatalf("embeddings: %d vectors, usage %+v, model %q", len(emb.Data), emb.Usage, emb.Model)
	}
	if id := raw.Header.Get("X-Request-Id"); id != "sdk-embeddings-1" {
		t.Errorf("embeddings x-request-id %q, want the caller's", id)
	}

	params := responses.ResponseNewParams{Model: "fast", Instructions: openai.String("Answer briefly."), MaxOutputTokens: openai.Int(5),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("What is a router?")}}
	res, err := c.Responses.New(ctx, params, option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != "completed" || res.Usage.OutputTokens != 5 || res.OutputText() == "" || res.Model != "fast" {
		t.Fatalf("response %s, usage %+v, %q", res.Status, res.Usage, res.OutputText())
	}
	if id := raw.Header.Get("X-Request-Id"); !request.ValidID(id) {
		t.Errorf("responses x-request-id %q", id)
	}

	stream := c.Responses.NewStreaming(ctx, params)
	var text strings.Builder
	var final responses.Response
	var last string
	for stream.Next() {
		ev := stream.Current()
		last = ev.Type
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed":
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if last != "response.completed" || final.Usage.OutputTokens != 5 || final.OutputText() != text.String() || final.Model != "fast" {
		t.Fatalf("stream ended with %q, usage %+v, text %q vs %q", last, final.Usage, text.String(), final.OutputText())
	}

	want := before + float64(emb.Usage.TotalTokens+res.Usage.TotalTokens+final.Usage.TotalTokens)
	testkit.Eventually(t, "team-a charged the usage of the three answers", func() bool {
		return chargedTokens(t, p, region, "team-a") == want
	})
}

// TestCriticalToken: the platform signs a Critical token for a tenant
// whose maxBand allows it and refuses one for a tenant whose does not,
// naming the tenant's maxBand.
func TestCriticalToken(t *testing.T) {
	p := platformtest.Start(t, nil)
	if _, err := p.SignBand("team-a", "critical"); err != nil {
		t.Errorf("team-a (maxBand Critical): %v", err)
	}
	_, err := p.SignBand("prompt-a", "Critical")
	if err == nil || !strings.Contains(err.Error(), "at most Standard") {
		t.Errorf("prompt-a (maxBand Standard): %v, want a refusal naming its maxBand", err)
	}
	if _, err := p.SignBand("team-a", "urgent"); err == nil {
		t.Error("an unknown band was signed")
	}
}

// TestCriticalTokenRefusedAtStart: `meridian up --tenant claims-team
// --criticality critical` stops before anything starts, with a usage
// error naming the tenant's maxBand (claims-team's is Standard).
func TestCriticalTokenRefusedAtStart(t *testing.T) {
	_, err := platform.Start(t.Context(), platform.Config{Tenant: "claims-team", Criticality: "critical", Ports: platform.PortsAuto}, slog.New(slog.DiscardHandler))
	if !errors.Is(err, platform.ErrUsage) || !strings.Contains(err.Error(), `tenant "claims-team" may claim at most Standard`) {
		t.Fatalf("got %v, want a usage error naming claims-team's maxBand", err)
	}
}
