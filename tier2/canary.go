package tier2

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/histogram"
	"github.com/meridian-router/meridian/rewrite"
	"github.com/meridian-router/meridian/rollout"
)

// RolloutStore records a transition the canary analysis decided.
// canary.Etcd implements it.
type RolloutStore interface {
	// SwapRollout replaces rewrite's rollout with next when the stored
	// rollout still equals prev, and returns config.ErrConflict otherwise
	// (another Tier-2 or an operator wrote first). It blocks on the network
	// and is called from the analysis goroutine only.
	SwapRollout(ctx context.Context, rewrite string, prev, next config.Rollout) error
}

// CanaryConfig configures Tier-2's canary analysis.
type CanaryConfig struct {
	// Period is the longest time between two analyses. Zero means the
	// configuration's (Topology spec.routing.canaryAnalysis.period, read
	// every round, so a reload applies at the next one), else 5s; set, it
	// overrides the configuration (`meridian tier2 --canary-period`). A
	// rollout whose step interval is short is analysed every quarter of
	// its interval instead (but not more often than every 250ms), so a
	// failing canary is aborted well within one interval.
	Period time.Duration
	// Window bounds how far back measurements count. Zero means the
	// configuration's (spec.routing.canaryAnalysis.window), else 1m; set,
	// it overrides it. They never reach back before this instance saw the
	// rollout's current state (step, status or weights), so each step is
	// judged on its own traffic.
	Window time.Duration
	// Store writes transitions (revision-checked). Nil means report only:
	// with a directory configuration source Tier-2 cannot write, so it
	// analyses, logs and exposes its verdicts but changes nothing.
	Store RolloutStore
	// WriteTimeout bounds one transition write. Zero means 5s.
	WriteTimeout time.Duration
	// Instance and Region name this Tier-2 in reports.
	Instance, Region string
	Registerer       prometheus.Registerer
	Logger           *slog.Logger
	// Now is the clock of step intervals. Nil means time.Now.
	Now func() time.Time
}

// Canary is Tier-2's analysis of stepped canaries: every period it
// compares each rollout's canary with its stable target — P99 TTFT, error
// rate and 429 rate — and lets rewrite.Evaluate decide; a decision other
// than hold is written through Store. Every Tier-2 runs one; they reach the
// same verdicts from shared measurements, one write wins and the others see
// the new state through their configuration watch.
//
// Measurements per side, over the window:
//   - requests, 5xx and 429 answers, and P99 TTFT from this instance's own
//     meridian_tier2_requests_total and meridian_tier2_ttft_seconds (streamed
//     answers when there are any) for the public name and that target;
//   - the error rate and P99 TTFT of every pool serving the target (in the
//     target's clusters) from the gossiped pool-health digests, which carry
//     what every Tier-1 saw. A side's error count is the larger of its local
//     count and the worst pool's rate × local requests, so a canary failing
//     for other Regions' callers is caught here; its P99 is the worst pool's
//     when any digest has one (finer than Tier-2's TTFT buckets, and over
//     all callers), else the local histogram's.
type Canary struct {
	cfg    CanaryConfig
	r      *Router
	log    *slog.Logger
	state  *prometheus.GaugeVec
	weight *prometheus.GaugeVec
	trans  *prometheus.CounterVec
	share  *prometheus.GaugeVec

	mu      sync.Mutex
	latest  map[string]rollout.Live // rewrite → latest analysis
	tracked map[string]*tracked     // rewrite → observed rollout and samples
}

// tracked is one rewrite's observed rollout and its measurement history.
type tracked struct {
	seen    config.Rollout // as last observed in the configuration
	since   time.Time      // when seen was first observed
	samples []sample       // cumulative counters, oldest first
	// unwritten is the last decision a read-only analysis could not
	// write (Hold: none), so it is logged once per state.
	unwritten rewrite.Action
	// warned: the cohort warning was logged for this state.
	warned bool
	// keying is the stickiness (key, header, salt) the cohort is measured
	// under.
	keying string
}

type sample struct {
	at             time.Time
	canary, stable counts
}

// counts are cumulative local counters of one side.
type counts struct {
	requests, errors, throttled float64
	ttft, streamed              ttftCounts // every answer's; streamed answers'
}

// ttftCounts is a cumulative TTFT histogram over latencyBuckets.
type ttftCounts struct {
	buckets []float64 // cumulative bucket counts
	count   float64
}

// add sums one series of meridian_tier2_ttft_seconds into t.
func (t *ttftCounts) add(h *dto.Histogram) {
	if len(t.buckets) != len(h.GetBucket()) {
		t.buckets = make([]float64, len(h.GetBucket()))
	}
	for i, b := range h.GetBucket() {
		t.buckets[i] += float64(b.GetCumulativeCount())
	}
	t.count += float64(h.GetSampleCount())
}

// p99 is the 99th percentile of the answers between base and now, 0 when
// there were none.
func (t ttftCounts) p99(base ttftCounts) time.Duration {
	n := t.count - base.count
	if n <= 0 || len(t.buckets) != len(latencyBuckets) {
		return 0
	}
	delta := make([]float64, len(t.buckets))
	for i := range delta {
		delta[i] = t.buckets[i]
		if len(base.buckets) == len(delta) {
			delta[i] -= base.buckets[i]
		}
	}
	return quantile(0.99, delta, n)
}

// NewCanary builds the analysis over r's configuration and measurements.
func NewCanary(cfg CanaryConfig, r *Router) (*Canary, error) {
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Canary{cfg: cfg, r: r, log: cfg.Logger, latest: map[string]rollout.Live{}, tracked: map[string]*tracked{},
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_canary_state",
			Help: "1 for the rollout's current state (Progressing, Paused, Healthy, Degraded, Aborted)."}, []string{"rewrite", "state"}),
		weight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_canary_weight_percent",
			Help: "Current weight of each target of a rewrite with a rollout, in percent."}, []string{"rewrite", "target"}),
		share: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_canary_observed_percent",
			Help: "The canary's observed share of its rollout's stable+canary requests and distinct stickiness keys, in percent, since this instance saw the rollout's current state."}, []string{"rewrite", "of"}),
		trans: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_canary_transitions_total",
			Help: "Rollout state transitions this instance observed, by the state entered (a step change counts as Progressing)."}, []string{"rewrite", "to"}),
	}
	if cfg.Registerer != nil {
		for _, col := range []prometheus.Collector{c.state, c.weight, c.trans, c.share} {
			if err := cfg.Registerer.Register(col); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// pollConfig is how often Run looks for a new configuration, so that a
// rollout started or changed is measured from the start of its step.
const pollConfig = 250 * time.Millisecond

// Run analyses until ctx ends: every period, and at once when the
// configuration changes.
func (c *Canary) Run(ctx context.Context) {
	t := time.NewTicker(pollConfig)
	defer t.Stop()
	var seen *state
	var due time.Time
	for {
		if st := c.r.snap.Load(); st != seen || !c.cfg.Now().Before(due) {
			seen = st
			due = c.cfg.Now().Add(c.round(ctx))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round observes the configuration, analyses every rollout in progress,
// writes what must be written, and returns the time until the next round.
func (c *Canary) round(ctx context.Context) time.Duration {
	now := c.cfg.Now()
	st := c.r.snap.Load()
	next, window := c.timing(st.snap)
	local := c.collect()
	type work struct {
		name string
		ro   config.Rollout
		live rollout.Live
		dec  rewrite.Decision
	}
	var todo []work
	c.mu.Lock()
	for name := range c.tracked {
		if mr := st.snap.Rewrites[name]; mr == nil || mr.Spec.Rollout == nil {
			delete(c.tracked, name)
			delete(c.latest, name)
			c.state.DeletePartialMatch(prometheus.Labels{"rewrite": name})
			c.weight.DeletePartialMatch(prometheus.Labels{"rewrite": name})
			c.share.DeletePartialMatch(prometheus.Labels{"rewrite": name})
			c.r.cohorts.Delete(name)
		}
	}
	for name, mr := range st.snap.Rewrites {
		ro := mr.Spec.Rollout
		if ro == nil {
			continue
		}
		rule := ruleHolding(mr, ro)
		public := publicName(mr, rule)
		tr := c.observe(name, mr, rule, now)
		status := ro.Status
		if status == "" {
			status = rewrite.StatusProgressing
		}
		if status != rewrite.StatusProgressing && status != rewrite.StatusPaused {
			continue
		}
		if ro.Interval > 0 {
			next = min(next, max(ro.Interval.D()/4, 250*time.Millisecond))
		}
		cs, ss := local[sideKey{public, ro.Canary}], local[sideKey{public, ro.Stable}]
		tr.samples = append(tr.samples, sample{at: now, canary: cs, stable: ss})
		base := tr.baseline(now, window)
		var clusters [2][]string
		if rule >= 0 {
			for _, t := range mr.Spec.Rules[rule].Targets {
				switch t.ModelRewrite {
				case ro.Canary:
					clusters[0] = t.Clusters
				case ro.Stable:
					clusters[1] = t.Clusters
				}
			}
		}
		// Like with like: both sides' streamed answers when both had some.
		streamed := cs.streamed.count > base.canary.streamed.count && ss.streamed.count > base.stable.streamed.count
		canaryStats := c.stats(ro.Canary, clusters[0], cs, base.canary, streamed)
		stableStats := c.stats(ro.Stable, clusters[1], ss, base.stable, streamed)
		live := rollout.Live{Rewrite: name, Model: public, Instance: c.cfg.Instance, Region: c.cfg.Region,
			At: now.UTC().Format(time.RFC3339), Canary: side(ro.Canary, canaryStats), Stable: side(ro.Stable, stableStats),
			Cohort: c.cohort(name, mr, rule, tr)}
		res, err := rewrite.Analyze(canaryStats, stableStats, ro.Analysis)
		var dec rewrite.Decision
		if err == nil {
			dec, err = rewrite.Evaluate(*ro, res, now)
		}
		if err != nil {
			live.Error = err.Error()
			c.latest[name] = live
			c.log.Error("canary: analysis failed", "rewrite", name, "error", err)
			continue
		}
		if a := dec.Action; a != rewrite.Hold && a != rewrite.Abort && ro.Interval > 0 && now.Sub(tr.since) < min(ro.Interval.D(), window)/2 {
			// This instance has not watched the step long enough (it just
			// started, or saw the change late) to pass or pause it; another
			// instance that has, or this one later, will.
			dec = rewrite.Decision{Action: rewrite.Hold, Rollout: *ro, CanaryPercent: dec.CanaryPercent,
				Reason: "measuring: " + now.Sub(tr.since).Round(time.Millisecond).String() + " of this step seen; " + dec.Reason}
		}
		live.Verdict, live.Reason, live.Action, live.Decision = res.Verdict.String(), res.Reason, dec.Action.String(), dec.Reason
		c.latest[name] = live
		if dec.Action != rewrite.Hold {
			todo = append(todo, work{name, *ro, live, dec})
		}
	}
	c.mu.Unlock()
	for _, w := range todo {
		c.write(ctx, w.name, w.ro, w.dec)
	}
	return next
}

// timing is the analysis period and window in force for snap: the
// configuration's spec.routing.canaryAnalysis, overridden by CanaryConfig,
// defaults 5s and 1m.
func (c *Canary) timing(snap *config.Snapshot) (period, window time.Duration) {
	period, window = 5*time.Second, time.Minute
	if t := snap.Topology; t != nil && t.Spec.Routing != nil && t.Spec.Routing.CanaryAnalysis != nil {
		ca := t.Spec.Routing.CanaryAnalysis
		if ca.Period > 0 {
			period = ca.Period.D()
		}
		if ca.Window > 0 {
			window = ca.Window.D()
		}
	}
	if c.cfg.Period > 0 {
		period = c.cfg.Period
	}
	if c.cfg.Window > 0 {
		window = c.cfg.Window
	}
	return period, window
}

// write records a decision, or logs it when there is no store.
func (c *Canary) write(ctx context.Context, name string, prev config.Rollout, d rewrite.Decision) {
	if c.cfg.Store == nil {
		c.mu.Lock()
		tr := c.tracked[name]
		repeat := tr != nil && tr.unwritten == d.Action
		if tr != nil {
			tr.unwritten = d.Action
		}
		c.mu.Unlock()
		if repeat {
			return // said once for this state
		}
		c.log.Warn("canary: analysis decided a transition but the configuration source is read-only; not written",
			"rewrite", name, "action", d.Action.String(), "reason", d.Reason)
		return
	}
	wctx, cancel := context.WithTimeout(ctx, c.cfg.WriteTimeout)
	defer cancel()
	err := c.cfg.Store.SwapRollout(wctx, name, prev, d.Rollout)
	switch {
	case err == nil:
		c.log.Warn("canary: analysis wrote a rollout transition", "rewrite", name, "action", d.Action.String(),
			"status", d.Rollout.Status, "canaryPercent", d.CanaryPercent, "reason", d.Reason)
	case errors.Is(err, config.ErrConflict):
		c.log.Debug("canary: another writer moved the rollout first", "rewrite", name, "action", d.Action.String())
	default:
		c.log.Error("canary: writing a rollout transition failed; retrying next round", "rewrite", name, "action", d.Action.String(), "error", err)
	}
}

// observe notes the rewrite's rollout as configured now: a change starts a
// new measurement period, is counted and logged, and updates the gauges.
// c.mu is held.
func (c *Canary) observe(name string, mr *config.ModelRewrite, rule int, now time.Time) *tracked {
	ro := *mr.Spec.Rollout
	tr := c.tracked[name]
	status := ro.Status
	if status == "" {
		status = rewrite.StatusProgressing
	}
	var weights []float64
	if rule >= 0 {
		for _, w := range rollout.Shares(mr.Spec.Rules[rule], mr.Spec.Rollout) {
			weights = append(weights, w.Percent)
			c.weight.WithLabelValues(name, w.Target).Set(w.Percent)
		}
	}
	keying := ""
	if sk := mr.Spec.Stickiness; sk != nil {
		keying = sk.Key + "\x00" + sk.Header + "\x00" + sk.Salt
	}
	if tr != nil && rolloutEqual(tr.seen, ro) {
		if tr.keying != keying {
			// Same state, new cohorts (the salt or key changed): measure
			// the split afresh.
			tr.keying, tr.warned = keying, false
			c.r.cohorts.Store(name, &rewrite.Cohort{})
		}
		return tr
	}
	if tr != nil {
		c.trans.WithLabelValues(name, status).Inc()
		c.log.Warn("canary: rollout transition", "rewrite", name, "canary", ro.Canary, "from", statusName(tr.seen), "to", status,
			"step", ro.Step+1, "steps", len(ro.Steps), "weights", weights, "reason", ro.Reason)
	} else {
		c.trans.WithLabelValues(name, status)
		tr = &tracked{}
		c.tracked[name] = tr
	}
	tr.seen, tr.since, tr.samples, tr.unwritten, tr.warned, tr.keying = ro, now, nil, rewrite.Hold, false, keying
	// Each state's split is measured on its own traffic.
	c.r.cohorts.Store(name, &rewrite.Cohort{})
	for _, s := range []string{rewrite.StatusProgressing, rewrite.StatusPaused, rewrite.StatusHealthy, rewrite.StatusDegraded, rewrite.StatusAborted} {
		v := 0.0
		if s == status {
			v = 1
		}
		c.state.WithLabelValues(name, s).Set(v)
	}
	return tr
}

// cohort reports how the rollout's current state split this instance's
// traffic, logging its warning once per state. c.mu is held.
func (c *Canary) cohort(name string, mr *config.ModelRewrite, rule int, tr *tracked) *rollout.Cohort {
	v, ok := c.r.cohorts.Load(name)
	if !ok || rule < 0 {
		return nil
	}
	requests, onCanary, keys := v.(*rewrite.Cohort).Counts()
	co := rollout.NewCohort(rollout.PairPercent(mr.Spec.Rules[rule], mr.Spec.Rollout), requests, onCanary, keys)
	c.share.WithLabelValues(name, "requests").Set(co.RequestPercent)
	c.share.WithLabelValues(name, "keys").Set(co.KeyPercent)
	if co.Warning != "" && !tr.warned {
		tr.warned = true
		c.log.Warn("canary: the stickiness key has too few distinct values for the weight to mean anything",
			"rewrite", name, "weightPercent", co.WeightPercent, "observedRequestPercent", co.RequestPercent,
			"keys", co.Keys, "requests", co.Requests, "warning", co.Warning)
	}
	return &co
}

// observeCohort counts a resolved request towards its rollout's cohort.
func (r *Router) observeCohort(res rewrite.Resolution) {
	if !res.Canary && !res.Stable {
		return
	}
	if v, ok := r.cohorts.Load(res.Rewrite); ok {
		v.(*rewrite.Cohort).Observe(res)
	}
}

// baseline returns the sample the window's measurements start from: the
// newest one taken at or before the window's start, or zero counts when
// the state is younger than every sample. Older samples are dropped.
func (tr *tracked) baseline(now time.Time, window time.Duration) sample {
	cut := now.Add(-window)
	if tr.since.After(cut) {
		// The first sample after the state change is the baseline: what
		// came before belongs to the previous state.
		return tr.samples[0]
	}
	i := sort.Search(len(tr.samples), func(i int) bool { return tr.samples[i].at.After(cut) })
	if i == 0 {
		return tr.samples[0]
	}
	tr.samples = tr.samples[i-1:]
	return tr.samples[0]
}

// stats turns local counters (now minus base) and the target's digests into
// one side's analysis statistics; streamed says to take the local P99 TTFT
// of streamed answers only.
func (c *Canary) stats(target string, clusters []string, now, base counts, streamed bool) rewrite.Stats {
	s := rewrite.Stats{
		Requests:  int64(now.requests - base.requests),
		Errors:    int64(now.errors - base.errors),
		Throttled: int64(now.throttled - base.throttled),
	}
	// A non-streamed answer's first byte is its last: mixed in with
	// first tokens it would make the side whose callers stream less look
	// slower.
	if streamed {
		s.TTFTP99 = now.streamed.p99(base.streamed)
	} else {
		s.TTFTP99 = now.ttft.p99(base.ttft)
	}
	var errRate float64
	var shared time.Duration
	for _, d := range c.r.cfg.Fleet.Digests().Digests() {
		if d.Model != target || (len(clusters) > 0 && !contains(clusters, d.Cluster)) {
			continue
		}
		errRate = max(errRate, d.ErrorRate)
		shared = max(shared, d.TTFTP99)
	}
	if shared > 0 {
		// Tier-1 measures every request of the pool, whoever sent it, and
		// more finely than Tier-2's coarse TTFT buckets.
		s.TTFTP99 = shared
	}
	if e := int64(math.Round(errRate * float64(s.Requests))); e > s.Errors {
		s.Errors = e
	}
	// Errors and 429s come from different sources; keep them consistent.
	s.Errors = min(s.Errors, s.Requests-s.Throttled)
	return s
}

// quantile estimates the q-quantile of a cumulative histogram over
// latencyBuckets (plus +Inf holding n) as histogram_quantile does.
func quantile(q float64, cum []float64, n float64) time.Duration {
	return time.Duration(histogram.Quantile(q, latencyBuckets, cum, n) * float64(time.Second))
}

type sideKey struct{ public, target string }

// collect reads this instance's request counters and TTFT histograms per
// public name and target.
func (c *Canary) collect() map[sideKey]counts {
	out := map[sideKey]counts{}
	for _, m := range gather(c.r.m.requests) {
		k := sideKey{label(m, "model_name"), label(m, "target_model_name")}
		code, _ := strconv.Atoi(label(m, "code"))
		v := m.GetCounter().GetValue()
		cur := out[k]
		cur.requests += v
		switch {
		case code == http.StatusTooManyRequests:
			cur.throttled += v
		case code >= 500:
			cur.errors += v
		}
		out[k] = cur
	}
	for _, m := range gather(c.r.m.ttft) {
		k := sideKey{label(m, "model_name"), label(m, "target_model_name")}
		cur := out[k]
		cur.ttft.add(m.GetHistogram())
		if label(m, "stream") == "true" {
			cur.streamed.add(m.GetHistogram())
		}
		out[k] = cur
	}
	return out
}

func gather(col prometheus.Collector) []*dto.Metric {
	ch := make(chan prometheus.Metric, 64)
	go func() { col.Collect(ch); close(ch) }()
	var out []*dto.Metric
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) == nil {
			out = append(out, &d)
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Latest returns every rollout's latest analysis, sorted by rewrite.
func (c *Canary) Latest() []rollout.Live {
	c.mu.Lock()
	out := make([]rollout.Live, 0, len(c.latest))
	for _, l := range c.latest {
		out = append(out, l)
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Rewrite < out[j].Rewrite })
	return out
}

// ServeHTTP answers GET /meridian/canary with Latest as JSON.
func (c *Canary) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(c.Latest())
}

func side(target string, s rewrite.Stats) rollout.Side {
	return rollout.Side{Target: target, Requests: s.Requests, Errors: s.Errors, Throttled: s.Throttled,
		TTFTP99Ms: float64(s.TTFTP99) / float64(time.Millisecond)}
}

// ruleHolding returns the index of the rule holding ro's canary, or -1.
func ruleHolding(mr *config.ModelRewrite, ro *config.Rollout) int {
	for i, rl := range mr.Spec.Rules {
		for _, t := range rl.Targets {
			if t.ModelRewrite == ro.Canary {
				return i
			}
		}
	}
	return -1
}

// publicName is the first exact model match of a rule (the name callers
// use, and the model_name label of the request metrics).
func publicName(mr *config.ModelRewrite, rule int) string {
	if rule < 0 {
		return ""
	}
	for _, m := range mr.Spec.Rules[rule].Matches {
		if m.Model != nil {
			return m.Model.Value
		}
	}
	return ""
}

func statusName(ro config.Rollout) string {
	if ro.Status == "" {
		return rewrite.StatusProgressing
	}
	return ro.Status
}

func rolloutEqual(a, b config.Rollout) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
