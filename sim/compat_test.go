package sim

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/meridian-router/meridian/tier1/scrape"
)

// TestScrapedByTier1 checks that Tier-1's own scraper reads every metric
// dialect a live pod exposes, with a request waiting for an adapter.
func TestScrapedByTier1(t *testing.T) {
	for _, names := range []MetricNames{MetricsVLLM, MetricsVLLMLegacy, MetricsSGLang} {
		t.Run(string(names), func(t *testing.T) {
			lp := startLive(t, PodSpec{Pod: PodConfig{Adapters: []string{"sql"}, Faults: Faults{Hang: true}}, Metrics: names}, 1)[0]
			c := client(lp)
			stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
				Model: "sql", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(system)}, MaxTokens: openai.Int(2),
			})
			if err := stream.Err(); err != nil { // queued: the headers are sent
				t.Fatal(err)
			}
			resp, err := http.Get(lp.URL() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			s, err := scrape.Parse(resp.Body, time.Unix(0, 0))
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if s.Flavor != string(names) || s.Metrics.Waiting != 1 || s.Metrics.Running != 0 {
				t.Errorf("parsed %+v", s)
			}
			if names != MetricsSGLang {
				m := s.Metrics
				if !slices.Equal(m.WaitingAdapters, []string{"sql"}) || m.MaxLoRA != 4 || !m.LoRAReported ||
					m.BlockSize != 16 || m.GPUBlocks != lp.Config().Profile.NumGPUBlocks || !s.HasPrefix {
					t.Errorf("parsed %+v", s)
				}
			}
			lp.SetFaults(Faults{})
			for stream.Next() {
			}
			if err := stream.Err(); err != nil {
				t.Error(err)
			}
		})
	}
}
