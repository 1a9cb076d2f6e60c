package tier2

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/internal/labelcache"
)

// Metrics are Tier-2's own series (docs/metrics.md).
type Metrics struct {
	requests        *prometheus.CounterVec
	ttft            *prometheus.HistogramVec
	rejected        *prometheus.CounterVec
	retries         *prometheus.CounterVec
	budgetExhausted prometheus.Counter
	failovers       *prometheus.CounterVec
	ejections       *prometheus.CounterVec
	ejected         *prometheus.GaugeVec
	members         *prometheus.GaugeVec
	gossipKeys      prometheus.Gauge
	gossipKeyErrors prometheus.Counter
	digestAge       *prometheus.GaugeVec
	drift           *prometheus.GaugeVec
	charged         *prometheus.CounterVec

	// Children of the series counted on every request.
	requestsBy labelcache.Cache[requestLabels, prometheus.Counter]
	ttftBy     labelcache.Cache[ttftLabels, prometheus.Observer]
	chargedBy  labelcache.Cache[string, prometheus.Counter]
}

var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// NewMetrics registers Tier-2's series with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier2_requests_total",
			Help: "Requests answered, by the model named, the model routed to, the Region and cluster that served, and status."},
			[]string{"model_name", "target_model_name", "region", "cluster", "code"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "meridian_tier2_ttft_seconds",
			Help:    "Time to the first response byte measured at Tier-2, by the model named, the model routed to, and whether the answer streamed (a non-streamed answer's first byte is its last: stream=\"false\" is its whole latency).",
			Buckets: latencyBuckets}, []string{"model_name", "target_model_name", "stream"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier2_rejected_total",
			Help: "Requests answered by Tier-2 itself with an error, by tenant, band and reason."}, []string{"tenant", "band", "reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier2_retries_total",
			Help: "Retries on another cluster before the first byte, by the failure that caused them."}, []string{"reason"}),
		budgetExhausted: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_tier2_retry_budget_exhausted_total",
			Help: "Retries skipped because the retry budget was spent."}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier2_failovers_total",
			Help: "Requests served outside the Region first chosen."}, []string{"from_region", "to_region"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier2_cluster_ejections_total",
			Help: "Outlier ejections of clusters."}, []string{"cluster"}),
		ejected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_tier2_cluster_ejected",
			Help: "1 while a cluster is ejected."}, []string{"cluster"}),
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_tier2_gossip_members",
			Help: "Tier-2 instances known, by Region."}, []string{"region"}),
		gossipKeys: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_tier2_gossip_keys",
			Help: "Keys in the gossip keyring (--gossip-key-file); 0: gossip is not encrypted."}),
		gossipKeyErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_tier2_gossip_key_errors_total",
			Help: "Reloads of --gossip-key-file that failed and kept the keys in use."}),
		digestAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_tier2_digest_age_seconds",
			Help: "Age of the newest pool-health digest."}, []string{"region", "cluster", "pool"}),
		drift: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_tier2_pool_drift",
			Help: "Clusters whose pool for a model differs from the one most clusters run, by model and kind (definition, adapters, context_length); absent when the pools agree."}, []string{"model_name", "kind"}),
		charged: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier2_charged_tokens_total",
			Help: "Tokens settled against tenants: the final usage, or the prompt plus the output relayed when a stream ended early."}, []string{"tenant"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.ttft, m.rejected, m.retries, m.budgetExhausted, m.failovers,
			m.ejections, m.ejected, m.members, m.gossipKeys, m.gossipKeyErrors, m.digestAge, m.drift, m.charged)
	}
	return m
}

type requestLabels struct{ model, target, region, cluster, code string }

type ttftLabels struct{ model, target, stream string }

// request is requests' child for l.
func (m *Metrics) request(l requestLabels) prometheus.Counter {
	return m.requestsBy.Get(l, func() prometheus.Counter {
		return m.requests.WithLabelValues(l.model, l.target, l.region, l.cluster, l.code)
	})
}

// firstByte is ttft's child for l.
func (m *Metrics) firstByte(l ttftLabels) prometheus.Observer {
	return m.ttftBy.Get(l, func() prometheus.Observer { return m.ttft.WithLabelValues(l.model, l.target, l.stream) })
}

// charge is charged's child for tenant.
func (m *Metrics) charge(tenant string) prometheus.Counter {
	return m.chargedBy.Get(tenant, func() prometheus.Counter { return m.charged.WithLabelValues(tenant) })
}
