package plan

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/meridian-router/meridian/replay"
	"github.com/meridian-router/meridian/sim/trace"
)

// The series a Prometheus peak is read from. vLLM (and Meridian's
// simulator) observe every finished request's prompt and output length in
// these histograms, so their _count is the request rate; Tier-1 counts
// requests by the model the caller named, which for a LoRA request is the
// adapter.
const (
	promPromptTokens = "vllm:request_prompt_tokens"
	promOutputTokens = "vllm:request_generation_tokens"
	promTier1        = "meridian_tier1_requests_total"
)

// Prometheus reads traffic figures from a Prometheus server's HTTP API.
type Prometheus struct {
	// URL is the server's base URL, e.g. http://prometheus:9090.
	URL string
	// Window is how far back to look for the peak. Default 24h.
	Window time.Duration
	// RateInterval is the range of the rate() the peak is the highest
	// of. Default 1m (at least four scrapes at Prometheus' default 15 s).
	RateInterval time.Duration
	// Pool, if set, keeps series with pool="Pool" (the label the shipped
	// scrape configuration puts on pods and Tier-1 puts on its counters).
	Pool string
	// Client makes the requests; nil means one with a 30 s timeout.
	Client *http.Client
	// Now is the evaluation time; zero means the current time.
	Now time.Time
}

// Peak is the traffic at a pool's busiest time, as Prometheus saw it.
type Peak struct {
	// RPS is the highest request rate over the window.
	RPS float64 `json:"rps"`
	// Prompt and Output are the length distributions over the window.
	Prompt Histogram `json:"prompt_tokens"`
	Output Histogram `json:"output_tokens"`
}

// Histogram is a cumulative histogram: Counts[i] observations ≤ Bounds[i].
// The last bound may be +Inf.
type Histogram struct {
	Bounds []float64 `json:"bounds"`
	Counts []float64 `json:"counts"`
}

// Mean estimates the mean, each bucket's observations at its midpoint.
func (h Histogram) Mean() float64 {
	var sum, n, prevB, prevC float64
	for i, b := range h.Bounds {
		c := h.Counts[i] - prevC
		if math.IsInf(b, 1) {
			b = prevB
		}
		sum += c * (prevB + b) / 2
		n += c
		prevB, prevC = b, h.Counts[i]
	}
	if n == 0 {
		return 0
	}
	return sum / n
}

// sample draws a length: a bucket by its share, then uniformly within it
// (at its lower bound for +Inf). At least 1.
func (h Histogram) sample(rng *rand.Rand) int {
	total := h.Counts[len(h.Counts)-1]
	x := rng.Float64() * total
	i := sort.SearchFloat64s(h.Counts, x)
	i = min(i, len(h.Counts)-1)
	lo := 0.0
	if i > 0 {
		lo = h.Bounds[i-1]
	}
	hi := h.Bounds[i]
	if math.IsInf(hi, 1) {
		hi = lo
	}
	return max(1, int(math.Round(lo+rng.Float64()*(hi-lo))))
}

func (p *Prometheus) defaults() error {
	u, err := url.Parse(p.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("plan: %w: --from-prometheus: want an http(s) URL such as http://prometheus:9090, got %q", ErrBadInput, p.URL)
	}
	if p.Window < 0 || p.RateInterval < 0 {
		return fmt.Errorf("plan: %w: Prometheus window and rate interval must not be negative", ErrBadInput)
	}
	if p.Window == 0 {
		p.Window = 24 * time.Hour
	}
	if p.RateInterval == 0 {
		p.RateInterval = time.Minute
	}
	if p.Client == nil {
		p.Client = &http.Client{Timeout: 30 * time.Second}
	}
	return nil
}

func (p *Prometheus) selector(extra string) string {
	var m []string
	if p.Pool != "" {
		m = append(m, "pool="+strconv.Quote(p.Pool))
	}
	if extra != "" {
		m = append(m, extra)
	}
	return "{" + strings.Join(m, ",") + "}"
}

// Peak queries the highest request rate over the window and the prompt
// and output length histograms over it.
func (p Prometheus) Peak(ctx context.Context) (*Peak, error) {
	if err := p.defaults(); err != nil {
		return nil, err
	}
	sel := p.selector("")
	step := max(p.RateInterval/4, time.Second)
	rateQ := fmt.Sprintf("max_over_time(sum(rate(%s_count%s[%s]))[%s:%s])", promPromptTokens, sel,
		promDuration(p.RateInterval), promDuration(p.Window), promDuration(step))
	vs, err := p.query(ctx, rateQ)
	if err != nil {
		return nil, err
	}
	if len(vs) == 0 || !(vs[0].value > 0) {
		return nil, fmt.Errorf("plan: prometheus %s: no requests in the last %v: %s has no samples%s (is Prometheus scraping the model servers?)",
			p.URL, p.Window, promPromptTokens+"_count", poolNote(p.Pool))
	}
	peak := &Peak{RPS: vs[0].value}
	for _, h := range []struct {
		name string
		dst  *Histogram
	}{{promPromptTokens, &peak.Prompt}, {promOutputTokens, &peak.Output}} {
		q := fmt.Sprintf("sum by (le) (increase(%s_bucket%s[%s]))", h.name, sel, promDuration(p.Window))
		vs, err := p.query(ctx, q)
		if err != nil {
			return nil, err
		}
		hist, err := toHistogram(vs)
		if err != nil {
			return nil, fmt.Errorf("plan: prometheus %s: %s: %w", p.URL, h.name, err)
		}
		*h.dst = hist
	}
	return peak, nil
}

// AdapterShares queries each LoRA adapter's share of requests over the
// window, from Tier-1's counter by requested model (an adapter is a
// requested model whose target is its base model). Base-model requests
// are returned under "".
func (p Prometheus) AdapterShares(ctx context.Context) (map[string]float64, error) {
	if err := p.defaults(); err != nil {
		return nil, err
	}
	q := fmt.Sprintf("sum by (model_name, target_model_name) (increase(%s%s[%s]))", promTier1, p.selector(""), promDuration(p.Window))
	vs, err := p.query(ctx, q)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	total := 0.0
	for _, v := range vs {
		if !(v.value > 0) || v.labels["model_name"] == "unknown" {
			continue
		}
		name := v.labels["model_name"]
		if name == v.labels["target_model_name"] {
			name = ""
		}
		out[name] += v.value
		total += v.value
	}
	if total == 0 {
		return nil, fmt.Errorf("plan: prometheus %s: no Tier-1 requests in the last %v (%s)%s", p.URL, p.Window, promTier1, poolNote(p.Pool))
	}
	for k := range out {
		out[k] /= total
	}
	return out, nil
}

func poolNote(pool string) string {
	if pool == "" {
		return ""
	}
	return fmt.Sprintf(" for pool %q", pool)
}

type promSample struct {
	labels map[string]string
	value  float64
}

// query runs an instant query and returns its vector.
func (p *Prometheus) query(ctx context.Context, q string) ([]promSample, error) {
	v := url.Values{"query": {q}}
	if !p.Now.IsZero() {
		v.Set("time", strconv.FormatFloat(float64(p.Now.UnixNano())/1e9, 'f', 3, 64))
	}
	u := strings.TrimRight(p.URL, "/") + "/api/v1/query?" + v.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("plan: prometheus: %w", err)
	}
	resp, err := p.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("plan: prometheus: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("plan: prometheus %s: %w", p.URL, err)
	}
	var out struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Data      struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("plan: prometheus %s: HTTP %d, not the Prometheus API: %w", p.URL, resp.StatusCode, err)
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("plan: prometheus %s: query %s: %s: %s", p.URL, q, out.ErrorType, out.Error)
	}
	if out.Data.ResultType != "vector" {
		return nil, fmt.Errorf("plan: prometheus %s: query %s: want a vector, got %q", p.URL, q, out.Data.ResultType)
	}
	var vs []promSample
	for _, r := range out.Data.Result {
		s, _ := r.Value[1].(string)
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) {
			continue
		}
		vs = append(vs, promSample{labels: r.Metric, value: f})
	}
	return vs, nil
}

// toHistogram orders a "sum by (le)" vector into a cumulative histogram.
func toHistogram(vs []promSample) (Histogram, error) {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for _, v := range vs {
		le, err := strconv.ParseFloat(v.labels["le"], 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, v.value})
	}
	if len(bs) == 0 {
		return Histogram{}, errors.New("no histogram buckets (is the model server exporting it?)")
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	var h Histogram
	prev := 0.0
	for _, b := range bs {
		h.Bounds = append(h.Bounds, b.le)
		// increase() of each bucket is extrapolated separately; keep the
		// histogram cumulative.
		prev = max(prev, b.n)
		h.Counts = append(h.Counts, prev)
	}
	if prev <= 0 {
		return Histogram{}, errors.New("no observations in the window")
	}
	return h, nil
}

// promDuration writes a duration in PromQL's syntax (whole seconds).
func promDuration(d time.Duration) string {
	return strconv.FormatInt(max(1, int64(d/time.Second)), 10) + "s"
}

// PeakWorkload is a synthetic workload standing for a Prometheus peak:
// Poisson arrivals at the peak rate for span (at most limit requests),
// lengths drawn from the histograms, every prompt unique (the metrics say
// nothing about shared prefixes). Replayed at scale 1 it is the peak.
func PeakWorkload(p *Peak, span time.Duration, limit int, seed uint64) (*replay.Workload, error) {
	if p == nil || !(p.RPS > 0) || len(p.Prompt.Counts) == 0 || len(p.Output.Counts) == 0 {
		return nil, fmt.Errorf("plan: %w: no peak to build a workload from", ErrBadInput)
	}
	if span <= 0 {
		span = 10 * time.Minute
	}
	if limit <= 0 {
		limit = 20000
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	n := min(limit, max(1, int(math.Round(p.RPS*span.Seconds()))))
	w := &replay.Workload{Records: make([]trace.Record, 0, n)}
	at := 0.0
	for i := range n {
		if i > 0 {
			at += rng.ExpFloat64() / p.RPS
		}
		w.Records = append(w.Records, trace.Record{
			Line:         i + 1,
			Arrival:      time.Duration(at * float64(time.Second)),
			InputTokens:  p.Prompt.sample(rng),
			OutputTokens: p.Output.sample(rng),
		})
	}
	return w, nil
}
