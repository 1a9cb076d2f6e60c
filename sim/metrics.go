package sim

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricNames selects which model server's metric names a live pod exposes,
// so scrapers can be tested on each variant.
type MetricNames string

const (
	// MetricsVLLM is current vLLM (V1 engine): vllm:kv_cache_usage_perc.
	MetricsVLLM MetricNames = "vllm"
	// MetricsVLLMLegacy is vLLM before the V1 engine renamed the KV gauge:
	// vllm:gpu_cache_usage_perc.
	MetricsVLLMLegacy MetricNames = "vllm-legacy"
	// MetricsSGLang is SGLang: sglang:num_queue_reqs, sglang:num_running_reqs,
	// sglang:token_usage.
	MetricsSGLang MetricNames = "sglang"
)

// ParseMetricNames accepts "vllm", "vllm-legacy" or "sglang"; "" means vllm.
func ParseMetricNames(s string) (MetricNames, error) {
	switch MetricNames(s) {
	case "", MetricsVLLM:
		return MetricsVLLM, nil
	case MetricsVLLMLegacy, MetricsSGLang:
		return MetricNames(s), nil
	}
	return "", fmt.Errorf("sim: unknown metric names %q (want vllm, vllm-legacy or sglang)", s)
}

// Histogram buckets as vLLM defines them (vllm/v1/metrics/loggers.py).
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	tpotBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
)

// tokenBuckets are vLLM's 1-2-5 buckets up to the max model length
// (build_1_2_5_buckets in vllm/v1/metrics/loggers.py).
func tokenBuckets(maxLen int) []float64 {
	var out []float64
	for exp := 1.0; ; exp *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := m * exp; v <= float64(maxLen) {
				out = append(out, v)
			} else {
				return out
			}
		}
	}
}

// podCollector exposes a live pod's state, read at scrape time, plus its
// latency histograms.
type podCollector struct {
	lp    *LivePod
	names MetricNames

	waiting, running, kvUsage, loraInfo, cacheInfo *prometheus.Desc
	hits, queries, promptTokens, genTokens         *prometheus.Desc
	preemptions, hitRate                           *prometheus.Desc
	ttft, e2e, tpot                                *prometheus.HistogramVec
	promptLen, outputLen                           *prometheus.HistogramVec
	model                                          string
}

func newPodCollector(lp *LivePod, names MetricNames, constLabels prometheus.Labels) *podCollector {
	prefix := "vllm:"
	if names == MetricsSGLang {
		prefix = "sglang:"
	}
	model := []string{"model_name"}
	desc := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(prefix+name, help, labels, constLabels)
	}
	hist := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: prefix + name, Help: help, Buckets: buckets, ConstLabels: constLabels,
		}, model)
	}
	c := &podCollector{lp: lp, names: names, model: lp.pod.Model()}
	switch names {
	case MetricsSGLang:
		c.waiting = desc("num_queue_reqs", "Number of requests in the waiting queue.", model)
		c.running = desc("num_running_reqs", "Number of running requests.", model)
		c.kvUsage = desc("token_usage", "Fraction of KV cache tokens in use.", model)
		c.hitRate = desc("cache_hit_rate", "Prefix cache hit rate (tokens).", model)
	default:
		c.waiting = desc("num_requests_waiting", "Number of requests waiting to be processed.", model)
		c.running = desc("num_requests_running", "Number of requests in model execution batches.", model)
		kv := "kv_cache_usage_perc"
		if names == MetricsVLLMLegacy {
			kv = "gpu_cache_usage_perc"
		}
		c.kvUsage = desc(kv, "KV-cache usage. 1 means 100 percent usage.", model)
		c.loraInfo = desc("lora_requests_info", "Running stats on lora requests.",
			[]string{"max_lora", "waiting_lora_adapters", "running_lora_adapters"})
		c.cacheInfo = desc("cache_config_info", "Information of the LLMEngine CacheConfig.",
			[]string{"block_size", "num_gpu_blocks", "enable_prefix_caching", "gpu_memory_utilization", "cache_dtype"})
		c.hits = desc("prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", model)
		c.queries = desc("prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", model)
		c.preemptions = desc("num_preemptions_total", "Cumulative number of preemptions from the engine.", model)
	}
	c.promptTokens = desc("prompt_tokens_total", "Number of prefill tokens processed.", model)
	c.genTokens = desc("generation_tokens_total", "Number of generation tokens processed.", model)
	c.ttft = hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets)
	c.e2e = hist("e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", e2eBuckets)
	c.tpot = hist("time_per_output_token_seconds", "Histogram of time per output token in seconds.", tpotBuckets)
	// Request lengths, as vLLM observes them for every finished request
	// (vllm:request_prompt_tokens, vllm:request_generation_tokens):
	// `meridian plan --from-prometheus` reads its length distributions
	// and peak rate from them.
	lenBuckets := tokenBuckets(lp.pod.cfg.Profile.MaxModelLen)
	c.promptLen = hist("request_prompt_tokens", "Number of prefill tokens processed.", lenBuckets)
	c.outputLen = hist("request_generation_tokens", "Number of generation tokens processed.", lenBuckets)
	// Expose empty histograms from the start, as vLLM does.
	c.promptLen.WithLabelValues(c.model)
	c.outputLen.WithLabelValues(c.model)
	c.ttft.WithLabelValues(c.model)
	c.e2e.WithLabelValues(c.model)
	c.tpot.WithLabelValues(c.model)
	return c
}

// observe records a finished request's latencies in model time.
func (c *podCollector) observe(o *Outcome) {
	if o.Err != nil {
		return
	}
	if ttft := o.TTFT(); ttft >= 0 {
		c.ttft.WithLabelValues(c.model).Observe(ttft.Seconds())
	}
	c.e2e.WithLabelValues(c.model).Observe((o.Finish - o.Arrival).Seconds())
	c.promptLen.WithLabelValues(c.model).Observe(float64(o.Request.PromptTokens))
	c.outputLen.WithLabelValues(c.model).Observe(float64(o.OutputTokens))
	if o.OutputTokens > 1 {
		c.tpot.WithLabelValues(c.model).Observe((o.Finish - o.FirstToken).Seconds() / float64(o.OutputTokens-1))
	}
}

func (c *podCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.waiting, c.running, c.kvUsage, c.loraInfo, c.cacheInfo,
		c.hits, c.queries, c.promptTokens, c.genTokens, c.preemptions, c.hitRate} {
		if d != nil {
			ch <- d
		}
	}
	c.ttft.Describe(ch)
	c.e2e.Describe(ch)
	c.tpot.Describe(ch)
	c.promptLen.Describe(ch)
	c.outputLen.Describe(ch)
}

func (c *podCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.lp.Metrics()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		if d != nil {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
	}
	counter := func(d *prometheus.Desc, v uint64) {
		if d != nil {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), c.model)
		}
	}
	gauge(c.waiting, float64(m.Waiting), c.model)
	gauge(c.running, float64(m.Running), c.model)
	gauge(c.kvUsage, m.KVCacheUsage, c.model)
	// vLLM sets the info gauge to the time of the update; scrapers take the
	// series with the largest value.
	gauge(c.loraInfo, float64(time.Now().UnixNano())/1e9,
		strconv.Itoa(m.MaxLoRA), strings.Join(m.WaitingAdapters, ","), strings.Join(m.RunningAdapters, ","))
	gauge(c.cacheInfo, 1, strconv.Itoa(m.BlockSize), strconv.Itoa(m.NumGPUBlocks), "True", "0.9", "auto")
	if c.hitRate != nil {
		rate := 0.0
		if m.PrefixCacheQueries > 0 {
			rate = float64(m.PrefixCacheHits) / float64(m.PrefixCacheQueries)
		}
		gauge(c.hitRate, rate, c.model)
	}
	counter(c.hits, m.PrefixCacheHits)
	counter(c.queries, m.PrefixCacheQueries)
	counter(c.promptTokens, m.PromptTokens)
	counter(c.genTokens, m.GenerationTokens)
	counter(c.preemptions, m.Preemptions)
	c.ttft.Collect(ch)
	c.e2e.Collect(ch)
	c.tpot.Collect(ch)
	c.promptLen.Collect(ch)
	c.outputLen.Collect(ch)
}
