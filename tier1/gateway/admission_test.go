package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/request"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/gateway"
)

var quiet = slog.New(slog.DiscardHandler)

const tenantsYAML = `---
apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: payments}
spec: {maxBand: Critical}
`

// twoPodsYAML is pods a and b of pool chat, never reachable.
var twoPodsYAML = testkit.StaticEndpoints(
	testkit.Endpoint{Name: "pod-a", Address: "10.0.0.1:8000", Pool: "chat"},
	testkit.Endpoint{Name: "pod-b", Address: "10.0.0.2:8000", Pool: "chat"})

func snapshot(t *testing.T, extra string) *config.Snapshot {
	t.Helper()
	return testkit.Snapshot(t, 1, testkit.ChatGateway+twoPodsYAML+extra)
}

// newGateway is a gateway over pods a and b of pool "chat", never scraped:
// tests install metrics by hand and call ObservePools. Built inside a
// synctest bubble, it runs on the fake clock.
func newGateway(t *testing.T, cfg gateway.Config, extra string) (*gateway.Gateway, map[string]*tier1.Endpoint, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Cluster, cfg.Logger, cfg.Registerer = "c1", quiet, reg
	cfg.Options.MaxMetricsAge = time.Hour
	gw, err := gateway.New(cfg, snapshot(t, extra))
	if err != nil {
		t.Fatal(err)
	}
	eps := map[string]*tier1.Endpoint{}
	for _, ep := range gw.Pools()[0].Pool.Endpoints() {
		eps[endpointName(ep.ID)] = ep
	}
	return gw, eps, reg
}

// load installs fresh metrics, waiting requests per pod ("a", "b"), and
// observes them.
func load(gw *gateway.Gateway, eps map[string]*tier1.Endpoint, waiting map[string]int) {
	for id, ep := range eps {
		ep.SetMetrics(&tier1.Metrics{Waiting: waiting[id], ScrapedAt: time.Now()})
	}
	gw.ObservePools()
}

func endpointName(id string) string {
	if i := strings.LastIndexByte(id, '-'); i >= 0 {
		return id[i+1:]
	}
	return id
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	return testkit.Metric(t, reg, name, labels)
}

var body = &request.Body{Model: "chat-model", Kind: request.Completion, Prompt: "hello"}

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestBand(t *testing.T) {
	gw, _, reg := newGateway(t, gateway.Config{Admission: gateway.Admission{Objectives: map[string]int{"batch-jobs": -5, "checkout": 100}}}, tenantsYAML)
	cases := []struct {
		name   string
		h      http.Header
		tenant string
		band   priority.Band
		bad    bool
	}{
		{"no header", header(), "", priority.Standard, false},
		{"Tier-2 band", header("x-meridian-tenant", "payments", "x-meridian-band", "Critical"), "payments", priority.Critical, false},
		{"Tier-2 band wins over GIE's", header("x-meridian-tenant", "payments", "x-meridian-band", "Sheddable", "x-gateway-inference-objective", "7"), "payments", priority.Sheddable, false},
		{"GIE integer, negative", header("x-gateway-inference-fairness-id", "batch", "x-gateway-inference-objective", "-1"), "batch", priority.Sheddable, false},
		{"GIE integer, zero", header("x-gateway-inference-objective", "0"), "", priority.Standard, false},
		{"GIE objective name", header("x-gateway-inference-fairness-id", "payments", "x-gateway-inference-objective", "checkout"), "payments", priority.Critical, false},
		{"GIE objective name, negative", header("x-gateway-inference-objective", "batch-jobs"), "", priority.Sheddable, false},
		{"x-meridian-tenant wins over the fairness id", header("x-meridian-tenant", "payments", "x-gateway-inference-fairness-id", "other"), "payments", priority.Standard, false},
		{"over-claim lowered", header("x-gateway-inference-fairness-id", "intruder", "x-gateway-inference-objective", "5"), "intruder", priority.Standard, false},
		{"unknown band", header("x-meridian-band", "Urgent"), "", priority.Standard, true},
		{"unknown objective", header("x-gateway-inference-objective", "vip"), "", priority.Standard, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tenant, band, err := gw.Band(tc.h)
			if tc.bad {
				var ae *request.APIError
				if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
					t.Fatalf("err %v; want a 400 APIError", err)
				}
				return
			}
			if err != nil || tenant != tc.tenant || band != tc.band {
				t.Fatalf("got %q %s %v; want %q %s", tenant, band, err, tc.tenant, tc.band)
			}
		})
	}
	if got := counter(t, reg, "meridian_priority_downgrades_total", map[string]string{"tenant": priority.UnknownTenant, "from": "Critical", "to": "Standard"}); got != 1 {
		t.Errorf("downgrades counted %v, want 1", got)
	}

	// A reload that raises the tenant's maxBand applies to the next request.
	if err := gw.Apply(snapshot(t, tenantsYAML+"---\napiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: intruder}\nspec: {maxBand: Critical}\n")); err != nil {
		t.Fatal(err)
	}
	if _, band, _ := gw.Band(header("x-gateway-inference-fairness-id", "intruder", "x-gateway-inference-objective", "5")); band != priority.Critical {
		t.Errorf("after the reload: %s, want Critical", band)
	}
}

// TestRouteLateBinding: at a saturated pool a Standard request waits in
// the Gate, and its pod is chosen when it leaves: the pod that is best
// then, not the one that was best when it arrived.
func TestRouteLateBinding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gw, eps, reg := newGateway(t, gateway.Config{}, "")
		// Saturated (mean of 8/5 and 4/5 = 1.2); pod a is the better one.
		load(gw, eps, map[string]int{"a": 4, "b": 8})
		type result struct {
			d   *gateway.Decision
			err error
		}
		done := make(chan result, 1)
		go func() {
			d, err := gw.Route(context.Background(), body, gateway.Meta{Header: header("x-meridian-tenant", "docs"), Bytes: 100})
			done <- result{d, err}
		}()
		synctest.Wait()
		if n := gw.Gate("chat").Len(); n != 1 {
			t.Fatalf("%d waiting; want the request queued", n)
		}
		if got := counter(t, reg, "meridian_priority_decisions_total", map[string]string{"pool": "chat", "band": "Standard"}); got != 0 {
			t.Fatalf("%v decisions before release", got)
		}

		// Pod a stays, pod b drains: headroom for Standard (mean 0.3,
		// below 1 − the 0.65 reserve), and b is best.
		time.Sleep(50 * time.Millisecond)
		load(gw, eps, map[string]int{"a": 3, "b": 0})
		synctest.Wait()
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		if got := endpointName(r.d.Endpoints[0].ID); got != "b" {
			t.Errorf("released request sent to pod %s; want b, the best pod at release", got)
		}
		r.d.Release()
		r.d.Release() // idempotent
	})
}

func TestRouteShedAndTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gw, eps, reg := newGateway(t, gateway.Config{Admission: gateway.Admission{Gate: priority.Config{StandardMaxWait: 3 * time.Second}}}, "")
		load(gw, eps, map[string]int{"a": 6, "b": 6})

		_, err := gw.Route(context.Background(), body, gateway.Meta{Header: header("x-gateway-inference-objective", "-1")})
		var ae *request.APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests || ae.Code != "shed" || ae.RetryAfter != 1 {
			t.Fatalf("Sheddable at a saturated pool: %v; want 429 shed with Retry-After 1", err)
		}

		start := time.Now()
		_, err = gw.Route(context.Background(), body, gateway.Meta{})
		if !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests || ae.Code != "queue_timeout" {
			t.Fatalf("Standard past its wait: %v; want 429 queue_timeout", err)
		}
		if waited := time.Since(start); waited != 3*time.Second {
			t.Errorf("waited %s; want the configured 3s", waited)
		}

		// A caller that goes away leaves the queue without a 429.
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			synctest.Wait()
			cancel()
		}()
		if _, err = gw.Route(ctx, body, gateway.Meta{}); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled while waiting: %v", err)
		}
		if n := gw.Gate("chat").Len(); n != 0 {
			t.Errorf("%d still queued", n)
		}
		for reason, want := range map[string]float64{"shed": 1, "queue_timeout": 1} {
			if got := counter(t, reg, "meridian_tier1_rejected_total", map[string]string{"pool": "chat", "reason": reason}); got != want {
				t.Errorf("rejected %s: %v, want %v", reason, got, want)
			}
		}

		// An unknown model is a 404 before admission.
		if _, err := gw.Route(context.Background(), &request.Body{Model: "nope"}, gateway.Meta{}); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
			t.Errorf("unknown model: %v", err)
		}
	})
}

// Releasing a decision hands its capacity to the next waiter: saturated
// by the Gate's own count of what it let in, each Release lets one in.
func TestReleaseLetsTheNextIn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gw, eps, _ := newGateway(t, gateway.Config{Admission: gateway.Admission{Gate: priority.Config{CriticalReserve: 0.1}}}, "")
		load(gw, eps, map[string]int{"a": 0, "b": 0})
		// Two pods × 5 × (1 − 0.1): nine requests fill the Standard budget.
		var held []*gateway.Decision
		for range 9 {
			d, err := gw.Route(context.Background(), body, gateway.Meta{})
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, d)
		}
		done := make(chan *gateway.Decision, 2)
		for range 2 {
			go func() {
				d, err := gw.Route(context.Background(), body, gateway.Meta{})
				if err != nil {
					t.Error(err)
				}
				done <- d
			}()
		}
		synctest.Wait()
		if n := gw.Gate("chat").Len(); n != 2 {
			t.Fatalf("%d waiting; want 2", n)
		}
		held[0].Release()
		synctest.Wait()
		if n := gw.Gate("chat").Len(); n != 1 || len(done) != 1 {
			t.Fatalf("after one release: %d waiting, %d admitted; want 1 and 1", n, len(done))
		}
		held[1].Release()
		synctest.Wait()
		if len(done) != 2 {
			t.Fatalf("second waiter not admitted")
		}
	})
}

// With admission off, Route never waits or sheds.
func TestAdmissionOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gw, eps, _ := newGateway(t, gateway.Config{Admission: gateway.Admission{Off: true}}, "")
		load(gw, eps, map[string]int{"a": 50, "b": 50})
		for _, h := range []http.Header{header(), header("x-gateway-inference-objective", "-1")} {
			d, err := gw.Route(context.Background(), body, gateway.Meta{Header: h})
			if err != nil {
				t.Fatal(err)
			}
			d.Release()
		}
	})
}

func ExampleGateway_Route() {
	snap := exampleSnapshot()
	gw, err := gateway.New(gateway.Config{Cluster: "c1"}, snap)
	if err != nil {
		panic(err)
	}
	for _, ep := range gw.Pools()[0].Pool.Endpoints() {
		ep.SetMetrics(&tier1.Metrics{Waiting: 1, ScrapedAt: time.Now()})
	}
	gw.ObservePools() // Start does this every scrape interval
	h := http.Header{}
	h.Set("x-gateway-inference-objective", "-1") // GIE: Sheddable
	d, err := gw.Route(context.Background(), &request.Body{Model: "chat-model", Kind: request.Completion, Prompt: "hi"}, gateway.Meta{Header: h})
	if err != nil {
		panic(err)
	}
	defer d.Release() // when the response has ended
	fmt.Println(d.Pool, slices.Contains([]string{"10.0.0.1:8000", "10.0.0.2:8000"}, d.Endpoints[0].Address))
	// Output: chat true
}

func exampleSnapshot() *config.Snapshot {
	docs, _ := config.Decode("example.yaml", []byte(testkit.ChatGateway+twoPodsYAML))
	s, err := config.Build(docs, 1)
	if err != nil {
		panic(err)
	}
	return s
}

// A request admitted but not yet sent to a pod is on no endpoint's
// in-flight count; saturation counts it apart until it is dispatched or
// released, so an observation in between does not forget it.
func TestSaturationCountsAdmittedNotDispatched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gw, eps, _ := newGateway(t, gateway.Config{}, "")
		load(gw, eps, map[string]int{"a": 0, "b": 0})
		sat := func() float64 { return gw.Pools()[0].Saturation(time.Now(), priority.Thresholds{}).Value }
		d, err := gw.Route(context.Background(), body, gateway.Meta{})
		if err != nil {
			t.Fatal(err)
		}
		if got := sat(); got != 0.1 { // one waiting request over 2 pods × 5
			t.Fatalf("admitted, not dispatched: saturation %v; want 0.1", got)
		}
		att := gw.Dispatch(d, d.Endpoints[0])
		if got := sat(); got != 0.1 { // now as the endpoint's in-flight excess
			t.Fatalf("dispatched: saturation %v; want 0.1", got)
		}
		att.Done(200, false)
		d.Release()
		if got := sat(); got != 0 {
			t.Fatalf("done: saturation %v; want 0", got)
		}
		d, err = gw.Route(context.Background(), body, gateway.Meta{})
		if err != nil {
			t.Fatal(err)
		}
		d.Release() // never dispatched (the caller gave up)
		if got := sat(); got != 0 {
			t.Fatalf("released undispatched: saturation %v; want 0", got)
		}
	})
}

// meridian_tier1_ttft_seconds keeps a streamed response's first byte (its
// first token) apart from a non-streamed one's (the whole answer): the
// P99 TTFT rule and panel read stream="true" only.
func TestTTFTByStream(t *testing.T) {
	gw, eps, reg := newGateway(t, gateway.Config{}, "")
	load(gw, eps, nil)
	for _, stream := range []bool{true, false, false} {
		b := &request.Body{Model: "chat-model", Kind: request.Completion, Prompt: "hello", Stream: stream}
		d, err := gw.Decide(b, gateway.Meta{Header: http.Header{}})
		if err != nil {
			t.Fatal(err)
		}
		a := gw.Dispatch(d, d.Endpoints[0])
		a.FirstByte()
		a.Done(http.StatusOK, false)
	}
	for label, want := range map[string]float64{"true": 1, "false": 2} {
		if got := counter(t, reg, "meridian_tier1_ttft_seconds", map[string]string{"model_name": "chat-model", "stream": label}); got != want {
			t.Errorf("stream=%q: %v observations, want %v", label, got, want)
		}
	}
}

// The health feed's TTFT quantiles are first tokens: a non-streamed
// answer's first byte is its last, so beside streamed requests its whole
// latency stays out (canary analysis compares pools on this P99). A pool
// whose callers never stream still reports its answers' latency.
func TestPoolTTFTPrefersStreamed(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	for _, tc := range []struct {
		name    string
		streams []bool
		wantP99 time.Duration
	}{
		{"streamed and whole answers", []bool{true, false, true, false, true, false}, 100 * time.Millisecond},
		{"whole answers only", []bool{false, false}, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := now
			gw, eps, _ := newGateway(t, gateway.Config{Now: func() time.Time { return clock }}, "")
			load(gw, eps, nil)
			for _, stream := range tc.streams {
				b := &request.Body{Model: "chat-model", Kind: request.Completion, Prompt: "hello", Stream: stream}
				d, err := gw.Decide(b, gateway.Meta{Header: http.Header{}})
				if err != nil {
					t.Fatal(err)
				}
				a := gw.Dispatch(d, d.Endpoints[0])
				clock = clock.Add(100 * time.Millisecond)
				if !stream {
					clock = clock.Add(4900 * time.Millisecond)
				}
				a.FirstByte()
				a.Done(http.StatusOK, false)
			}
			_, p99, _ := gw.Pools()[0].TTFT(clock, time.Hour)
			if p99 != tc.wantP99 {
				t.Fatalf("p99 %v, want %v", p99, tc.wantP99)
			}
		})
	}
}
