package ratelimit

import (
	"encoding/binary"
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/prometheus/client_golang/prometheus"
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
		if got := testkit.Value(t, ch.c); got != ch.want {
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
	if n := testkit.Series(l.metrics.rejected); n != 0 {
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

// benchLimiter is a Limiter alone with benchTenants on a clock that moves
// step forward at every reading (Allow and Settle each read it once).
func benchLimiter(b *testing.B, step time.Duration) *Limiter {
	now := epoch
	cfg := DefaultConfig("bench")
	cfg.Now, cfg.Warmup = func() time.Time { now = now.Add(step); return now }, time.Nanosecond
	l, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Update(benchTenants()); err != nil {
		b.Fatal(err)
	}
	l.Sync()
	return l
}

// BenchmarkAllowAdmitted measures the admit-and-settle path: one decision
// against six limits (overall, model and band; requests and tokens) that
// admits, plus its Settle. The clock advances 150ms per reading, enough for
// every limit to have room again, so every decision is an admission.
func BenchmarkAllowAdmitted(b *testing.B) {
	l := benchLimiter(b, 150*time.Millisecond)
	r := Request{Tenant: "acme", Model: "m1", Band: config.BandStandard, Tokens: 1000}
	var admitted int
	b.ReportAllocs()
	for b.Loop() {
		d := l.Allow(r)
		if d.Allowed {
			admitted++
			l.Settle(d.Ticket, 500)
		}
	}
	if admitted != b.N {
		b.Fatalf("%d of %d decisions admitted, want all", admitted, b.N)
	}
}

// BenchmarkAllowRejected measures the reject path: the same decision
// against an exhausted limit on a clock that does not move.
func BenchmarkAllowRejected(b *testing.B) {
	l := benchLimiter(b, 0)
	r := Request{Tenant: "acme", Model: "m1", Band: config.BandStandard, Tokens: 1000}
	for l.Allow(r).Allowed {
	}
	b.ReportAllocs()
	for b.Loop() {
		if l.Allow(r).Allowed {
			b.Fatal("admitted on a frozen clock after exhausting the limit")
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
		"empty":              nil,
		"wrong version":      {9, 0},
		"truncated":          good[:len(good)-3],
		"trailing":           append(append([]byte{}, good...), 1),
		"huge count":         {wireVersion, 0xff, 0xff, 0x03},
		"nan demand":         oneReport(0, 0x7fc00000, 0, 0, 0, 0),
		"share above 1":      oneReport(0, 0, 0x40000000, 0, 0, 0),
		"infinite level":     oneReport(0, 0, 0, 0x7f800000, 0, 0),
		"negative total":     oneReport(0, 0, 0, 0, math.Float64bits(-1), 0),
		"more now than ever": oneReport(0, 0, 0, 0, math.Float64bits(1), 0x40000000),
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

// oneReport is a payload with one entry from "x" holding one limit's
// report with these raw fields.
func oneReport(hash uint64, demand, share, level uint32, released uint64, now uint32) []byte {
	b := []byte{wireVersion, 1, 1, 'x', 1, 0, 0, 0, 1, 1}
	b = binary.LittleEndian.AppendUint64(b, hash)
	for _, v := range []uint32{demand, share, level} {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	b = binary.LittleEndian.AppendUint64(b, released)
	return binary.LittleEndian.AppendUint32(b, now)
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
	f.Add(oneReport(7, 0x3f800000, 0x3f000000, 0x41200000, math.Float64bits(5), 0x3f800000))
	f.Fuzz(func(t *testing.T, p []byte) {
		l.Merge("fuzz", p) // must not panic
		l.Sync()
	})
}

// newWith is a Limiter of cfg holding tenants, failing t when either is
// refused.
func newWith(t testing.TB, cfg Config, tenants map[string]*config.Tenant) *Limiter {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Update(tenants); err != nil {
		t.Fatal(err)
	}
	return l
}

// pair is two Limiters on one fake clock that exchange reports by hand.
func pair(t *testing.T, c *clock, tenants map[string]*config.Tenant) (a, b *Limiter) {
	t.Helper()
	newL := func(name string) *Limiter {
		cfg := DefaultConfig(name)
		cfg.Now = c.Now
		return newWith(t, cfg, tenants)
	}
	a, b = newL("a"), newL("b")
	exchange(a, b)
	return a, b
}

// exchange has a and b sync and hear each other, with no time passing.
func exchange(a, b *Limiter) {
	for _, p := range a.Sync() {
		b.Merge("a", p)
	}
	for _, p := range b.Sync() {
		a.Merge("b", p)
	}
}

// TestHeadersAcrossInstances is the support-team case of issue 16: 1200
// a minute with a burst of 100 over two instances, idle for 20s, then 25
// requests one after the other at one instant on one instance. All are
// admitted, and the remaining counts read the global bucket, falling by
// one per request (99, 98, ...) also across syncs at that instant. Then
// the same tenant runs dry: the 429 says 0 remaining, and retry-after-ms
// is exactly when the next request is admitted.
func TestHeadersAcrossInstances(t *testing.T) {
	c := &clock{now: epoch}
	a, b := pair(t, c, map[string]*config.Tenant{"support": tenantWith(config.TenantLimit{
		Requests: rate(1200, time.Minute, 100),
		Tokens:   rate(600_000, time.Minute, 100_000),
	})})
	for range 200 { // 20s idle
		c.Advance(100 * time.Millisecond)
		exchange(a, b)
	}
	headers := func(d Decision) map[string]string {
		h := map[string]string{}
		d.Headers(func(k, v string) { h[k] = v })
		return h
	}
	num := func(h map[string]string, k string) int64 {
		n, err := strconv.ParseInt(h[k], 10, 64)
		if err != nil {
			t.Fatalf("%s = %q: %v", k, h[k], err)
		}
		return n
	}
	lastReq, lastTok := int64(101), int64(100_001)
	step := func(i int) (Decision, map[string]string) {
		d := a.Allow(Request{Tenant: "support", Tokens: 1000})
		h := headers(d)
		req, tok := num(h, "x-ratelimit-remaining-requests"), num(h, "x-ratelimit-remaining-tokens")
		if d.Allowed && (req >= lastReq || tok >= lastTok) {
			t.Fatalf("request %d: remaining %d requests, %d tokens after %d, %d: want both to fall", i, req, tok, lastReq, lastTok)
		}
		lastReq, lastTok = req, tok
		return d, h
	}
	for i := range 25 {
		if d, _ := step(i); !d.Allowed {
			t.Fatalf("request %d of a 25-request burst after 20s idle rejected: %+v", i, d)
		}
		if i == 0 && lastReq != 99 {
			t.Fatalf("first request after idling: %d requests remaining, want 99", lastReq)
		}
		if i%5 == 4 {
			exchange(a, b) // no time passes: the global figures cannot rise
		}
	}
	// Drain until the 429.
	var d Decision
	var h map[string]string
	for i := 25; ; i++ {
		if d, h = step(i); !d.Allowed {
			break
		}
		if i > 200 {
			t.Fatal("never rejected")
		}
	}
	if d.Reason != ReasonRequests || h["x-ratelimit-remaining-requests"] != "0" {
		t.Fatalf("429: reason %q, remaining requests %q, want requests and 0", d.Reason, h["x-ratelimit-remaining-requests"])
	}
	ms := num(h, "retry-after-ms")
	if want := int64((d.RetryAfter + time.Millisecond - 1) / time.Millisecond); ms != want || ms <= 0 {
		t.Fatalf("retry-after-ms %d, want %d (RetryAfter %v)", ms, want, d.RetryAfter)
	}
	if s := num(h, "retry-after"); s != (ms+999)/1000 {
		t.Fatalf("retry-after %d, want %d (retry-after-ms rounded up)", s, (ms+999)/1000)
	}
	c.Advance(time.Duration(ms-1) * time.Millisecond)
	if d := a.Allow(Request{Tenant: "support", Tokens: 1000}); d.Allowed {
		t.Fatalf("admitted 1ms before retry-after-ms")
	}
	c.Advance(time.Millisecond)
	if d := a.Allow(Request{Tenant: "support", Tokens: 1000}); !d.Allowed {
		t.Fatalf("rejected at retry-after-ms: %+v", d)
	}
}

// TestNewLimitStartsFull: a tenant added while instances run, and a
// Limiter that has concluded it is alone, start with the whole burst, not
// InitialShare of it (issue 16: remaining tokens read 1.37M of 4M after a
// start and climbed over 40s).
func TestNewLimitStartsFull(t *testing.T) {
	c := &clock{now: epoch}
	tenants := map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{Tokens: rate(4_000_000, time.Minute, 0)})}
	solo := alone(t, c, tenants)
	if d := solo.Allow(Request{Tenant: "acme", Tokens: 1}); d.Tokens.Remaining != 4_000_000-1 {
		t.Fatalf("alone: remaining %d, want %d", d.Tokens.Remaining, 4_000_000-1)
	}
	a, b := pair(t, c, nil)
	c.Advance(100 * time.Millisecond)
	for _, l := range []*Limiter{a, b} {
		if err := l.Update(tenants); err != nil {
			t.Fatal(err)
		}
	}
	exchange(a, b)
	var total float64
	for _, l := range []*Limiter{a, b} {
		lim := (*l.tenants.Load())["acme"].all[0]
		total += lim.b.level
		if d := l.Allow(Request{Tenant: "acme"}); d.Tokens.Remaining != 4_000_000 {
			t.Errorf("%s: remaining %d, want 4000000", l.cfg.Instance, d.Tokens.Remaining)
		}
	}
	if math.Abs(total-4_000_000) > 1 {
		t.Fatalf("the two slices hold %.0f, want the burst, 4000000", total)
	}
}

func TestWellFormedReportMerges(t *testing.T) {
	c := &clock{now: epoch}
	l := alone(t, c, benchTenants())
	l.Merge("x", oneReport(7, 0x3f800000, 0x3f000000, 0x41200000, math.Float64bits(5), 0x3f800000))
	if l.mergeErr != nil || l.peers["x"].limits[7].released != 5 || l.peers["x"].limits[7].recent != 1 {
		t.Fatalf("merge error %v, peers %+v", l.mergeErr, l.peers["x"])
	}
}

// TestReleaseAfterIdleSurvivesASupersededReport: a peer idle and full
// stops reporting a limit; when demand appears elsewhere it releases its
// slice in one report, and gossip may deliver only the next one (a
// keyed broadcast supersedes the older one still queued: memberlist's LAN
// gossip interval is 200ms, twice SyncInterval). The released units must
// still be taken up, from the cumulative counter: before, the first
// report after idling was read for what it released at its own sync only,
// and the burst lost half its units until refill.
func TestReleaseAfterIdleSurvivesASupersededReport(t *testing.T) {
	c := &clock{now: epoch}
	a, b := pair(t, c, map[string]*config.Tenant{"support": tenantWith(config.TenantLimit{
		Requests: rate(1200, time.Minute, 100),
	})})
	for range 200 { // 20s idle: both slices full, neither reports the limit
		c.Advance(100 * time.Millisecond)
		exchange(a, b)
	}
	if !a.Allow(Request{Tenant: "support"}).Allowed {
		t.Fatal("first request refused")
	}
	c.Advance(100 * time.Millisecond)
	for _, p := range a.Sync() { // a's demand: its share grows
		b.Merge("a", p)
	}
	b.Sync() // b's slice shrinks: it releases (this report is lost)
	c.Advance(100 * time.Millisecond)
	for _, p := range b.Sync() { // the next one, released nothing new, arrives
		a.Merge("b", p)
	}
	a.Sync()
	admitted := 1
	for range 200 {
		if a.Allow(Request{Tenant: "support"}).Allowed {
			admitted++
		}
	}
	// 100 + refill over 200ms at a's share; b keeps its floor's slice.
	if admitted < 95 || admitted > 106 {
		t.Fatalf("a burst on a after b released its slice: %d admitted in all, want the burst (about 100)", admitted)
	}
}

// TestRefund: a request admitted but never served gives back its request
// unit and its whole token estimate, in every scope that charged it, so a
// tenant is charged only for what it was served.
func TestRefund(t *testing.T) {
	c := &clock{now: epoch}
	l := alone(t, c, map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{
		Requests: rate(10, time.Minute, 0),
		Tokens:   rate(6000, time.Minute, 0),
	})})
	d := l.Allow(Request{Tenant: "acme", Tokens: 4000})
	if !d.Allowed || d.Requests.Remaining != 9 || d.Tokens.Remaining != 2000 {
		t.Fatalf("first admission: %+v", d)
	}
	l.Refund(d.Ticket)
	// No time has passed: the next admission sees the buckets as if the
	// refunded request had never been made.
	d = l.Allow(Request{Tenant: "acme", Tokens: 1000})
	if !d.Allowed || d.Requests.Remaining != 9 || d.Tokens.Remaining != 5000 {
		t.Fatalf("after a refund: requests remaining %d (want 9), tokens remaining %d (want 5000)", d.Requests.Remaining, d.Tokens.Remaining)
	}
	// Ten admissions exhaust the requests bucket; refunding the tenth
	// admits one more.
	for range 9 {
		if d = l.Allow(Request{Tenant: "acme"}); !d.Allowed {
			t.Fatalf("within the limit: %+v", d)
		}
	}
	if d := l.Allow(Request{Tenant: "acme"}); d.Allowed {
		t.Fatalf("the eleventh request within a minute was admitted: %+v", d)
	}
	l.Refund(d.Ticket)
	if d := l.Allow(Request{Tenant: "acme"}); !d.Allowed {
		t.Fatalf("a refunded unit was not available again: %+v", d)
	}
	// A refund never lifts a bucket above its burst, and a zero ticket is a no-op.
	c.Advance(time.Hour)
	d = l.Allow(Request{Tenant: "acme", Tokens: 10})
	l.Refund(d.Ticket)
	l.Refund(Ticket{})
	if d := l.Allow(Request{Tenant: "acme"}); d.Requests.Remaining != 9 || d.Tokens.Remaining != 6000 {
		t.Fatalf("after refunds at full buckets: requests %d (want 9), tokens %d (want 6000)", d.Requests.Remaining, d.Tokens.Remaining)
	}
}

// appendReset writes what time.Duration.String writes for the duration
// rounded up to the millisecond.
func TestAppendResetMatchesDurationString(t *testing.T) {
	want := func(d time.Duration) string {
		if d <= 0 {
			return "0s"
		}
		if r := d % time.Millisecond; r != 0 {
			d += time.Millisecond - r
		}
		return d.String()
	}
	ds := []time.Duration{-time.Second, 0, 1, time.Millisecond - 1, time.Millisecond, 999 * time.Millisecond,
		999*time.Millisecond + 1, time.Second, 1500 * time.Millisecond, 1010 * time.Millisecond, 1001 * time.Millisecond,
		59*time.Second + 999*time.Millisecond, time.Minute, 6 * time.Minute, time.Hour, time.Hour + time.Millisecond,
		100*time.Hour + 59*time.Minute + 59*time.Second + 990*time.Millisecond, math.MaxInt64 / 2}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		ds = append(ds, time.Duration(rng.Int64N(int64(200*time.Hour))))
	}
	for _, d := range ds {
		if got, w := formatReset(d), want(d); got != w {
			t.Fatalf("formatReset(%d) = %q; want %q", int64(d), got, w)
		}
	}
}

// Headers formats every value into one string: one allocation.
func TestHeadersAllocateOnce(t *testing.T) {
	d := Decision{Allowed: false, RetryAfter: 1500 * time.Millisecond,
		Requests: Quota{Limit: 1000, Remaining: 0, Reset: 20 * time.Millisecond},
		Tokens:   Quota{Limit: 90000, Remaining: 12345, Reset: 6*time.Minute + 1},
	}
	got := map[string]string{}
	set := func(k, v string) { got[k] = v }
	d.Headers(set)
	want := map[string]string{"x-ratelimit-limit-requests": "1000", "x-ratelimit-remaining-requests": "0",
		"x-ratelimit-reset-requests": "20ms", "x-ratelimit-limit-tokens": "90000", "x-ratelimit-remaining-tokens": "12345",
		"x-ratelimit-reset-tokens": "6m0.001s", "retry-after": "2", "retry-after-ms": "1500"}
	if !maps.Equal(got, want) {
		t.Fatalf("headers %v; want %v", got, want)
	}
	if raceEnabled {
		return
	}
	nop := func(k, v string) {}
	if n := testing.AllocsPerRun(100, func() { d.Headers(nop) }); n != 1 {
		t.Errorf("Headers allocated %v times; want 1", n)
	}
}

// TestAppendHeadersMatchesHeaders: AppendHeaders writes what Headers sets,
// keys canonical, for allowed and refused decisions with and without each
// quota, and allocates nothing.
func TestAppendHeadersMatchesHeaders(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 20))
	quota := func() Quota {
		if rng.IntN(4) == 0 {
			return Quota{}
		}
		return Quota{Limit: rng.Int64N(1 << 40), Remaining: rng.Int64N(1 << 40), Reset: time.Duration(rng.Int64N(int64(time.Hour)))}
	}
	for i := 0; i < 2000; i++ {
		d := Decision{Allowed: rng.IntN(2) == 0, RetryAfter: time.Duration(rng.Int64N(int64(time.Minute))), Requests: quota(), Tokens: quota()}
		want := map[string]string{}
		d.Headers(func(k, v string) { want[http.CanonicalHeaderKey(k)] = v })
		got := map[string]string{}
		lines := string(d.AppendHeaders(nil))
		for line := range strings.SplitSeq(lines, "\r\n") {
			if line == "" {
				continue
			}
			k, v, ok := strings.Cut(line, ": ")
			if !ok || http.CanonicalHeaderKey(k) != k {
				t.Fatalf("line %q of %q", line, lines)
			}
			if _, dup := got[k]; dup {
				t.Fatalf("%s twice in %q", k, lines)
			}
			got[k] = v
		}
		if !strings.HasSuffix(lines, "\r\n") && lines != "" {
			t.Fatalf("%q does not end its last line", lines)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("%+v: AppendHeaders %v; Headers %v", d, got, want)
		}
	}
	if raceEnabled {
		return
	}
	d := Decision{Allowed: false, RetryAfter: time.Second, Requests: Quota{Limit: 10, Remaining: 1, Reset: time.Second}, Tokens: Quota{Limit: 100, Remaining: 5, Reset: time.Minute}}
	buf := make([]byte, 0, 512)
	if n := testing.AllocsPerRun(100, func() { buf = d.AppendHeaders(buf[:0]) }); n != 0 {
		t.Errorf("AppendHeaders allocated %v times; want 0", n)
	}
}
