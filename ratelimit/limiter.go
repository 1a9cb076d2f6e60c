package ratelimit

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/meridian-router/meridian/config"
	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a request is rejected: which of the tenant's limits ran out.
const (
	ReasonRequests      = "requests"
	ReasonTokens        = "tokens"
	ReasonModelRequests = "model_requests"
	ReasonModelTokens   = "model_tokens"
	ReasonBandRequests  = "band_requests"
	ReasonBandTokens    = "band_tokens"
)

// Request is what one decision is about.
type Request struct {
	Tenant string
	// Model is the target model after rewrites; per-model limits match it.
	Model string
	// Band is the priority band (config.BandCritical, ...); per-band limits
	// match it. Empty means config.BandStandard; any other value matches no
	// per-band limit.
	Band string
	// Tokens is the estimate charged to token limits at admission: prompt
	// tokens plus the maximum output tokens. Negative counts as zero.
	Tokens int64
}

// Decision is the answer for one request, with what Tier-2 needs to write
// OpenAI's rate-limit headers and, on rejection, a 429 with Retry-After.
type Decision struct {
	Allowed bool
	// Reason names the limit that rejected the request (one of the Reason
	// constants); empty when Allowed.
	Reason string
	// RetryAfter is how long until every exhausted limit would admit this
	// request, from the local buckets' levels and refill rates (a share
	// that grows, or tokens another instance returns, can only shorten
	// it). Zero when Allowed.
	RetryAfter time.Duration
	// Requests and Tokens describe the most constraining limit of each kind
	// that applies to the request; Limit is zero when none does.
	Requests Quota
	Tokens   Quota
	// Ticket reconciles the token estimate with real usage; pass it to
	// Limiter.Settle exactly once when the response ends. Zero when no
	// token limit applies or the request was rejected.
	Ticket Ticket
}

// Quota is one limit as OpenAI's x-ratelimit-* headers describe it.
type Quota struct {
	// Limit is the configured global limit, in units per its period.
	Limit int64
	// Remaining estimates the units left globally, capped at the burst:
	// this instance's level plus its peers' levels as they reported them
	// at the last sync (each advanced by its refill up to that sync). With
	// no time passing it only falls from one decision on this instance to
	// the next. It is 0 on a limit that rejected the request.
	Remaining int64
	// Reset is how long until the limit is back to its full burst, at the
	// global rate, from Remaining.
	Reset time.Duration
}

// Headers calls set for each of OpenAI's rate-limit headers the decision
// carries, and for retry-after (whole seconds, rounded up) and
// retry-after-ms (milliseconds, rounded up; the OpenAI SDKs prefer it)
// when it is a rejection. Tier-2 passes http.Header.Set.
//
// The values are formatted into one string (one allocation for all eight:
// this runs on every request).
func (d *Decision) Headers(set func(key, value string)) {
	var buf [256]byte
	var ends [8]int
	b, n := buf[:0], 0
	end := func() { ends[n] = len(b); n++ }
	quotas := [2]*Quota{&d.Requests, &d.Tokens}
	for _, q := range quotas {
		if q.Limit > 0 {
			b = strconv.AppendInt(b, q.Limit, 10)
			end()
			b = strconv.AppendInt(b, q.Remaining, 10)
			end()
			b = appendReset(b, q.Reset)
			end()
		}
	}
	if !d.Allowed {
		b = strconv.AppendInt(b, retryAfterSeconds(d.RetryAfter), 10)
		end()
		b = strconv.AppendInt(b, retryAfterMillis(d.RetryAfter), 10)
		end()
	}
	s, from, i := string(b), 0, 0
	next := func(key string) {
		set(key, s[from:ends[i]])
		from = ends[i]
		i++
	}
	for k, q := range quotas {
		if q.Limit > 0 {
			for _, key := range quotaHeaders[k] {
				next(key)
			}
		}
	}
	if !d.Allowed {
		next("retry-after")
		next("retry-after-ms")
	}
}

// AppendHeaders appends the header lines Headers sets ("Key: value\r\n",
// keys in canonical form) to b, without allocating: a front door that
// writes its response heads itself puts them there directly.
func (d *Decision) AppendHeaders(b []byte) []byte {
	for k, q := range [2]*Quota{&d.Requests, &d.Tokens} {
		if q.Limit <= 0 {
			continue
		}
		names := &canonicalQuotaHeaders[k]
		b = append(append(b, names[0]...), ": "...)
		b = append(strconv.AppendInt(b, q.Limit, 10), "\r\n"...)
		b = append(append(b, names[1]...), ": "...)
		b = append(strconv.AppendInt(b, q.Remaining, 10), "\r\n"...)
		b = append(append(b, names[2]...), ": "...)
		b = append(appendReset(b, q.Reset), "\r\n"...)
	}
	if !d.Allowed {
		b = append(b, "Retry-After: "...)
		b = append(strconv.AppendInt(b, retryAfterSeconds(d.RetryAfter), 10), "\r\n"...)
		b = append(b, "Retry-After-Ms: "...)
		b = append(strconv.AppendInt(b, retryAfterMillis(d.RetryAfter), 10), "\r\n"...)
	}
	return b
}

// canonicalQuotaHeaders are quotaHeaders as http.CanonicalHeaderKey
// writes them.
var canonicalQuotaHeaders = [2][3]string{
	{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
	{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"},
}

// quotaHeaders name the requests' and the tokens' limit, remaining and
// reset headers.
var quotaHeaders = [2][3]string{
	{"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"},
	{"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"},
}

// formatReset writes a duration the way OpenAI does ("1s", "6m0s", "20ms"),
// rounded up to the millisecond.
func formatReset(d time.Duration) string { return string(appendReset(nil, d)) }

// appendReset appends formatReset's text: d rounded up to the millisecond
// as time.Duration.String writes it.
func appendReset(b []byte, d time.Duration) []byte {
	if d <= 0 {
		return append(b, "0s"...)
	}
	ms := uint64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	if ms < 1000 {
		b = strconv.AppendUint(b, ms, 10)
		return append(b, "ms"...)
	}
	secs, frac := ms/1000, ms%1000
	if h := secs / 3600; h > 0 {
		b = strconv.AppendUint(b, h, 10)
		b = append(b, 'h')
	}
	if secs >= 60 {
		b = strconv.AppendUint(b, secs/60%60, 10)
		b = append(b, 'm')
	}
	b = strconv.AppendUint(b, secs%60, 10)
	if frac > 0 {
		b = append(b, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
		for b[len(b)-1] == '0' {
			b = b[:len(b)-1]
		}
	}
	return append(b, 's')
}

func retryAfterMillis(d time.Duration) int64 {
	ms := int64((d + time.Millisecond - 1) / time.Millisecond)
	if ms < 1 {
		return 1
	}
	return ms
}

func retryAfterSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		return 1
	}
	return s
}

// Ticket remembers which buckets an admission charged and by how much:
// token buckets (lims) for Settle, request buckets (reqs) for Refund.
type Ticket struct {
	t        *tenant
	lims     [3]*limit
	reqs     [3]*limit
	estimate float64
}

// Limiter decides, locally and without blocking on the network, whether a
// tenant's request fits its global limits. It is safe for concurrent use.
type Limiter struct {
	cfg     Config
	metrics *metrics
	tenants atomic.Pointer[map[string]*tenant]

	updateMu sync.Mutex // serialises Update and Sync

	viewMu   sync.Mutex // guards the fields below
	started  time.Time
	heard    bool // some peer has reported since start
	peers    map[string]*peer
	seq      uint64
	lastSync time.Time
	own      [][]byte // this instance's last report, encoded in parts
	leaving  bool
	mergeErr error // last payload that failed to decode, for tests
}

// New returns a Limiter with no tenants; call Update to give it limits.
func New(cfg Config) (*Limiter, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	l := &Limiter{cfg: cfg, metrics: m, started: cfg.Now(), peers: map[string]*peer{}}
	empty := map[string]*tenant{}
	l.tenants.Store(&empty)
	return l, nil
}

// kind is what a limit counts.
type kind uint8

const (
	requests kind = iota
	tokens
)

func (k kind) String() string {
	if k == tokens {
		return "tokens"
	}
	return "requests"
}

// tenant holds every limit of one tenant. It outlives config updates that
// keep the tenant, so bucket state survives reloads.
type tenant struct {
	name string
	mu   sync.Mutex // guards everything below

	all      []*limit // every limit, in a stable order
	byKey    map[string]*limit
	overall  scope
	models   map[string]scope
	bands    [3]scope // indexed by bandIndex
	admitted prometheus.Counter
	usedReq  prometheus.Counter
	usedTok  prometheus.Counter
}

// scope is the requests and tokens limits of one slice of a tenant's
// traffic; either may be nil.
type scope struct{ req, tok *limit }

// limit is one global limit and this instance's slice of it.
type limit struct {
	key    string // stable name: tenant, scope, kind
	hash   uint64 // xxhash of key: the limit's name on the wire
	scope  string // "tenant", "model:<name>" or "band:<name>"
	kind   kind
	reason string

	rate   config.Rate
	perSec float64 // global units per second
	burst  float64 // global burst, units

	share float64 // this instance's fraction of the limit
	b     bucket
	// fresh is true until the first sync that divides the limit from the
	// peers' reports: until then the share is a guess, and the slice is
	// resized keeping only what was spent from it, so a new limit or
	// instance starts with the burst available.
	fresh bool
	// shadow is the whole global limit as if this instance held it alone.
	// Demand counts the units it would admit, so refused retries beyond
	// the limit's rate claim no share.
	shadow  bucket
	pending float64 // units the shadow admitted since the last sync
	sample  float64 // pending per second over the last sync interval
	// lastUnits is the size of the last request decided: what a bucket
	// that gives its surplus away keeps to serve the next one.
	lastUnits float64
	demand    float64 // EWMA of pending per second
	// prevDemand is demand before the last fold: what the peers last
	// heard (or, unreported, about zero).
	prevDemand float64
	// others is what the peers' buckets held at the last sync, as they
	// reported it (advanced by their refill): with b.level, the global
	// level the headers report.
	others float64
	// released counts, over this limit's life here, the units this
	// instance gave back to the pool because its slice shrank or it left;
	// peers take them up in proportion to their shares.
	released    float64
	reportedRel float64 // released as of the last report sent
	// relWindow holds what each of the last releaseWindow syncs released
	// (relAt the newest): reports repeat their sum for a peer that missed
	// the report of the release.
	relWindow [releaseWindow]float64
	relAt     int

	rejected prometheus.Counter
	shareG   prometheus.Gauge
}

func bandIndex(b string) int {
	switch b {
	case config.BandCritical:
		return 0
	case config.BandStandard, "":
		return 1
	case config.BandSheddable:
		return 2
	}
	return -1
}

// Update replaces the tenants and their limits. Limits whose tenant, scope
// and kind are unchanged keep their bucket level, share and demand even
// when their rate changes; tenants and limits that disappear are dropped.
// It checks every limit first and changes nothing on error.
func (l *Limiter) Update(tenants map[string]*config.Tenant) error {
	names := make([]string, 0, len(tenants))
	for name, t := range tenants {
		if t == nil {
			return fmt.Errorf("ratelimit: tenants[%q]: nil tenant", name)
		}
		if err := validateLimits(t.Spec.Limits); err != nil {
			return fmt.Errorf("ratelimit: tenants[%q]: %w", name, err)
		}
		names = append(names, name)
	}
	sort.Strings(names)

	l.updateMu.Lock()
	defer l.updateMu.Unlock()
	now := l.cfg.Now()
	initial := l.initialShare(now)
	old := *l.tenants.Load()
	next := make(map[string]*tenant, len(tenants))
	for _, name := range names {
		t := old[name]
		if t == nil {
			t = &tenant{
				name:     name,
				byKey:    map[string]*limit{},
				admitted: l.metrics.admitted.WithLabelValues(name),
				usedReq:  l.metrics.usage.WithLabelValues(name, "requests"),
				usedTok:  l.metrics.usage.WithLabelValues(name, "tokens"),
			}
		}
		l.apply(t, tenants[name].Spec.Limits, now.UnixNano(), initial)
		next[name] = t
	}
	for name, t := range old {
		if next[name] == nil {
			l.metrics.forgetTenant(t)
		}
	}
	l.tenants.Store(&next)
	return nil
}

func validateLimits(tl config.TenantLimit) error {
	check := func(path string, r *config.Rate) error {
		if r == nil {
			return nil
		}
		switch {
		case r.Limit <= 0:
			return fmt.Errorf("spec.limits.%s.limit: %d is not positive", path, r.Limit)
		case r.Per <= 0:
			return fmt.Errorf("spec.limits.%s.per: %v is not positive", path, r.Per.D())
		case r.Burst < 0:
			return fmt.Errorf("spec.limits.%s.burst: %d is negative", path, r.Burst)
		}
		return nil
	}
	if err := check("requests", tl.Requests); err != nil {
		return err
	}
	if err := check("tokens", tl.Tokens); err != nil {
		return err
	}
	for i, m := range tl.PerModel {
		if m.Model == "" {
			return fmt.Errorf("spec.limits.perModel[%d].model: required", i)
		}
		if err := check(fmt.Sprintf("perModel[%d].requests", i), m.Requests); err != nil {
			return err
		}
		if err := check(fmt.Sprintf("perModel[%d].tokens", i), m.Tokens); err != nil {
			return err
		}
	}
	for i, b := range tl.PerBand {
		if bandIndex(b.Band) < 0 || b.Band == "" {
			return fmt.Errorf("spec.limits.perBand[%d].band: %q is not Critical, Standard or Sheddable", i, b.Band)
		}
		if err := check(fmt.Sprintf("perBand[%d].requests", i), b.Requests); err != nil {
			return err
		}
		if err := check(fmt.Sprintf("perBand[%d].tokens", i), b.Tokens); err != nil {
			return err
		}
	}
	return nil
}

// apply rebuilds t's limits from tl, reusing limits by key.
func (l *Limiter) apply(t *tenant, tl config.TenantLimit, now int64, initial float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	keep := make(map[string]*limit, len(t.byKey))
	var all []*limit
	get := func(sc string, k kind, reason string, r *config.Rate) *limit {
		if r == nil {
			return nil
		}
		key := t.name + "\x00" + sc + "\x00" + k.String()
		lim := t.byKey[key]
		if lim == nil {
			lim = &limit{
				key: key, hash: xxhash.Sum64String(key), scope: sc, kind: k, reason: reason,
				share:    initial,
				rejected: l.metrics.rejected.WithLabelValues(t.name, reason),
				shareG:   l.metrics.share.WithLabelValues(t.name, sc, k.String()),
			}
			lim.b.last, lim.shadow.last, lim.fresh = now, now, true
			lim.setRate(*r)
			// A new limit starts with the burst available: this slice full,
			// and the rest presumed full on the peers until they report.
			lim.b.level, lim.shadow.level = lim.b.burst, lim.burst
			lim.others = lim.burst - lim.b.burst
		} else {
			lim.b.advance(now)
			lim.shadow.advance(now)
			lim.setRate(*r)
		}
		lim.shareG.Set(lim.share)
		keep[key] = lim
		all = append(all, lim)
		return lim
	}
	t.overall = scope{
		req: get("tenant", requests, ReasonRequests, tl.Requests),
		tok: get("tenant", tokens, ReasonTokens, tl.Tokens),
	}
	t.models = make(map[string]scope, len(tl.PerModel))
	for _, m := range tl.PerModel {
		sc := "model:" + m.Model
		t.models[m.Model] = scope{
			req: get(sc, requests, ReasonModelRequests, m.Requests),
			tok: get(sc, tokens, ReasonModelTokens, m.Tokens),
		}
	}
	t.bands = [3]scope{}
	for _, b := range tl.PerBand {
		sc := "band:" + b.Band
		t.bands[bandIndex(b.Band)] = scope{
			req: get(sc, requests, ReasonBandRequests, b.Requests),
			tok: get(sc, tokens, ReasonBandTokens, b.Tokens),
		}
	}
	for key, lim := range t.byKey {
		if keep[key] == nil {
			l.metrics.forgetLimit(t.name, lim)
		}
	}
	t.byKey, t.all = keep, all
}

// setRate applies a (new) global rate, keeping the share and the level.
func (lim *limit) setRate(r config.Rate) {
	lim.rate = r
	lim.perSec = float64(r.Limit) / r.Per.D().Seconds()
	lim.burst = float64(r.Burst)
	if r.Burst == 0 {
		lim.burst = float64(r.Limit)
	}
	lim.b.resize(lim.perSec*lim.share, lim.burst*lim.share)
	lim.shadow.resize(lim.perSec, lim.burst)
}

// global is the level of the whole limit this instance knows of: its own
// bucket and its peers' as of the last sync, capped at the burst.
func (lim *limit) global() float64 {
	return math.Min(lim.b.level+lim.others, lim.burst)
}

// quota describes the limit for headers with left units remaining
// globally: the time the global rate takes to fill the rest is the reset.
func (lim *limit) quota(left float64) Quota {
	q := Quota{Limit: lim.rate.Limit, Reset: rateDuration(lim.burst-math.Max(lim.global(), 0), lim.perSec)}
	if left > 0 {
		q.Remaining = int64(left)
	}
	return q
}

// units is what one request costs this limit: 1, or the token estimate.
func (lim *limit) units(est float64) float64 {
	if lim.kind == tokens {
		return est
	}
	return 1
}

// Allow decides one request now. See AllowAt.
func (l *Limiter) Allow(r Request) Decision {
	return l.AllowAt(l.cfg.Now(), r)
}

// AllowAt decides one request at now. A tenant without limits, or unknown
// to the Limiter, is allowed with empty quotas. Otherwise every limit that
// applies (overall, the model's, the band's; requests and tokens) must have
// room, and an admission charges one request and r.Tokens tokens to each.
// It takes one tenant-wide lock and never allocates or blocks on I/O.
func (l *Limiter) AllowAt(now time.Time, r Request) Decision {
	t := (*l.tenants.Load())[r.Tenant]
	if t == nil {
		return Decision{Allowed: true}
	}
	ns := now.UnixNano()
	est := float64(r.Tokens)
	if est < 0 {
		est = 0
	}

	t.mu.Lock()
	var set [6]*limit
	n := 0
	add := func(s scope) {
		if s.req != nil {
			set[n] = s.req
			n++
		}
		if s.tok != nil {
			set[n] = s.tok
			n++
		}
	}
	add(t.overall)
	if len(t.models) > 0 {
		if s, ok := t.models[r.Model]; ok {
			add(s)
		}
	}
	if i := bandIndex(r.Band); i >= 0 {
		add(t.bands[i])
	}

	var d Decision
	var rejected *limit
	for _, lim := range set[:n] {
		units := lim.units(est)
		lim.lastUnits = units
		lim.b.advance(ns)
		lim.shadow.advance(ns)
		if lim.shadow.fits(units) {
			lim.shadow.level -= units
			lim.pending += units
		}
		if !lim.b.fits(units) {
			if rejected == nil {
				rejected = lim
			}
			if w := lim.b.wait(units); w > d.RetryAfter {
				d.RetryAfter = w
			}
		}
	}
	d.Allowed = rejected == nil
	if d.Allowed {
		d.RetryAfter = 0
		d.Ticket.t, d.Ticket.estimate = t, est
		nt, nr := 0, 0
		for _, lim := range set[:n] {
			if lim.kind == tokens {
				lim.b.level -= est
				d.Ticket.lims[nt] = lim
				nt++
			} else {
				lim.b.level--
				d.Ticket.reqs[nr] = lim
				nr++
			}
		}
		if nt+nr == 0 {
			d.Ticket = Ticket{}
		}
	} else {
		d.Reason = rejected.reason
	}
	// The headers describe, per kind, the limit with the least left; a
	// limit that refused the request has nothing the caller can use.
	var least [2]*limit
	var left [2]float64
	for _, lim := range set[:n] {
		g := lim.global()
		if !d.Allowed && !lim.b.fits(lim.units(est)) {
			g = 0
		}
		if least[lim.kind] == nil || g < left[lim.kind] {
			least[lim.kind], left[lim.kind] = lim, g
		}
	}
	if lim := least[requests]; lim != nil {
		d.Requests = lim.quota(left[requests])
	}
	if lim := least[tokens]; lim != nil {
		d.Tokens = lim.quota(left[tokens])
	}
	t.mu.Unlock()

	if d.Allowed {
		t.admitted.Inc()
		if n > 0 {
			t.usedReq.Inc()
		}
	} else {
		rejected.rejected.Inc()
	}
	return d
}

// Settle reconciles an admission's token estimate with the tokens it really
// used (prompt plus completion from the response's usage; for a stream cut
// short, the prompt plus the tokens delivered before the cut). The
// difference is returned to, or further charged to, every token bucket the
// admission charged, so the tokens budget tracks real usage and does not
// drift. Call it exactly once per admitted Decision; a zero Ticket is a
// no-op. Negative used counts as zero.
func (l *Limiter) Settle(tk Ticket, used int64) {
	l.SettleAt(l.cfg.Now(), tk, used)
}

// Refund gives back everything an admission charged, for a request that
// was admitted but never served (no cluster could take it, every cluster
// failed before responding, the body could not be forwarded): one unit to
// every request bucket and the whole estimate to every token bucket. Call
// it instead of Settle, exactly once; a zero Ticket is a no-op.
func (l *Limiter) Refund(tk Ticket) {
	l.RefundAt(l.cfg.Now(), tk)
}

// RefundAt is Refund at a given time.
func (l *Limiter) RefundAt(now time.Time, tk Ticket) {
	if tk.t == nil {
		return
	}
	ns := now.UnixNano()
	tk.t.mu.Lock()
	for _, lim := range tk.reqs {
		if lim == nil {
			break
		}
		lim.b.advance(ns)
		lim.b.level = math.Min(lim.b.level+1, lim.b.burst)
		lim.shadow.advance(ns)
		lim.shadow.level = math.Min(lim.shadow.level+1, lim.shadow.burst)
		lim.pending--
	}
	tk.t.mu.Unlock()
	l.SettleAt(now, tk, 0)
}

// SettleAt is Settle at a given time.
func (l *Limiter) SettleAt(now time.Time, tk Ticket, used int64) {
	if tk.t == nil || tk.lims[0] == nil {
		return
	}
	u := float64(used)
	if u < 0 {
		u = 0
	}
	delta := tk.estimate - u // positive: refund
	ns := now.UnixNano()
	tk.t.mu.Lock()
	for _, lim := range tk.lims {
		if lim == nil {
			break
		}
		lim.b.advance(ns)
		lim.b.level = math.Min(lim.b.level+delta, lim.b.burst)
		lim.shadow.advance(ns)
		lim.shadow.level = math.Min(lim.shadow.level+delta, lim.shadow.burst)
		lim.pending -= delta
	}
	tk.t.mu.Unlock()
	tk.t.usedTok.Add(u)
}
