package plan

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/meridian-router/meridian/internal/testkit"
)

// exporter serves, at a steady rate of requests per second since start,
// the series a Prometheus peak is read from: vLLM's prompt and output
// length histograms and Tier-1's request counter by requested model. Its
// counters follow the wall clock, so Prometheus' rate() of them is rps.
type exporter struct {
	start  time.Time
	rps    float64
	prompt []bucketShare
	output []bucketShare
	models map[string]float64 // requested model → share; "llama" is the base
}

type bucketShare struct{ le, share float64 }

var (
	promptDesc = prometheus.NewDesc("vllm:request_prompt_tokens", "Number of prefill tokens processed.", []string{"model_name"}, nil)
	outputDesc = prometheus.NewDesc("vllm:request_generation_tokens", "Number of generation tokens processed.", []string{"model_name"}, nil)
	tier1Desc  = prometheus.NewDesc("meridian_tier1_requests_total", "Requests answered.", []string{"model_name", "target_model_name", "pool", "code"}, nil)
)

func (e *exporter) Describe(ch chan<- *prometheus.Desc) {
	ch <- promptDesc
	ch <- outputDesc
	ch <- tier1Desc
}

func (e *exporter) Collect(ch chan<- prometheus.Metric) {
	n := e.rps * time.Since(e.start).Seconds()
	hist := func(d *prometheus.Desc, bs []bucketShare) {
		buckets := map[float64]uint64{}
		cum, sum := 0.0, 0.0
		lo := 0.0
		for _, b := range bs {
			cum += b.share
			buckets[b.le] = uint64(cum * n)
			sum += b.share * n * (lo + b.le) / 2
			lo = b.le
		}
		ch <- prometheus.MustNewConstHistogram(d, uint64(n), sum, buckets, "llama")
	}
	hist(promptDesc, e.prompt)
	hist(outputDesc, e.output)
	for m, s := range e.models {
		ch <- prometheus.MustNewConstMetric(tier1Desc, prometheus.CounterValue, math.Floor(s*n), m, "llama", "chat", "200")
	}
}

// TestFromPrometheus runs a real Prometheus (Debian's package; .ci/run
// installs it) scraping a local endpoint that serves the metrics, and
// plans from it: the peak rate, the length distributions and the
// adapters' shares come back as served, and a capacity plan is made from
// them.
func TestFromPrometheus(t *testing.T) {
	bin := testkit.Binary(t, "prometheus", "apt-get install prometheus")
	ex := &exporter{
		start:  time.Now(),
		rps:    20,
		prompt: []bucketShare{{100, 0}, {200, 0.2}, {500, 0.5}, {1000, 0.3}, {2000, 0}, {math.Inf(1), 0}},
		output: []bucketShare{{20, 0}, {50, 0.5}, {100, 0.5}, {200, 0}, {math.Inf(1), 0}},
		models: map[string]float64{"sql-lora": 0.6, "chat-lora": 0.3, "llama": 0.1},
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(ex)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	dir := t.TempDir()
	// Scrapes every 500 ms: the rate() ranges below span a few seconds,
	// which the test waits for.
	const scrape = 500 * time.Millisecond
	cfg := fmt.Sprintf(`global: {scrape_interval: %s, evaluation_interval: 1s}
scrape_configs:
- job_name: model-servers
  static_configs:
  - targets: [%q]
    labels: {pool: chat}
`, scrape, l.Addr().String())
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pl.Addr().String()
	pl.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait() })

	src := Prometheus{URL: "http://" + addr, Window: time.Minute, RateInterval: 2 * time.Second, Pool: "chat",
		Client: &http.Client{Timeout: 5 * time.Second}}
	// rate() is only the served rate once a whole rate interval of
	// scrapes is stored (a shorter series is divided by the whole
	// interval); poll Prometheus' API until it is (a real process on the
	// wall clock, which synctest cannot host).
	if err := src.defaults(); err != nil {
		t.Fatal(err)
	}
	// Twice the interval, so that the subquery's last aligned step has a
	// whole interval behind it too.
	full := fmt.Sprintf(`count_over_time(vllm:request_prompt_tokens_count{pool="chat"}[%s])`, promDuration(2*src.RateInterval))
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		vs, err := src.query(context.Background(), full)
		if err == nil && len(vs) == 1 && vs[0].value >= float64(2*src.RateInterval/scrape)-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus has not stored %v of scrapes in 60 s: %v %v", src.RateInterval, vs, err)
		}
		<-tick.C
	}
	peak, err := src.Peak(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("peak %.2f req/s, mean prompt %.0f, mean output %.0f", peak.RPS, peak.Prompt.Mean(), peak.Output.Mean())
	if math.Abs(peak.RPS-ex.rps)/ex.rps > 0.15 {
		t.Errorf("peak %.2f req/s, served %.0f", peak.RPS, ex.rps)
	}
	if m := peak.Prompt.Mean(); math.Abs(m-430)/430 > 0.05 {
		t.Errorf("mean prompt %.0f tokens, served 430", m)
	}
	if m := peak.Output.Mean(); math.Abs(m-55)/55 > 0.05 {
		t.Errorf("mean output %.0f tokens, served 55", m)
	}
	shares, err := src.AdapterShares(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"sql-lora": 0.6, "chat-lora": 0.3, "": 0.1} {
		if math.Abs(shares[name]-want) > 0.03 {
			t.Errorf("share of %q %.3f, served %.1f (all: %v)", name, shares[name], want, shares)
		}
	}
	// The whole command from Prometheus: a plan of a minute at the peak.
	var out bytes.Buffer
	inv := Invocation{Source: Source{Prometheus: src, Span: time.Minute}, Fleet: "../deploy/examples/fleets/uniform-h100.yaml",
		SLO: 2 * time.Second, Seed: 1, JSON: true}
	if err := inv.Capacity(context.Background(), &out); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Source string
		Plan   Trial
		Peak   float64 `json:"peak_rps"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Logf("%s: plan %s, offered %.2f req/s", got.Source, got.Plan.Label(), got.Peak)
	if !got.Plan.Met || got.Plan.Pods() < 1 || math.Abs(got.Peak-peak.RPS)/peak.RPS > 0.2 {
		t.Errorf("plan from Prometheus: %+v at %.2f req/s, want one meeting the SLO at about %.2f", got.Plan, got.Peak, peak.RPS)
	}
}
