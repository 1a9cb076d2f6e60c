// Package cloudwatch publishes one Region's fleet aggregates to Amazon
// CloudWatch with PutMetricData: requests, 429s and their rate, the
// distribution and P99 of time to first token per public model name, and
// cross-Region failovers, each with a Region dimension so one CloudWatch
// dashboard or alarm covers every Region.
//
// It decides what is published and how it is batched: it pulls cumulative
// counters from a source every interval, publishes the differences (so a
// restart or several Tier-2 instances add up in CloudWatch's Sum), and
// splits them into requests of at most 1,000 datums (the API's limit). It
// does not decide whether to publish: the exporter is optional and off
// unless the operator configures it, and it is not a Prometheus
// replacement — Prometheus keeps the per-pod detail, CloudWatch the fleet
// view.
package cloudwatch

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"

	"github.com/meridian-router/meridian/internal/histogram"
)

// MaxDatumsPerRequest is PutMetricData's limit of datums per request.
const MaxDatumsPerRequest = 1000

// maxValuesPerDatum is PutMetricData's limit of Values per datum.
const maxValuesPerDatum = 150

// Histogram is a cumulative histogram, Prometheus-style: Buckets[i].Count
// observations were ≤ Buckets[i].UpperBound, bounds ascending; Count
// includes observations above the last bound.
type Histogram struct {
	Buckets []Bucket
	Count   uint64
	Sum     float64
}

// Bucket is one cumulative histogram bucket.
type Bucket struct {
	UpperBound float64
	Count      uint64
}

// Aggregates are one Region's cumulative counters since the process
// started. A source returns them; the exporter takes differences.
type Aggregates struct {
	// Requests answered, by public model name.
	Requests map[string]uint64
	// Throttled are requests answered 429, by public model name.
	Throttled map[string]uint64
	// TTFT is time to first token in seconds, by public model name.
	TTFT map[string]Histogram
	// Failovers are requests served outside the Region first chosen.
	Failovers uint64
}

// Config configures an Exporter.
type Config struct {
	// Region is the value of the Region dimension on every datum: the
	// Region this Tier-2 runs in. Required.
	Region string
	// Namespace of the metrics. Zero means "Meridian".
	Namespace string
	// Interval between publications. Zero means one minute, CloudWatch's
	// standard resolution; shorter intervals cost more requests and
	// buy nothing at standard resolution.
	Interval time.Duration
	// MaxDatumsPerRequest caps a request's datums. Zero means 1,000, the
	// API's limit; larger values are an error.
	MaxDatumsPerRequest int
	// Timeout bounds one publication (all its requests, with the SDK's
	// retries). Zero means 30 seconds.
	Timeout time.Duration
}

// Exporter publishes aggregates on a schedule. Create it with New.
type Exporter struct {
	cfg    Config
	client *cloudwatch.Client
	source func() Aggregates

	// now and newTicker are the clock; tests replace them.
	now       func() time.Time
	newTicker func(time.Duration) (<-chan time.Time, func())

	prev    Aggregates
	started bool
	pending []types.MetricDatum // built, not yet accepted
}

// New returns an exporter that calls source every interval (from the
// exporter's goroutine only; it may take locks but should not block).
func New(client *cloudwatch.Client, cfg Config, source func() Aggregates) (*Exporter, error) {
	if client == nil || source == nil {
		return nil, errors.New("cloudwatch: a client and a source are required")
	}
	if cfg.Region == "" {
		return nil, errors.New("cloudwatch: Config.Region is required")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "Meridian"
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Interval < 0 {
		return nil, fmt.Errorf("cloudwatch: negative interval %v", cfg.Interval)
	}
	if cfg.MaxDatumsPerRequest == 0 {
		cfg.MaxDatumsPerRequest = MaxDatumsPerRequest
	}
	if cfg.MaxDatumsPerRequest < 0 || cfg.MaxDatumsPerRequest > MaxDatumsPerRequest {
		return nil, fmt.Errorf("cloudwatch: MaxDatumsPerRequest %d: PutMetricData takes 1 to %d", cfg.MaxDatumsPerRequest, MaxDatumsPerRequest)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	return &Exporter{
		cfg:    cfg,
		client: client,
		source: source,
		now:    time.Now,
		newTicker: func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		},
	}, nil
}

// Run publishes every interval until ctx is done, then publishes what
// accumulated since the last tick (with a fresh timeout) and returns.
// A failed publication is reported to onError (nil: ignored; called from
// Run's goroutine) and its datums are sent with the next one, so a
// transient error loses nothing.
func (e *Exporter) Run(ctx context.Context, onError func(error)) {
	report := func(err error) {
		if err != nil && onError != nil {
			onError(err)
		}
	}
	e.baseline()
	tick, stop := e.newTicker(e.cfg.Interval)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.Timeout)
			report(e.Flush(final))
			cancel()
			return
		case <-tick:
			// A publication under way when ctx ends completes (within
			// Timeout): cut short, its datums might count twice.
			pub, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.Timeout)
			report(e.Flush(pub))
			cancel()
		}
	}
}

// baseline records the counters as they are, so the first publication
// covers one interval rather than the whole life of the process.
func (e *Exporter) baseline() {
	if !e.started {
		e.prev = e.source()
		e.started = true
	}
}

// Flush pulls the aggregates and publishes the differences since the last
// Flush, after any datums an earlier failed Flush left unsent. Datums carry
// their own timestamps, so late ones land in the right minute. It must not
// be called concurrently with itself or Run.
func (e *Exporter) Flush(ctx context.Context) error {
	e.baseline()
	cur := e.source()
	e.pending = append(e.pending, e.datums(e.prev, cur, e.now())...)
	e.prev = cur
	dropped := 0
	if over := len(e.pending) - maxPending; over > 0 {
		dropped = over
		e.pending = e.pending[over:]
	}
	for len(e.pending) > 0 {
		n := min(e.cfg.MaxDatumsPerRequest, len(e.pending))
		_, err := e.client.PutMetricData(ctx, &cloudwatch.PutMetricDataInput{
			Namespace:  aws.String(e.cfg.Namespace),
			MetricData: e.pending[:n],
		})
		if err != nil {
			return fmt.Errorf("cloudwatch: PutMetricData (%d datums kept for the next attempt): %w", len(e.pending), err)
		}
		e.pending = e.pending[n:]
	}
	e.pending = nil
	if dropped > 0 {
		return fmt.Errorf("cloudwatch: dropped the %d oldest unsent datums (more than %d waiting)", dropped, maxPending)
	}
	return nil
}

// maxPending bounds the datums kept across failed publications: about ten
// minutes of a large fleet's datums.
const maxPending = 10 * MaxDatumsPerRequest

// delta is cur − prev for a counter; a counter that went down restarted,
// and everything it holds is new.
func delta(prev, cur uint64) uint64 {
	if cur < prev {
		return cur
	}
	return cur - prev
}

func (e *Exporter) datums(prev, cur Aggregates, now time.Time) []types.MetricDatum {
	region := types.Dimension{Name: aws.String("Region"), Value: aws.String(e.cfg.Region)}
	dims := func(model string) []types.Dimension {
		if model == "" {
			return []types.Dimension{region}
		}
		return []types.Dimension{region, {Name: aws.String("ModelName"), Value: aws.String(model)}}
	}
	datum := func(name, model string, unit types.StandardUnit, v float64) types.MetricDatum {
		return types.MetricDatum{MetricName: aws.String(name), Dimensions: dims(model), Timestamp: aws.Time(now), Unit: unit, Value: aws.Float64(v)}
	}
	var out []types.MetricDatum
	models := map[string]bool{}
	for m := range cur.Requests {
		models[m] = true
	}
	for m := range cur.Throttled {
		models[m] = true
	}
	for m := range cur.TTFT {
		models[m] = true
	}
	names := slices.Sorted(maps.Keys(models))

	var requests, throttled uint64
	for _, m := range names {
		r := delta(prev.Requests[m], cur.Requests[m])
		th := delta(prev.Throttled[m], cur.Throttled[m])
		requests += r
		throttled += th
		out = append(out, datum("Requests", m, types.StandardUnitCount, float64(r)),
			datum("Throttled", m, types.StandardUnitCount, float64(th)))
		if r > 0 {
			out = append(out, datum("ThrottleRate", m, types.StandardUnitPercent, 100*float64(th)/float64(r)))
		}
		h, ok := cur.TTFT[m]
		if !ok {
			continue
		}
		d := h.minus(prev.TTFT[m])
		if d.Count == 0 {
			continue
		}
		// The distribution, so CloudWatch computes any percentile over any
		// period and across Regions; and the interval's P99 for alarms.
		values, counts := d.valuesCounts()
		if len(values) > 0 {
			out = append(out, types.MetricDatum{
				MetricName: aws.String("TTFT"), Dimensions: dims(m), Timestamp: aws.Time(now),
				Unit: types.StandardUnitSeconds, Values: values, Counts: counts,
			})
		}
		if p99 := d.quantile(0.99); !math.IsNaN(p99) {
			out = append(out, datum("TTFTP99", m, types.StandardUnitSeconds, p99))
		}
	}
	out = append(out,
		datum("Requests", "", types.StandardUnitCount, float64(requests)),
		datum("Throttled", "", types.StandardUnitCount, float64(throttled)),
		datum("Failovers", "", types.StandardUnitCount, float64(delta(prev.Failovers, cur.Failovers))))
	if requests > 0 {
		out = append(out, datum("ThrottleRate", "", types.StandardUnitPercent, 100*float64(throttled)/float64(requests)))
	}
	return out
}

// minus returns h − prev bucket by bucket; a histogram whose count went
// down restarted and is returned whole. Buckets are matched by bound.
func (h Histogram) minus(prev Histogram) Histogram {
	if h.Count < prev.Count {
		return h
	}
	before := map[float64]uint64{}
	for _, b := range prev.Buckets {
		before[b.UpperBound] = b.Count
	}
	out := Histogram{Count: h.Count - prev.Count, Sum: h.Sum - prev.Sum}
	for _, b := range h.Buckets {
		out.Buckets = append(out.Buckets, Bucket{UpperBound: b.UpperBound, Count: delta(before[b.UpperBound], b.Count)})
	}
	return out
}

// valuesCounts turns bucket counts into CloudWatch's Values and Counts:
// each bucket's observations are reported at its upper bound (the
// overflow above the last bound at that bound too), a conservative
// reading of where they lie. At most 150 values, the API's limit.
func (h Histogram) valuesCounts() ([]float64, []float64) {
	var values, counts []float64
	var below uint64
	for _, b := range h.Buckets {
		if math.IsInf(b.UpperBound, +1) {
			continue
		}
		if n := b.Count - min(below, b.Count); n > 0 {
			values = append(values, b.UpperBound)
			counts = append(counts, float64(n))
		}
		below = max(below, b.Count)
	}
	if over := h.Count - min(below, h.Count); over > 0 && len(values) > 0 {
		counts[len(counts)-1] += float64(over)
	} else if over > 0 && len(h.Buckets) > 0 {
		// Only a +Inf bucket: nothing finite to report.
		return nil, nil
	}
	if len(values) > maxValuesPerDatum {
		values, counts = values[:maxValuesPerDatum], counts[:maxValuesPerDatum]
	}
	return values, counts
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile
// does (internal/histogram): NaN when the histogram is empty; the last
// finite bound when the rank falls in the overflow.
func (h Histogram) quantile(q float64) float64 {
	bounds := make([]float64, 0, len(h.Buckets))
	cum := make([]float64, 0, len(h.Buckets))
	for _, b := range h.Buckets {
		if math.IsInf(b.UpperBound, +1) {
			break
		}
		bounds, cum = append(bounds, b.UpperBound), append(cum, float64(b.Count))
	}
	return histogram.Quantile(q, bounds, cum, float64(h.Count))
}

// ClientOptions say how to reach CloudWatch.
type ClientOptions struct {
	// Region is the AWS Region whose CloudWatch receives the metrics.
	// Empty means the SDK's default (AWS_REGION, shared config, IMDS).
	Region string
	// EndpointURL replaces CloudWatch's endpoint (tests). Empty means
	// AWS's.
	EndpointURL string
}

// NewClient returns a CloudWatch client using the SDK's standard
// credential chain (IRSA on EKS).
func NewClient(ctx context.Context, o ClientOptions, optFns ...func(*awsconfig.LoadOptions) error) (*cloudwatch.Client, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if o.Region != "" {
		opts = append(opts, awsconfig.WithRegion(o.Region))
	}
	opts = append(opts, optFns...)
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("cloudwatch: loading AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, errors.New("cloudwatch: no AWS Region: set one in the exporter's configuration or AWS_REGION")
	}
	return cloudwatch.NewFromConfig(cfg, func(c *cloudwatch.Options) {
		if o.EndpointURL != "" {
			c.BaseEndpoint = aws.String(o.EndpointURL)
		}
	}), nil
}
