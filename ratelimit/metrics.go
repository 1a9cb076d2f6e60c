package ratelimit

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Limiter's Prometheus series. Counters for a tenant are
// resolved once per Update and cached on the tenant and its limits, so a
// decision costs one atomic add, not a label lookup.
type metrics struct {
	admitted       *prometheus.CounterVec // tenant
	rejected       *prometheus.CounterVec // tenant, reason
	usage          *prometheus.CounterVec // tenant, kind
	share          *prometheus.GaugeVec   // tenant, scope, kind
	exchangeErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "meridian", Subsystem: "ratelimit", Name: "admitted_total",
			Help: "Requests admitted by the global rate limits, by tenant.",
		}, []string{"tenant"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "meridian", Subsystem: "ratelimit", Name: "rejected_total",
			Help: "Requests rejected by the global rate limits, by tenant and the limit that ran out.",
		}, []string{"tenant", "reason"}),
		usage: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "meridian", Subsystem: "ratelimit", Name: "usage_total",
			Help: "Units used by admitted requests on this instance: requests, and settled (real) tokens.",
		}, []string{"tenant", "kind"}),
		share: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "meridian", Subsystem: "ratelimit", Name: "share",
			Help: "This instance's current fraction of each global limit.",
		}, []string{"tenant", "scope", "kind"}),
		exchangeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "meridian", Subsystem: "ratelimit", Name: "exchange_errors_total",
			Help: "Gossip payloads that failed to decode and were ignored.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.admitted, m.rejected, m.usage, m.share, m.exchangeErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("ratelimit: registering metrics: %w", err)
		}
	}
	return m, nil
}

// forgetTenant drops a removed tenant's series.
func (m *metrics) forgetTenant(t *tenant) {
	m.admitted.DeleteLabelValues(t.name)
	m.rejected.DeletePartialMatch(prometheus.Labels{"tenant": t.name})
	m.usage.DeletePartialMatch(prometheus.Labels{"tenant": t.name})
	m.share.DeletePartialMatch(prometheus.Labels{"tenant": t.name})
}

// forgetLimit drops a removed limit's share series.
func (m *metrics) forgetLimit(tenant string, lim *limit) {
	m.share.DeleteLabelValues(tenant, lim.scope, lim.kind.String())
}
