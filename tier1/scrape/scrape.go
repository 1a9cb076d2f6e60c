// Package scrape polls model servers' Prometheus endpoints and turns what
// they report into tier1.Metrics. It understands vLLM's metric names
// (current and older releases) and SGLang's. It decides nothing about
// routing: a pod that stops answering simply keeps its last, aging scrape,
// and the scheduler's staleness rules decide what that means.
package scrape

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/meridian-router/meridian/tier1"
)

// Sample is one parsed scrape.
type Sample struct {
	Metrics tier1.Metrics
	// PrefixHits and PrefixQueries are the pod's cumulative prefix-cache
	// counters (vllm:prefix_cache_hits[_total] and ..._queries[_total]);
	// HasPrefix is false when the pod exports neither.
	PrefixHits, PrefixQueries float64
	HasPrefix                 bool
	// Flavor names the dialect recognised: "vllm", "vllm-legacy" (the
	// gpu_cache_usage_perc name) or "sglang".
	Flavor string
}

// A dialect is one model server's names for the gauges Meridian routes
// on. The first dialect whose waiting gauge a pod exports is the pod's.
type dialect struct {
	flavor           string
	waiting, running string
	// kvCache are the names of the KV-cache usage gauge, the current one
	// first; a later (deprecated) one makes the flavor flavor-legacy.
	kvCache []string
}

var dialects = []dialect{
	{"vllm", "vllm:num_requests_waiting", "vllm:num_requests_running", []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}},
	{"sglang", "sglang:num_queue_reqs", "sglang:num_running_reqs", []string{"sglang:token_usage"}},
}

// ErrNoMetrics means the exposition parsed but carried none of the metrics
// Meridian routes on: the target is probably not a model server.
var ErrNoMetrics = errors.New("no vLLM or SGLang queue metrics in the exposition")

// Parse reads a Prometheus text exposition. now stamps the result.
func Parse(r io.Reader, now time.Time) (*Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	s := &Sample{}
	m := &s.Metrics
	m.ScrapedAt = now
	found := false
	for _, d := range dialects {
		v, ok := gauge(fams, d.waiting)
		if !ok {
			continue
		}
		m.Waiting, found, s.Flavor = int(v), true, d.flavor
		if v, ok := gauge(fams, d.running); ok {
			m.Running = int(v)
		}
		for i, name := range d.kvCache {
			if v, ok := gauge(fams, name); ok {
				m.KVCacheUsage = v
				if i > 0 {
					s.Flavor += "-legacy"
				}
				break
			}
		}
		break
	}
	if !found {
		return nil, ErrNoMetrics
	}
	m.KVCacheUsage = clamp01(m.KVCacheUsage)
	loraInfo(fams["vllm:lora_requests_info"], m)
	if f := fams["vllm:cache_config_info"]; f != nil && len(f.Metric) > 0 {
		for _, lp := range f.Metric[0].Label {
			switch lp.GetName() {
			case "block_size":
				m.BlockSize, _ = strconv.Atoi(lp.GetValue())
			case "num_gpu_blocks":
				m.GPUBlocks, _ = strconv.Atoi(lp.GetValue())
			}
		}
	}
	h, okh := counter(fams, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")
	q, okq := counter(fams, "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries")
	s.PrefixHits, s.PrefixQueries, s.HasPrefix = h, q, okh && okq
	return s, nil
}

// loraInfo reads vllm:lora_requests_info: a gauge whose value is a
// timestamp; the series with the largest value is current.
func loraInfo(f *dto.MetricFamily, m *tier1.Metrics) {
	if f == nil || len(f.Metric) == 0 {
		return
	}
	var best *dto.Metric
	bestV := math.Inf(-1)
	for _, mt := range f.Metric {
		if v := value(mt); v > bestV {
			best, bestV = mt, v
		}
	}
	m.LoRAReported = true
	for _, lp := range best.Label {
		switch lp.GetName() {
		case "running_lora_adapters":
			m.RunningAdapters = splitList(lp.GetValue())
		case "waiting_lora_adapters":
			m.WaitingAdapters = splitList(lp.GetValue())
		case "max_lora":
			m.MaxLoRA, _ = strconv.Atoi(lp.GetValue())
		}
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// gauge sums a family's series (pods that serve several model names
// export one series each).
func gauge(fams map[string]*dto.MetricFamily, name string) (float64, bool) {
	f := fams[name]
	if f == nil || len(f.Metric) == 0 {
		return 0, false
	}
	sum := 0.0
	for _, mt := range f.Metric {
		sum += value(mt)
	}
	if name == "vllm:kv_cache_usage_perc" || name == "vllm:gpu_cache_usage_perc" || name == "sglang:token_usage" {
		sum /= float64(len(f.Metric)) // a fraction: average, not sum
	}
	return sum, true
}

func counter(fams map[string]*dto.MetricFamily, names ...string) (float64, bool) {
	for _, n := range names {
		if v, ok := gauge(fams, n); ok {
			return v, true
		}
	}
	return 0, false
}

func value(mt *dto.Metric) float64 {
	switch {
	case mt.Gauge != nil:
		return mt.Gauge.GetValue()
	case mt.Counter != nil:
		return mt.Counter.GetValue()
	case mt.Untyped != nil:
		return mt.Untyped.GetValue()
	}
	return 0
}

func clamp01(v float64) float64 {
	if math.IsNaN(v) || v < 0 {
		return 0
	}
	if v > 1 {
		return 1
	}
	return v
}

// ParseModels reads a server's /v1/models answer as vLLM writes it: one
// entry per served model name with its max_model_len, and one per
// registered LoRA adapter whose "parent" is the base model. It returns
// what the server can serve; MaxModelLen is the smallest given by a base
// model entry (0 when none gives one). SGLang's answer (no parent, no
// max_model_len) yields its model names only.
func ParseModels(r io.Reader) (*tier1.Capabilities, error) {
	var list struct {
		Data []struct {
			ID          string  `json:"id"`
			Root        string  `json:"root"`
			Parent      *string `json:"parent"`
			MaxModelLen int     `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(r).Decode(&list); err != nil {
		return nil, fmt.Errorf("parse /v1/models: %w", err)
	}
	c := &tier1.Capabilities{}
	for _, d := range list.Data {
		if d.ID == "" {
			continue
		}
		if d.Parent != nil && *d.Parent != "" && *d.Parent != d.ID {
			c.Adapters = append(c.Adapters, d.ID)
			continue
		}
		c.Models = append(c.Models, d.ID)
		root := d.Root
		if root == d.ID {
			root = ""
		}
		c.Roots = append(c.Roots, root)
		if d.MaxModelLen > 0 && (c.MaxModelLen == 0 || d.MaxModelLen < c.MaxModelLen) {
			c.MaxModelLen = d.MaxModelLen
		}
	}
	if len(c.Models) == 0 {
		return nil, fmt.Errorf("parse /v1/models: %w", ErrNoModels)
	}
	if !slices.ContainsFunc(c.Roots, func(r string) bool { return r != "" }) {
		c.Roots = nil // no server said more than the names
	}
	return c, nil
}

// ErrNoModels means a /v1/models answer listed no base model.
var ErrNoModels = errors.New("no base model listed")

// Config tunes scraping. The zero value is usable: each zero field takes
// the default named in its comment.
type Config struct {
	// Interval between two scrapes of a healthy pod. Shorter intervals
	// mean fresher routing inputs at the cost of pod CPU; GIE uses 50ms.
	// Zero means 50ms.
	Interval time.Duration
	// Timeout bounds one scrape. Zero means 1s.
	Timeout time.Duration
	// MaxBackoff caps the delay between attempts to a failing pod; the
	// delay doubles from Interval on each consecutive failure. Zero means 5s.
	MaxBackoff time.Duration
	// ModelsInterval is how often the pod's /v1/models (Target.ModelsURL)
	// is read again after the first success: adapters registered or
	// unloaded at run time show up within it (a 404 meanwhile is retried
	// on a fallback by the proxy). Zero means 30s.
	ModelsInterval time.Duration
	// Client performs the requests. Nil means a client with keep-alive
	// connections suited to many small polls.
	Client *http.Client
	// Now is the clock stamped on samples. Nil means time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = 50 * time.Millisecond
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.ModelsInterval <= 0 {
		c.ModelsInterval = 30 * time.Second
	}
	if c.Client == nil {
		c.Client = &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Metrics are the scraper's own Prometheus series.
type Metrics struct {
	Scrapes  *prometheus.CounterVec   // by pool, result
	Duration *prometheus.HistogramVec // by pool
}

// NewMetrics registers the scraper's series with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_tier1_scrapes_total",
			Help: "Model-server metric scrapes by pool and result (ok, error, timeout, invalid).",
		}, []string{"pool", "result"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "meridian_tier1_scrape_duration_seconds",
			Help:    "Duration of model-server metric scrapes.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"pool"}),
	}
	if reg != nil {
		reg.MustRegister(m.Scrapes, m.Duration)
	}
	return m
}

// Target is one pod to scrape.
type Target struct {
	Pool string
	// URL of the pod's metrics, e.g. http://10.0.0.7:8000/metrics.
	URL string
	// OnSample receives each successful scrape; OnError each failure.
	// Both are called from the target's own goroutine and must not block.
	OnSample func(*Sample)
	OnError  func(error)
	// ModelsURL, if set, is the pod's /v1/models, read with the first
	// successful scrape and then every Config.ModelsInterval;
	// OnCapabilities receives each answer that parses (same goroutine,
	// must not block). A failed read keeps the last answer.
	ModelsURL      string
	OnCapabilities func(*tier1.Capabilities)
}

// Run scrapes one target until ctx ends: first after a random fraction of
// the interval (so many pods are not polled in lockstep), then every
// interval, backing off on failures.
func Run(ctx context.Context, cfg Config, m *Metrics, t Target) {
	cfg = cfg.withDefaults()
	delay := time.Duration(rand.Int64N(int64(cfg.Interval)))
	failures := 0
	var modelsDue time.Time // zero: read /v1/models with the first scrape
	timer := time.NewTimer(delay)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		start := time.Now()
		s, err := scrapeOnce(ctx, cfg, t.URL)
		if ctx.Err() != nil {
			return
		}
		result := "ok"
		switch {
		case err == nil:
			failures = 0
			if t.OnSample != nil {
				t.OnSample(s)
			}
			if t.ModelsURL != "" && t.OnCapabilities != nil && !time.Now().Before(modelsDue) {
				if c, err := fetchModels(ctx, cfg, t.ModelsURL); err == nil {
					t.OnCapabilities(c)
					modelsDue = time.Now().Add(cfg.ModelsInterval)
				} else {
					modelsDue = time.Now().Add(min(cfg.ModelsInterval, cfg.MaxBackoff))
				}
			}
		case errors.Is(err, context.DeadlineExceeded):
			result = "timeout"
		case errors.Is(err, ErrNoMetrics):
			result = "invalid"
		default:
			result = "error"
		}
		if m != nil {
			m.Scrapes.WithLabelValues(t.Pool, result).Inc()
			m.Duration.WithLabelValues(t.Pool).Observe(time.Since(start).Seconds())
		}
		next := cfg.Interval
		if err != nil {
			failures++
			if t.OnError != nil {
				t.OnError(err)
			}
			next = min(cfg.MaxBackoff, cfg.Interval<<min(failures, 16))
			next = next/2 + time.Duration(rand.Int64N(int64(next/2)+1))
		}
		timer.Reset(next)
	}
}

func scrapeOnce(ctx context.Context, cfg Config, url string) (*Sample, error) {
	return get(ctx, cfg, "scrape", url, "text/plain;version=0.0.4", func(r io.Reader) (*Sample, error) {
		return Parse(io.LimitReader(r, 8<<20), cfg.Now())
	})
}

func fetchModels(ctx context.Context, cfg Config, url string) (*tier1.Capabilities, error) {
	return get(ctx, cfg, "read", url, "", func(r io.Reader) (*tier1.Capabilities, error) {
		return ParseModels(io.LimitReader(r, 4<<20))
	})
}

// get sends a GET of url (with an Accept header when accept is not "")
// bounded by cfg.Timeout and parses a 200 answer's body; another status is
// an error that says what failed (what: "scrape", "read").
func get[T any](ctx context.Context, cfg Config, what, url, accept string, parse func(io.Reader) (T, error)) (T, error) {
	var none T
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return none, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := cfg.Client.Do(req)
	if err != nil {
		return none, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return none, fmt.Errorf("%s %s: HTTP %d", what, url, resp.StatusCode)
	}
	return parse(resp.Body)
}
