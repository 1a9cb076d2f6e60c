package gateway

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/internal/loop"
)

// Metrics are Tier-1's request metrics (docs/metrics.md).
type Metrics struct {
	requests       *prometheus.CounterVec
	ttft           *prometheus.HistogramVec
	duration       *prometheus.HistogramVec
	scheduling     *prometheus.HistogramVec
	queueDepth     *prometheus.GaugeVec
	queueSpread    *prometheus.GaugeVec
	prefixRatio    *prometheus.GaugeVec
	endpoints      *prometheus.GaugeVec
	fallbacks      *prometheus.CounterVec
	rejected       *prometheus.CounterVec
	configRevision prometheus.Gauge
}

// latencyBuckets span a fast cache hit to a long queue.
var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

func newMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier1_requests_total",
			Help: "Requests answered, by the model the caller named, the model routed to, pool and status."},
			[]string{"model_name", "target_model_name", "pool", "code"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "meridian_tier1_ttft_seconds",
			Help:    "Time to first response byte measured at Tier-1; stream=\"true\": a streamed response's first event (its first token), stream=\"false\": a whole non-streamed answer.",
			Buckets: latencyBuckets}, []string{"model_name", "pool", "stream"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "meridian_tier1_request_duration_seconds",
			Help: "Whole-request duration at Tier-1.", Buckets: latencyBuckets}, []string{"model_name", "pool"}),
		scheduling: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "meridian_tier1_scheduling_duration_seconds",
			Help:    "Time to pick an endpoint.",
			Buckets: []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2}}, []string{"pool"}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_tier1_pod_queue_depth",
			Help: "Waiting requests per pod, from the last scrape."}, []string{"pool", "endpoint"}),
		queueSpread: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_tier1_pool_queue_spread",
			Help: "Max minus min waiting requests over the pool's ready pods."}, []string{"pool"}),
		prefixRatio: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_tier1_prefix_hit_ratio",
			Help: "Prefix-cache hit ratio: source=index estimated by Meridian, source=pod from the pods' counters."}, []string{"pool", "source"}),
		endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_tier1_endpoints",
			Help: "Endpoints by state: ready, stale, unready."}, []string{"pool", "state"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier1_fallbacks_total",
			Help: "Requests retried on a fallback endpoint before the first byte."}, []string{"pool"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier1_rejected_total",
			Help: "Requests refused by Tier-1, by pool and reason."}, []string{"pool", "reason"}),
		configRevision: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_config_revision",
			Help: "Revision of the configuration in force."}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.ttft, m.duration, m.scheduling, m.queueDepth, m.queueSpread,
			m.prefixRatio, m.endpoints, m.fallbacks, m.rejected, m.configRevision)
	}
	return m
}

// exportGauges refreshes the per-pool gauges once a second.
func (g *Gateway) exportGauges(ctx context.Context) {
	loop.Every(ctx, time.Second, g.refreshGauges)
}

func (g *Gateway) refreshGauges() {
	now := g.cfg.Now()
	stale := g.cfg.Options.MaxMetricsAge
	if stale <= 0 {
		stale = time.Second
	}
	g.metrics.queueDepth.Reset()
	for _, v := range g.Pools() {
		lo, hi, any := 0, 0, false
		var ready, staleN, unready int
		for _, ep := range v.Pool.Endpoints() {
			m := ep.Metrics()
			switch {
			case !ep.Ready():
				unready++
				continue
			case m == nil || now.Sub(m.ScrapedAt) > stale:
				staleN++
				continue
			}
			ready++
			g.metrics.queueDepth.WithLabelValues(v.Name, ep.ID).Set(float64(m.Waiting))
			if !any || m.Waiting < lo {
				lo = m.Waiting
			}
			if !any || m.Waiting > hi {
				hi = m.Waiting
			}
			any = true
		}
		g.metrics.queueSpread.WithLabelValues(v.Name).Set(float64(hi - lo))
		g.metrics.endpoints.WithLabelValues(v.Name, "ready").Set(float64(ready))
		g.metrics.endpoints.WithLabelValues(v.Name, "stale").Set(float64(staleN))
		g.metrics.endpoints.WithLabelValues(v.Name, "unready").Set(float64(unready))
		g.metrics.prefixRatio.WithLabelValues(v.Name, "index").Set(v.IndexHitRatio())
		if h, q := v.PodPrefix(); q > 0 {
			g.metrics.prefixRatio.WithLabelValues(v.Name, "pod").Set(float64(h) / float64(q))
		}
	}
}
