package platform_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	promcfg "github.com/meridian-router/meridian/deploy/prometheus"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/platform/platformtest"
)

// TestPrometheusPanels runs a real Prometheus (Debian's package, installed
// by .ci/run) against the local platform and evaluates the seed's panels
// through its HTTP API: each must return one plausible series per model or
// pool.
func TestPrometheusPanels(t *testing.T) {
	t.Parallel() // its own platform on its own ports; mostly waiting on the network
	bin := testkit.Binary(t, "prometheus", "apt-get install prometheus")
	p := platformtest.Start(t, nil)

	var targets promcfg.LocalTargets
	for _, m := range p.Metrics {
		switch m.Labels["job"] {
		case "model-servers":
			targets.ModelServers = append(targets.ModelServers, promcfg.TargetGroup{Targets: []string{m.Addr},
				Labels: map[string]string{"pool": m.Labels["pool"], "cluster": m.Labels["cluster"], "region": m.Labels["region"]}})
		default:
			labels := map[string]string{"tier": m.Labels["job"], "region": m.Labels["region"]}
			if c := m.Labels["cluster"]; c != "" {
				labels["cluster"] = c
			}
			targets.Meridian = append(targets.Meridian, promcfg.TargetGroup{Targets: []string{m.Addr}, Labels: labels})
		}
	}
	dir := t.TempDir()
	cfgPath, err := promcfg.WriteLocal(dir, targets)
	if err != nil {
		t.Fatal(err)
	}
	addr := platformtest.FreePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config.file="+cfgPath, "--storage.tsdb.path="+dir+"/data",
		"--web.listen-address="+addr, "--log.level=warn")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait() })

	query := func(q string) (map[string]float64, error) {
		resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var out struct {
			Status string
			Data   struct {
				Result []struct {
					Metric map[string]string
					Value  [2]any
				}
			}
			Error string
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return nil, err
		}
		if out.Status != "success" {
			return nil, fmt.Errorf("query %s: %s", q, out.Error)
		}
		series := map[string]float64{}
		for _, r := range out.Data.Result {
			v, _ := strconv.ParseFloat(fmt.Sprint(r.Value[1]), 64)
			key := fmt.Sprint(r.Metric)
			series[key] = v
		}
		return series, nil
	}
	// Prometheus must be scraping every target before the traffic, or the
	// counters' increase (and so every rate) would be zero.
	testkit.Eventually(t, "Prometheus scraping every target", func() bool {
		up, err := query("up == 1")
		return err == nil && len(up) == len(p.Metrics)
	})
	// Traffic spread over several scrapes: every model, and a tenant over
	// its limit for 429s.
	us := platformtest.Client(p, "us-east-1", p.Token)
	tiny := platformtest.Client(p, "us-east-1", platformtest.Token(t, p, "tiny"))
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := range 40 {
		model := []string{"fast", "chat-v1", "chat-v2", "chat"}[i%4]
		if _, err := us.Chat.Completions.New(context.Background(), platformtest.Ask(model)); err != nil {
			t.Fatalf("traffic: %v", err)
		}
		tiny.Chat.Completions.New(context.Background(), platformtest.Ask("fast")) // 2 per hour: the rest are 429s
		<-tick.C                                                                  // pace the traffic over about 4 scrape intervals
	}
	cases := []struct {
		name, expr string
		label      string
		want       []string // label values that must each have a series
		lo, hi     float64
	}{
		{"P99 TTFT per model on the pods", "histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[5m])))",
			"model_name", []string{"fast", "chat-v1", "chat-v2"}, 0, 60},
		{"P99 TTFT per model at Tier-1", "histogram_quantile(0.99, sum by (le, model_name) (rate(meridian_tier1_ttft_seconds_bucket[5m])))",
			"model_name", []string{"fast", "chat-v1", "chat-v2"}, 0, 60},
		{"P99 TTFT per model at Tier-2", "histogram_quantile(0.99, sum by (le, model_name) (rate(meridian_tier2_ttft_seconds_bucket[5m])))",
			"model_name", []string{"fast", "chat"}, 0, 60},
		{"queue spread per pool", "max by (pool) (vllm:num_requests_waiting) - min by (pool) (vllm:num_requests_waiting)",
			"pool", []string{"fast", "chat", "chat-next"}, 0, 1000},
		{"prefix-cache hit ratio per pool", "sum by (pool) (rate(vllm:prefix_cache_hits_total[5m])) / sum by (pool) (rate(vllm:prefix_cache_queries_total[5m]))",
			"pool", []string{"fast", "chat", "chat-next"}, 0, 1},
		{"429 rate per band and tenant at Tier-2", `sum by (band, tenant) (rate(meridian_tier2_rejected_total{reason=~"rate_limit_requests|rate_limit_tokens|shed|queue_full|queue_timeout"}[5m]))`,
			"tenant", []string{"tiny"}, 1e-9, 1e6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var last map[string]float64
			var lastErr error
			testkit.Eventually(t, "a series per "+tc.label+" for "+tc.expr, func() bool {
				last, lastErr = query(tc.expr)
				if lastErr != nil {
					return false
				}
				for _, w := range tc.want {
					found := false
					for k, v := range last {
						if containsLabel(k, tc.label, w) && !math.IsNaN(v) && !math.IsInf(v, 0) && v >= tc.lo && v <= tc.hi {
							found = true
						}
					}
					if !found {
						return false
					}
				}
				return true
			})
			t.Logf("%s: %v", tc.name, last)
		})
	}
	// The shipped recording rules evaluate on the same data.
	testkit.Eventually(t, "recording rule pool:vllm_num_requests_waiting:spread", func() bool {
		s, err := query("pool:vllm_num_requests_waiting:spread")
		return err == nil && len(s) >= 3
	})
}

// containsLabel reports whether a metric printed as map[k:v ...] has
// label=value.
func containsLabel(metric, label, value string) bool {
	return strings.Contains(metric, label+":"+value+" ") || strings.Contains(metric, label+":"+value+"]")
}
