package tier2

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/meridian-router/meridian/canary"
	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/configtest"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/rewrite"
	"github.com/meridian-router/meridian/rollout"
)

var canaryConfig = testkit.Topology(testkit.Cluster{Region: "r1", Name: "c1", Tier1: noTier1}, testkit.Cluster{Region: "r2", Name: "c2", Tier1: "http://127.0.0.1:2"}) +
	testkit.Gateway("r1", "c1") + `  schedulers:
  - {name: v1, modelName: chat-v1, modelSelector: {matchLabels: {pool: v1}}}
` + testkit.Gateway("r2", "c2") + `  schedulers:
  - {name: v2, modelName: chat-v2, modelSelector: {matchLabels: {pool: v2}}}
---
` + testkit.ChatRewrite + `    targets:
    - {modelRewrite: chat-v1, weight: 1}
    - {modelRewrite: chat-v2, weight: 1, clusters: [c2]}
  rollout:
    stable: chat-v1
    canary: chat-v2
    steps: [10, 50]
    interval: 10s
    stepStarted: "2026-11-30T00:00:00Z"
    status: Progressing
    analysis: {minRequests: 10}
`

var canaryT0 = time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)

// canaryRig is one etcd holding canaryConfig and Tier-2 routers over it,
// each with its analysis on a shared fake clock.
type canaryRig struct {
	store *config.Store
	now   time.Time
	tier2 []*Canary
	reg   []*prometheus.Registry
}

func newCanaryRig(t *testing.T, instances int, writable bool) *canaryRig {
	t.Helper()
	e := configtest.StartEtcd(t)
	rig := &canaryRig{store: &config.Store{Client: e.Client}, now: canaryT0}
	e.Apply(t, canaryConfig)
	snap := rig.load(t)
	for range instances {
		fleet := localFleet(t, snap)
		r, err := NewRouter(Config{Region: "r1", Fleet: fleet, InsecureNoAuth: true, Logger: slog.New(slog.DiscardHandler)}, snap)
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		cfg := CanaryConfig{Registerer: reg, Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return rig.now }, Instance: "t2", Region: "r1"}
		if writable {
			cfg.Store = canary.NewEtcd(rig.store)
		}
		c, err := NewCanary(cfg, r)
		if err != nil {
			t.Fatal(err)
		}
		rig.tier2 = append(rig.tier2, c)
		rig.reg = append(rig.reg, reg)
	}
	return rig
}

func (rig *canaryRig) load(t *testing.T) *config.Snapshot {
	t.Helper()
	s, err := rig.store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sync delivers etcd's configuration to every instance, as the watch would.
func (rig *canaryRig) sync(t *testing.T) {
	t.Helper()
	s := rig.load(t)
	for _, c := range rig.tier2 {
		if err := c.r.Apply(s); err != nil {
			t.Fatal(err)
		}
	}
}

func (rig *canaryRig) rollout(t *testing.T) config.Rollout {
	t.Helper()
	return *rig.load(t).Rewrites["chat"].Spec.Rollout
}

// serve records n streamed answers with code and ttft for target on
// instance i, as Tier-2's request path counts them.
func (rig *canaryRig) serve(i int, target string, n int, code string, ttft time.Duration) {
	rig.serveAs(i, target, n, code, ttft, "true")
}

// serveWhole is serve for non-streamed answers: ttft is the whole answer's
// latency.
func (rig *canaryRig) serveWhole(i int, target string, n int, latency time.Duration) {
	rig.serveAs(i, target, n, "200", latency, "false")
}

func (rig *canaryRig) serveAs(i int, target string, n int, code string, ttft time.Duration, stream string) {
	m := rig.tier2[i].r.m
	for range n {
		m.requests.WithLabelValues("chat", target, "r1", "c1", code).Inc()
		if code == "200" {
			m.ttft.WithLabelValues("chat", target, stream).Observe(ttft.Seconds())
		}
	}
}

func TestCanaryAnalysis(t *testing.T) {
	ctx := context.Background()
	healthy := func(rig *canaryRig, i int) {
		// Both in Tier-2's (100ms, 250ms] TTFT bucket.
		rig.serve(i, "chat-v1", 50, "200", 120*time.Millisecond)
		rig.serve(i, "chat-v2", 50, "200", 130*time.Millisecond)
	}
	cases := []struct {
		name    string
		traffic func(rig *canaryRig, i int)
		digest  *regions.Digest // the canary pool's shared health
		advance time.Duration   // clock moved before the deciding round
		status  string
		step    int
		reason  string
	}{
		{"errors abort mid-step", func(rig *canaryRig, i int) {
			rig.serve(i, "chat-v1", 50, "200", 100*time.Millisecond)
			rig.serve(i, "chat-v2", 20, "503", 0)
		}, nil, time.Second, rewrite.StatusDegraded, 0, "error rate"},
		{"429s abort", func(rig *canaryRig, i int) {
			rig.serve(i, "chat-v1", 50, "200", 100*time.Millisecond)
			rig.serve(i, "chat-v2", 10, "200", 100*time.Millisecond)
			rig.serve(i, "chat-v2", 10, "429", 0)
		}, nil, time.Second, rewrite.StatusDegraded, 0, "429 rate"},
		{"slow canary aborts", func(rig *canaryRig, i int) {
			rig.serve(i, "chat-v1", 50, "200", 100*time.Millisecond)
			rig.serve(i, "chat-v2", 50, "200", 2*time.Second)
		}, nil, time.Second, rewrite.StatusDegraded, 0, "P99 TTFT"},
		{"errors other Tier-2s saw, through the digest", healthy,
			&regions.Digest{Region: "r2", Cluster: "c2", Pool: "v2", Model: "chat-v2", ReadyPods: 1, TotalPods: 1, ErrorRate: 0.5},
			time.Second, rewrite.StatusDegraded, 0, "error rate"},
		{"a slow pool other Tier-2s saw, through the digest", healthy,
			&regions.Digest{Region: "r2", Cluster: "c2", Pool: "v2", Model: "chat-v2", ReadyPods: 1, TotalPods: 1, TTFTP99: 2 * time.Second},
			time.Second, rewrite.StatusDegraded, 0, "P99 TTFT"},
		{"a passing step advances after its interval", healthy, nil, 11 * time.Second, rewrite.StatusProgressing, 1, "within limits"},
		// A non-streamed answer's first byte is its last: a few long
		// whole answers beside fast streams are not a slow canary.
		{"long non-streamed answers beside fast streams pass", func(rig *canaryRig, i int) {
			healthy(rig, i)
			rig.serveWhole(i, "chat-v2", 10, 5*time.Second)
		}, nil, 11 * time.Second, rewrite.StatusProgressing, 1, "within limits"},
		// Like with like: when one side had no streamed answers, both are
		// compared on every answer.
		{"slow whole answers abort when the stable side has no streams", func(rig *canaryRig, i int) {
			rig.serveWhole(i, "chat-v1", 50, 300*time.Millisecond)
			rig.serve(i, "chat-v2", 50, "200", 100*time.Millisecond)
			rig.serveWhole(i, "chat-v2", 10, 5*time.Second)
		}, nil, time.Second, rewrite.StatusDegraded, 0, "P99 TTFT"},
		{"a slow canary whose callers never stream aborts", func(rig *canaryRig, i int) {
			rig.serveWhole(i, "chat-v1", 50, 100*time.Millisecond)
			rig.serveWhole(i, "chat-v2", 50, 2*time.Second)
		}, nil, time.Second, rewrite.StatusDegraded, 0, "P99 TTFT"},
		{"a passing step holds before its interval", healthy, nil, 4 * time.Second, rewrite.StatusProgressing, 0, ""},
		{"too little traffic pauses at the interval", func(rig *canaryRig, i int) {
			rig.serve(i, "chat-v1", 3, "200", 100*time.Millisecond)
		}, nil, 11 * time.Second, rewrite.StatusPaused, 0, "too few requests"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rig := newCanaryRig(t, 1, true)
			tier2 := rig.tier2[0]
			if c.digest != nil {
				c.digest.Produced, c.digest.Version = time.Now(), 1
				if _, err := tier2.r.cfg.Fleet.Digests().Put(*c.digest); err != nil {
					t.Fatal(err)
				}
			}
			tier2.round(ctx) // first sight of the rollout: the baseline
			c.traffic(rig, 0)
			rig.now = rig.now.Add(c.advance)
			tier2.round(ctx)
			ro := rig.rollout(t)
			if ro.Status != c.status || ro.Step != c.step || !strings.Contains(ro.Reason, c.reason) {
				t.Fatalf("rollout %+v, want status %s step %d reason ~%q; analysis %+v", ro, c.status, c.step, c.reason, tier2.Latest())
			}
		})
	}
}

func TestCanaryRacingInstancesWriteOnce(t *testing.T) {
	ctx := context.Background()
	rig := newCanaryRig(t, 3, true)
	before := rig.load(t).Revision
	for i, c := range rig.tier2 {
		c.round(ctx)
		rig.serve(i, "chat-v1", 50, "200", 100*time.Millisecond)
		rig.serve(i, "chat-v2", 20, "500", 0)
	}
	rig.now = rig.now.Add(time.Second)
	var wg sync.WaitGroup
	for _, c := range rig.tier2 {
		wg.Add(1)
		go func() { defer wg.Done(); c.round(ctx) }()
	}
	wg.Wait()
	after := rig.load(t)
	if ro := after.Rewrites["chat"].Spec.Rollout; ro.Status != rewrite.StatusDegraded {
		t.Fatalf("rollout %+v", ro)
	}
	// Each Commit is one transaction: one revision per winning write.
	if after.Revision != before+1 {
		t.Fatalf("revision %d → %d: want exactly one write", before, after.Revision)
	}
	// Every instance sees the transition once the watch delivers it.
	rig.sync(t)
	for i, c := range rig.tier2 {
		c.round(ctx)
		if v := value(c.state.WithLabelValues("chat", rewrite.StatusDegraded)); v != 1 {
			t.Errorf("instance %d: meridian_canary_state Degraded = %v", i, v)
		}
		if v := value(c.trans.WithLabelValues("chat", rewrite.StatusDegraded)); v != 1 {
			t.Errorf("instance %d: transitions to Degraded = %v", i, v)
		}
		if v := value(c.weight.WithLabelValues("chat", "chat-v2")); v != 0 {
			t.Errorf("instance %d: canary weight %v after the abort", i, v)
		}
	}
}

func TestCanaryReportOnly(t *testing.T) {
	ctx := context.Background()
	rig := newCanaryRig(t, 1, false)
	c := rig.tier2[0]
	before := rig.load(t).Revision
	c.round(ctx)
	rig.serve(0, "chat-v1", 50, "200", 100*time.Millisecond)
	rig.serve(0, "chat-v2", 20, "500", 0)
	rig.now = rig.now.Add(time.Second)
	c.round(ctx)
	if rev := rig.load(t).Revision; rev != before {
		t.Fatalf("a report-only analysis wrote (revision %d → %d)", before, rev)
	}
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest("GET", "/meridian/canary", nil))
	var live []rollout.Live
	if err := json.Unmarshal(rec.Body.Bytes(), &live); err != nil {
		t.Fatal(err)
	}
	if len(live) != 1 || live[0].Verdict != "Fail" || live[0].Action != "abort" || live[0].Canary.Errors != 20 || live[0].Stable.Requests != 50 {
		t.Fatalf("GET /meridian/canary: %s", rec.Body)
	}
}

func TestCanaryQuantile(t *testing.T) {
	// 100 samples: 98 at ≤ 0.1 s, 2 in (0.25, 0.5]: P99 lies in the last.
	cum := make([]float64, len(latencyBuckets))
	for i, ub := range latencyBuckets {
		switch {
		case ub >= 0.5:
			cum[i] = 100
		case ub >= 0.1:
			cum[i] = 98
		}
	}
	got := quantile(0.99, cum, 100)
	if got <= 250*time.Millisecond || got > 500*time.Millisecond {
		t.Fatalf("P99 %s, want within (250ms, 500ms]", got)
	}
}

// value reads a gauge's or counter's value.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		return -1
	}
	if d.Gauge != nil {
		return d.GetGauge().GetValue()
	}
	return d.GetCounter().GetValue()
}

// BenchmarkCanaryRound is one analysis round: read the request counters
// and TTFT histograms (here 40 public names × 2 targets × 3 codes), the
// digests, analyse and evaluate one rollout. It runs every few seconds, off
// the request path.
func BenchmarkCanaryRound(b *testing.B) {
	snap := testkit.Snapshot(b, 1, canaryConfig)
	fleet := localFleet(b, snap)
	r, err := NewRouter(Config{Region: "r1", Fleet: fleet, InsecureNoAuth: true, Logger: slog.New(slog.DiscardHandler)}, snap)
	if err != nil {
		b.Fatal(err)
	}
	now := canaryT0
	c, err := NewCanary(CanaryConfig{Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return now }}, r)
	if err != nil {
		b.Fatal(err)
	}
	for i := range 40 {
		for _, tg := range []string{"chat-v1", "chat-v2"} {
			for _, code := range []string{"200", "429", "503"} {
				r.m.requests.WithLabelValues(fmt.Sprint("m", i), tg, "r1", "c1", code).Add(10)
			}
			r.m.ttft.WithLabelValues(fmt.Sprint("m", i), tg, "true").Observe(0.1)
		}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(100 * time.Millisecond)
		c.round(ctx)
	}
}
