package ratelimit

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives its test: the
// Limiter's Run and everything the memberlist tests start. memberlist lets
// a probe already in flight finish by its own timeout after Shutdown (as
// tier2/gossip's leak test notes); that one is ignored.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

// clock is a fake clock advanced by hand.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) Advance(d time.Duration) { c.now = c.now.Add(d) }

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func rate(limit int64, per time.Duration, burst int64) *config.Rate {
	return &config.Rate{Limit: limit, Per: config.Duration(per), Burst: burst}
}

func tenantWith(lim config.TenantLimit) *config.Tenant {
	return &config.Tenant{Kind: config.KindTenant, Spec: config.TenantSpec{Limits: lim}}
}

// alone returns a Limiter that has concluded it has no peers.
func alone(t *testing.T, c *clock, tenants map[string]*config.Tenant) *Limiter {
	t.Helper()
	cfg := DefaultConfig("solo")
	cfg.Now = c.Now
	cfg.Warmup = time.Nanosecond
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Millisecond)
	if err := l.Update(tenants); err != nil {
		t.Fatal(err)
	}
	l.Sync()
	return l
}

func TestSingleInstanceExact(t *testing.T) {
	cases := []struct {
		name          string
		r             *config.Rate
		every         time.Duration // one request per
		span          time.Duration
		wantAdmitted  int
		wantFirstDeny int // index of the first rejected request
	}{
		// 60/min with a burst of 10: 10 at once, then one a second; the
		// last request goes at 9.9s, so 9 refills.
		{"burst then rate", rate(60, time.Minute, 10), 100 * time.Millisecond, 10 * time.Second, 10 + 9, 10},
		// Zero burst means a full period's worth: 5, then 5/s for 1.99s.
		{"default burst", rate(5, time.Second, 0), 10 * time.Millisecond, 2 * time.Second, 5 + 9, 5},
		{"slower than the limit", rate(100, time.Second, 1), 20 * time.Millisecond, time.Second, 50, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &clock{now: epoch}
			l := alone(t, c, map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{Requests: tc.r})})
			admitted, firstDeny := 0, -1
			n := int(tc.span / tc.every)
			for i := range n {
				d := l.Allow(Request{Tenant: "acme"})
				if d.Allowed {
					admitted++
				} else if firstDeny < 0 {
					firstDeny = i
				}
				c.Advance(tc.every)
			}
			if admitted != tc.wantAdmitted || firstDeny != tc.wantFirstDeny {
				t.Fatalf("admitted %d (first denial at %d), want %d (first denial at %d)",
					admitted, firstDeny, tc.wantAdmitted, tc.wantFirstDeny)
			}
		})
	}
}

func TestUnknownTenantAndNoLimits(t *testing.T) {
	c := &clock{now: epoch}
	l := alone(t, c, map[string]*config.Tenant{"free": tenantWith(config.TenantLimit{})})
	for _, name := range []string{"free", "nobody"} {
		d := l.Allow(Request{Tenant: name, Tokens: 1 << 40})
		if !d.Allowed || d.Requests.Limit != 0 || d.Tokens.Limit != 0 {
			t.Errorf("%s: got %+v, want allowed with no quotas", name, d)
		}
		var headers []string
		d.Headers(func(k, v string) { headers = append(headers, k) })
		if len(headers) != 0 {
			t.Errorf("%s: headers %v, want none", name, headers)
		}
	}
}

func TestAllScopesMustAllow(t *testing.T) {
	c := &clock{now: epoch}
	l := alone(t, c, map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{
		Requests: rate(100, time.Minute, 0),
		Tokens:   rate(100000, time.Minute, 0),
		PerModel: []config.ModelRate{{Model: "big", Requests: rate(2, time.Minute, 0)}},
		PerBand:  []config.BandRate{{Band: config.BandSheddable, Tokens: rate(1000, time.Minute, 0)}},
	})})
	steps := []struct {
		req        Request
		wantAllow  bool
		wantReason string
	}{
		{Request{Tenant: "acme", Model: "big", Tokens: 10}, true, ""},
		{Request{Tenant: "acme", Model: "big", Tokens: 10}, true, ""},
		{Request{Tenant: "acme", Model: "big", Tokens: 10}, false, ReasonModelRequests},
		{Request{Tenant: "acme", Model: "small", Tokens: 10}, true, ""},
		{Request{Tenant: "acme", Band: config.BandSheddable, Tokens: 900}, true, ""},
		{Request{Tenant: "acme", Band: config.BandSheddable, Tokens: 200}, false, ReasonBandTokens},
		{Request{Tenant: "acme", Band: config.BandCritical, Tokens: 200}, true, ""},
	}
	for i, s := range steps {
		d := l.Allow(s.req)
		if d.Allowed != s.wantAllow || d.Reason != s.wantReason {
			t.Fatalf("step %d: allowed=%v reason=%q, want %v %q", i, d.Allowed, d.Reason, s.wantAllow, s.wantReason)
		}
	}
	// The rejected model request charged nothing anywhere: the overall
	// requests bucket holds 100 - 5 admitted.
	d := l.Allow(Request{Tenant: "acme", Model: "small"})
	if d.Requests.Remaining != 100-6 {
		t.Fatalf("remaining requests %d, want %d", d.Requests.Remaining, 100-6)
	}
}

func TestHeadersAndRetryAfter(t *testing.T) {
	c := &clock{now: epoch}
	l := alone(t, c, map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{
		Requests: rate(60, time.Minute, 2),
		Tokens:   rate(6000, time.Minute, 0),
	})})
	d := l.Allow(Request{Tenant: "acme", Tokens: 1000})
	got := map[string]string{}
	d.Headers(func(k, v string) { got[k] = v })
	want := map[string]string{
		"x-ratelimit-limit-requests":     "60",
		"x-ratelimit-remaining-requests": "1",
		"x-ratelimit-reset-requests":     "1s", // one request at 1/s
		"x-ratelimit-limit-tokens":       "6000",
		"x-ratelimit-remaining-tokens":   "5000",
		"x-ratelimit-reset-tokens":       "10s", // 1000 tokens at 100/s
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if _, ok := got["retry-after"]; ok {
		t.Errorf("retry-after on an admission")
	}

	l.Allow(Request{Tenant: "acme"})
	c.Advance(250 * time.Millisecond)
	d = l.Allow(Request{Tenant: "acme"})
	if d.Allowed || d.Reason != ReasonRequests {
		t.Fatalf("third request: %+v, want rejected by requests", d)
	}
	if d.RetryAfter != 750*time.Millisecond {
		t.Errorf("RetryAfter %v, want 750ms", d.RetryAfter)
	}
	got = map[string]string{}
	d.Headers(func(k, v string) { got[k] = v })
	if got["retry-after"] != "1" {
		t.Errorf("retry-after %q, want 1 (rounded up)", got["retry-after"])
	}

	// Both kinds exhausted: Retry-After waits for the later one.
	d = l.Allow(Request{Tenant: "acme", Tokens: 5900})
	if d.Allowed || d.RetryAfter < time.Second {
		t.Errorf("tokens and requests exhausted: %+v, want rejected with RetryAfter ≥ 1s", d)
	}
}

func TestTokenReconciliation(t *testing.T) {
	c := &clock{now: epoch}
	// 6000 tokens a minute (100/s), burst 6000; requests unlimited.
	l := alone(t, c, map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{Tokens: rate(6000, time.Minute, 0)})})
	remaining := func() int64 { return l.Allow(Request{Tenant: "acme", Tokens: 0}).Tokens.Remaining }

	cases := []struct {
		name          string
		estimate      int64
		used          int64
		wantRemaining int64
	}{
		{"refund the unused estimate", 4000, 1500, 4500},
		{"charge beyond the estimate", 1000, 2500, 2000},
		{"stream cut short: prompt plus delivered", 1500, 300, 1700},
	}
	for _, tc := range cases {
		d := l.Allow(Request{Tenant: "acme", Tokens: tc.estimate})
		if !d.Allowed {
			t.Fatalf("%s: rejected: %+v", tc.name, d)
		}
		l.Settle(d.Ticket, tc.used)
		if got := remaining(); got != tc.wantRemaining {
			t.Fatalf("%s: remaining %d, want %d", tc.name, got, tc.wantRemaining)
		}
	}

	// Over a long run at a demand far above the limit, the real tokens
	// admitted match the limit, not the estimates.
	c.Advance(time.Minute) // full again
	var used int64
	for range 6000 { // 10 minutes, a request every 100ms
		d := l.Allow(Request{Tenant: "acme", Tokens: 400})
		if d.Allowed {
			l.Settle(d.Ticket, 100)
			used += 100
		}
		c.Advance(100 * time.Millisecond)
	}
	want := int64(6000 + 6000*10) // burst plus ten minutes
	if used < want-400 || used > want+100 {
		t.Fatalf("real tokens admitted %d, want %d (the estimate is 4× usage, so drift would show as ~4× less)", used, want)
	}
	// No drift: idle for a period, the bucket is exactly full again.
	c.Advance(time.Minute)
	if got := remaining(); got != 6000 {
		t.Fatalf("after idling, remaining %d, want 6000", got)
	}
	// A zero ticket (rejection) settles to nothing.
	l.Settle(Ticket{}, 1e9)
	if got := remaining(); got != 6000 {
		t.Fatalf("zero ticket changed the bucket: %d", got)
	}
}

func TestLargeRequestGoesIntoDebt(t *testing.T) {
	c := &clock{now: epoch}
	l := alone(t, c, map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{Tokens: rate(100, time.Second, 100)})})
	// 500 tokens exceed the burst: admitted only from a full bucket, and
	// the debt is paid back at the refill rate.
	if d := l.Allow(Request{Tenant: "acme", Tokens: 500}); !d.Allowed {
		t.Fatalf("full bucket rejected an oversize request: %+v", d)
	}
	d := l.Allow(Request{Tenant: "acme", Tokens: 1})
	if d.Allowed || d.RetryAfter != 4010*time.Millisecond {
		t.Fatalf("in debt: %+v, want rejected with RetryAfter 4.01s", d)
	}
	c.Advance(4010 * time.Millisecond)
	if d := l.Allow(Request{Tenant: "acme", Tokens: 1}); !d.Allowed {
		t.Fatalf("debt paid but rejected: %+v", d)
	}
}

func TestUpdateLive(t *testing.T) {
	c := &clock{now: epoch}
	spec := func(req int64) map[string]*config.Tenant {
		return map[string]*config.Tenant{
			"acme":  tenantWith(config.TenantLimit{Requests: rate(req, time.Minute, 10), Tokens: rate(1000, time.Minute, 0)}),
			"other": tenantWith(config.TenantLimit{Requests: rate(5, time.Minute, 0)}),
		}
	}
	l := alone(t, c, spec(60))
	for range 8 {
		l.Allow(Request{Tenant: "acme", Tokens: 100})
	}
	// Same limits reloaded: state kept.
	if err := l.Update(spec(60)); err != nil {
		t.Fatal(err)
	}
	d := l.Allow(Request{Tenant: "acme"})
	if d.Requests.Remaining != 1 || d.Tokens.Remaining != 200 {
		t.Fatalf("after an identical reload: %+v, want 1 request and 200 tokens left", d)
	}
	// The requests rate changes: the level carries over, the new rate applies.
	if err := l.Update(spec(600)); err != nil {
		t.Fatal(err)
	}
	c.Advance(100 * time.Millisecond) // one request at 10/s
	d = l.Allow(Request{Tenant: "acme"})
	if !d.Allowed || d.Requests.Limit != 600 || d.Requests.Remaining != 1 {
		t.Fatalf("after raising the rate: %+v, want allowed, limit 600, 1 left", d)
	}
	// A tenant removed is unlimited; added back it starts fresh.
	if err := l.Update(map[string]*config.Tenant{"acme": spec(600)["acme"]}); err != nil {
		t.Fatal(err)
	}
	if d := l.Allow(Request{Tenant: "other"}); !d.Allowed || d.Requests.Limit != 0 {
		t.Fatalf("removed tenant: %+v, want unlimited", d)
	}
}

func TestUpdateRejectsBadLimits(t *testing.T) {
	c := &clock{now: epoch}
	l := alone(t, c, map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{Requests: rate(1, time.Minute, 0)})})
	cases := []struct {
		name string
		lim  config.TenantLimit
		want string
	}{
		{"zero limit", config.TenantLimit{Requests: rate(0, time.Minute, 0)}, "spec.limits.requests.limit"},
		{"zero period", config.TenantLimit{Tokens: rate(5, 0, 0)}, "spec.limits.tokens.per"},
		{"negative burst", config.TenantLimit{PerModel: []config.ModelRate{{Model: "m", Requests: rate(5, time.Second, -1)}}}, "perModel[0].requests.burst"},
		{"model without name", config.TenantLimit{PerModel: []config.ModelRate{{Requests: rate(5, time.Second, 0)}}}, "perModel[0].model"},
		{"unknown band", config.TenantLimit{PerBand: []config.BandRate{{Band: "Urgent", Requests: rate(5, time.Second, 0)}}}, "perBand[0].band"},
	}
	for _, tc := range cases {
		err := l.Update(map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{}), "bad": tenantWith(tc.lim)})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `tenants["bad"]`) {
			t.Errorf("%s: error %v, want one naming %s", tc.name, err, tc.want)
		}
	}
	if err := l.Update(map[string]*config.Tenant{"nil": nil}); err == nil {
		t.Error("nil tenant accepted")
	}
	// Nothing was applied: acme still has its 1/min limit and spent it.
	l.Allow(Request{Tenant: "acme"})
	if d := l.Allow(Request{Tenant: "acme"}); d.Allowed {
		t.Fatal("a rejected update changed the limits")
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*Config)
	}{
		{"no instance", func(c *Config) { c.Instance = "" }},
		{"negative interval", func(c *Config) { c.SyncInterval = -time.Second }},
		{"min share 1", func(c *Config) { c.MinShare = 1 }},
		{"initial share above 1", func(c *Config) { c.InitialShare = 2 }},
	}
	for _, tc := range cases {
		cfg := DefaultConfig("a")
		tc.mod(&cfg)
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := &clock{now: epoch}
	cfg := DefaultConfig("m")
	cfg.Now, cfg.Warmup, cfg.Registerer = c.Now, time.Nanosecond, reg
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Millisecond)
	if err := l.Update(map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{
		Requests: rate(2, time.Minute, 0), Tokens: rate(1000, time.Minute, 0),
	})}); err != nil {
		t.Fatal(err)
	}
	l.Sync()
	for range 3 {
		if d := l.Allow(Request{Tenant: "acme", Tokens: 50}); d.Allowed {
			l.Settle(d.Ticket, 20)
		}
	}
	checks := []struct {
		c    prometheus.Metric
		want float64
	}{
		{l.metrics.admitted.WithLabelValues("acme"), 2},
		{l.metrics.rejected.WithLabelValues("acme", ReasonRequests), 1},
		{l.metrics.usage.WithLabelValues("acme", "tokens"), 40},
		{l.metrics.usage.WithLabelValues("acme", "requests"), 2},
		{l.metrics.share.WithLabelValues("acme", "tenant", "tokens"), 1},
	}
	for i, ch := range checks {
		if got := metricValue(t, ch.c); got != ch.want {
			t.Errorf("check %d: %v, want %v", i, got, ch.want)
		}
	}
	if _, err := New(cfg); err == nil {
		t.Error("second Limiter on the same registry: want a registration error")
	}
	// A removed tenant's series go away.
	if err := l.Update(nil); err != nil {
		t.Fatal(err)
	}
	if n := countSeries(l.metrics.rejected); n != 0 {
		t.Errorf("%d rejected series left after removing the tenant", n)
	}
}

func TestAllowDoesNotAllocate(t *testing.T) {
	c := &clock{now: epoch}
	l := alone(t, c, benchTenants())
	r := Request{Tenant: "acme", Model: "m1", Band: config.BandStandard, Tokens: 100}
	allocs := testing.AllocsPerRun(1000, func() {
		d := l.AllowAt(c.now, r)
		if d.Allowed {
			l.SettleAt(c.now, d.Ticket, 50)
		}
		c.Advance(time.Millisecond)
	})
	if allocs != 0 {
		t.Fatalf("Allow+Settle allocate %v times per call, want 0", allocs)
	}
}

func benchTenants() map[string]*config.Tenant {
	m := map[string]*config.Tenant{}
	for _, name := range []string{"acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell", "cyberdyne", "soylent", "wonka", "aperture"} {
		m[name] = tenantWith(config.TenantLimit{
			Requests: rate(600, time.Minute, 0),
			Tokens:   rate(2_000_000, time.Minute, 0),
			PerModel: []config.ModelRate{
				{Model: "m1", Requests: rate(300, time.Minute, 0), Tokens: rate(1_000_000, time.Minute, 0)},
				{Model: "m2", Requests: rate(300, time.Minute, 0)},
			},
			PerBand: []config.BandRate{{Band: config.BandStandard, Requests: rate(500, time.Minute, 0), Tokens: rate(1_500_000, time.Minute, 0)}},
		})
	}
	return m
}

// BenchmarkAllow measures one decision against six limits (overall, model
// and band; requests and tokens), admitted or not, plus its settlement.
func BenchmarkAllow(b *testing.B) {
	c := &clock{now: epoch}
	cfg := DefaultConfig("bench")
	cfg.Now, cfg.Warmup = c.Now, time.Nanosecond
	l, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Update(benchTenants()); err != nil {
		b.Fatal(err)
	}
	l.Sync()
	r := Request{Tenant: "acme", Model: "m1", Band: config.BandStandard, Tokens: 1000}
	b.ReportAllocs()
	for b.Loop() {
		d := l.Allow(r)
		if d.Allowed {
			l.Settle(d.Ticket, 500)
		}
	}
}

// BenchmarkAllowParallel is BenchmarkAllow from every P over 12 tenants.
func BenchmarkAllowParallel(b *testing.B) {
	cfg := DefaultConfig("bench")
	cfg.Warmup = time.Nanosecond
	l, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ts := benchTenants()
	if err := l.Update(ts); err != nil {
		b.Fatal(err)
	}
	l.Sync()
	var names []string
	for n := range ts {
		names = append(names, n)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			d := l.Allow(Request{Tenant: names[i%len(names)], Model: "m1", Tokens: 1000})
			if d.Allowed {
				l.Settle(d.Ticket, 500)
			}
		}
	})
}

func TestMalformedPayloads(t *testing.T) {
	c := &clock{now: epoch}
	l := alone(t, c, benchTenants())
	good := l.LocalState()
	cases := map[string][]byte{
		"empty":         nil,
		"wrong version": {9, 0},
		"truncated":     good[:len(good)-3],
		"trailing":      append(append([]byte{}, good...), 1),
		"huge count":    {wireVersion, 0xff, 0xff, 0x03},
		"nan demand":    append([]byte{wireVersion, 1, 1, 'x', 1, 0, 0, 1}, append(make([]byte, 8), 0, 0, 0xc0, 0x7f, 0, 0, 0, 0)...),
		"share above 1": append([]byte{wireVersion, 1, 1, 'x', 1, 0, 0, 1}, append(make([]byte, 8), 0, 0, 0, 0, 0, 0, 0, 0x40)...),
	}
	for name, p := range cases {
		l.Merge("peer", p)
		if !errors.Is(l.mergeErr, errPayload) {
			t.Errorf("%s: merge error %v, want errPayload", name, l.mergeErr)
		}
		l.mergeErr = nil
	}
	if len(l.peers) != 0 {
		t.Errorf("malformed payloads created peers: %v", l.peers)
	}
}

func FuzzMerge(f *testing.F) {
	c := &clock{now: epoch}
	cfg := DefaultConfig("fuzz")
	cfg.Now = c.Now
	l, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(l.LocalState())
	f.Add([]byte{wireVersion, 1, 1, 'x', 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		l.Merge("fuzz", p) // must not panic
		l.Sync()
	})
}

func metricValue(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var pb dto.Metric
	if err := m.Write(&pb); err != nil {
		t.Fatal(err)
	}
	switch {
	case pb.Counter != nil:
		return pb.Counter.GetValue()
	case pb.Gauge != nil:
		return pb.Gauge.GetValue()
	}
	t.Fatalf("not a counter or gauge: %v", m.Desc())
	return 0
}

func countSeries(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}
