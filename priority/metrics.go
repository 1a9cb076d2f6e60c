package priority

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/internal/labelcache"
)

// Metrics are the admission metrics of every Gate in a process. Create one
// with NewMetrics and hand it to each Gate; Gates tell themselves apart by
// the pool label. A nil *Metrics records nothing.
//
// Operators alert on the shed rate per band:
//
//	sum by (band) (rate(meridian_priority_shed_total[5m]))
//	  / sum by (band) (rate(meridian_priority_decisions_total[5m]))
type Metrics struct {
	queued     *prometheus.GaugeVec
	wait       *prometheus.HistogramVec
	decisions  *prometheus.CounterVec
	shed       *prometheus.CounterVec
	spilled    *prometheus.CounterVec
	downgrades *prometheus.CounterVec
	saturation *prometheus.GaugeVec
	backlog    *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meridian_priority_queued_requests",
			Help: "Requests waiting for admission, by pool, band and tenant.",
		}, []string{"pool", "band", "tenant"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "meridian_priority_queue_wait_seconds",
			Help:    "Time from arrival to admission of admitted requests (0 for those admitted at once), by pool, band and tenant.",
			Buckets: []float64{0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, []string{"pool", "band", "tenant"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_priority_decisions_total",
			Help: "Admission decisions (admitted, shed or spilled), by pool and band.",
		}, []string{"pool", "band"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_priority_shed_total",
			Help: "Requests rejected with 429, by pool, band and reason (saturated, no_metrics, queue_full, evicted, timeout).",
		}, []string{"pool", "band", "reason"}),
		spilled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_priority_spilled_total",
			Help: "Requests sent to another Region instead of waiting in a saturated pool, by pool and band.",
		}, []string{"pool", "band"}),
		downgrades: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meridian_priority_downgrades_total",
			Help: "Band claims lowered to the tenant's maxBand, by tenant, claimed band and granted band.",
		}, []string{"tenant", "from", "to"}),
		saturation: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meridian_priority_pool_saturation",
			Help: "Last observed pool saturation (1 = at the thresholds; above 1 = oversubscribed; -1 = unknown, no fresh metrics).",
		}, []string{"pool"}),
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meridian_priority_pool_backlog",
			Help: "How far past its limits, in saturation, the Gate admits Critical and Standard requests because the Gates behind the pool hold them (Tier-2: each cluster's backlog; 0 at Tier-1).",
		}, []string{"pool"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.queued, m.wait, m.decisions, m.shed, m.spilled, m.downgrades, m.saturation, m.backlog} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("priority: registering metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *Metrics) downgrade(tenant string, from, to Band) {
	if m != nil {
		m.downgrades.WithLabelValues(tenant, from.String(), to.String()).Inc()
	}
}

// poolMetrics are the metrics of one Gate, curried with its pool label.
type poolMetrics struct {
	queued     *prometheus.GaugeVec
	wait       prometheus.ObserverVec
	decisions  [numBands]prometheus.Counter
	shed       [numBands][numReasons]prometheus.Counter
	spilled    [numBands]prometheus.Counter
	saturation prometheus.Gauge
	backlog    prometheus.Gauge

	// The children counted on every queued request.
	queuedBy labelcache.Cache[bandTenant, prometheus.Gauge]
	waitBy   labelcache.Cache[bandTenant, prometheus.Observer]
}

type bandTenant struct {
	band   Band
	tenant string
}

func (m *Metrics) pool(name string) *poolMetrics {
	if m == nil {
		return nil
	}
	l := prometheus.Labels{"pool": name}
	pm := &poolMetrics{
		queued:     m.queued.MustCurryWith(l),
		wait:       m.wait.MustCurryWith(l),
		saturation: m.saturation.With(l),
		backlog:    m.backlog.With(l),
	}
	for b := Band(0); b < numBands; b++ {
		pm.decisions[b] = m.decisions.WithLabelValues(name, b.String())
		pm.spilled[b] = m.spilled.WithLabelValues(name, b.String())
		for r := Reason(0); r < numReasons; r++ {
			pm.shed[b][r] = m.shed.WithLabelValues(name, b.String(), r.String())
		}
	}
	return pm
}

func (pm *poolMetrics) admitted(b Band, tenant string, waited time.Duration) {
	if pm != nil {
		pm.decisions[b].Inc()
		pm.waitBy.Get(bandTenant{b, tenant}, func() prometheus.Observer {
			return pm.wait.WithLabelValues(b.String(), tenant)
		}).Observe(waited.Seconds())
	}
}

func (pm *poolMetrics) rejected(b Band, r Reason) {
	if pm != nil {
		pm.decisions[b].Inc()
		pm.shed[b][r].Inc()
	}
}

func (pm *poolMetrics) spill(b Band) {
	if pm != nil {
		pm.decisions[b].Inc()
		pm.spilled[b].Inc()
	}
}

func (pm *poolMetrics) queue(b Band, tenant string, delta float64) {
	if pm != nil {
		pm.queuedBy.Get(bandTenant{b, tenant}, func() prometheus.Gauge {
			return pm.queued.WithLabelValues(b.String(), tenant)
		}).Add(delta)
	}
}

func (pm *poolMetrics) observe(s Saturation) {
	if pm != nil {
		if s.Known() {
			pm.saturation.Set(s.Value)
		} else {
			pm.saturation.Set(-1)
		}
		pm.backlog.Set(s.Backlog)
	}
}
