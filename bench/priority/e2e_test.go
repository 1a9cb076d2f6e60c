package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/simtest"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/health"
	"github.com/meridian-router/meridian/tier1/proxy"
	"github.com/meridian-router/meridian/tier2"
)

// tier1Cluster is one cluster's Tier-1: gateway, proxy and health feed.
type tier1Cluster struct {
	gw  *gateway.Gateway
	reg *prometheus.Registry
	url string
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func serveHTTP(t testing.TB, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// metric returns the value of the named counter or gauge with the given
// labels in reg (0 if absent).
func metric(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	return testkit.Metric(t, reg, name, labels)
}

type reply struct {
	status int
	header http.Header
	body   string
	took   time.Duration
	err    error
}

func post(url string, header map[string]string) reply {
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hello there","max_tokens":4}`))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b), took: time.Since(start)}
}

// platform is two Regions, each one cluster of one simulated pod with its
// Tier-1 (gateway, proxy, health feed), and a Tier-2 in Region home.
type platform struct {
	home, away *sim.LivePod
	t1         map[string]*tier1Cluster
	in         *tier2.Instance
	t2reg      *prometheus.Registry
	t2url      string
	token      func(tenant, band string) string
}

func newPlatform(t testing.TB) *platform {
	t.Helper()
	ctx := t.Context()
	quiet := slog.New(slog.DiscardHandler)
	spec := sim.PodSpec{Pod: sim.PodConfig{Profile: simtest.Profile(t, "h100"), Model: "m"}, TimeScale: 20, DefaultMaxTokens: 4}
	spec.Pod.Name = "home"
	homePods := simtest.StartPods(t, spec, 1)
	spec.Pod.Name = "away"
	awayPods := simtest.StartPods(t, spec, 1)

	t1ln := map[string]net.Listener{"home": listen(t), "away": listen(t)}
	hln := map[string]net.Listener{"home": listen(t), "away": listen(t)}
	var b strings.Builder
	var clusters []testkit.Cluster
	for _, r := range []string{"home", "away"} {
		clusters = append(clusters, testkit.Cluster{Region: r, Name: "c-" + r, Tier1: "http://" + t1ln[r].Addr().String(), Health: hln[r].Addr().String()})
	}
	b.WriteString(testkit.Topology(clusters...) + "  routing:\n    admission: {criticalReserve: 0.1}\n")
	for _, r := range []string{"home", "away"} {
		pod := homePods[0]
		if r == "away" {
			pod = awayPods[0]
		}
		b.WriteString(testkit.Gateway(r, "c-"+r))
		fmt.Fprintf(&b, testkit.JWTAuth+`      requiredClaims: {present: [sub, tenant]}
  schedulers:
  - name: m
    modelName: m
    modelSelector: {matchLabels: {pool: m}}
    # A small reserve, so that Standard alone saturates the one pod and
    # the spill to the other Region shows (the default is 0.65).
    admission: {criticalReserve: 0.1}
---
apiVersion: meridian.dev/v1alpha1
kind: StaticEndpoints
metadata: {name: pods-%[1]s}
spec:
  cluster: c-%[1]s
  endpoints:
  - {name: %[1]s-0, address: %[2]q, labels: {pool: m}}
`, r, pod.Addr())
	}
	b.WriteString(testkit.Tenant("payments") + "spec: {maxBand: Critical}\n" +
		testkit.Tenant("docs") + "spec: {maxBand: Standard}\n" +
		testkit.Tenant("batch") + "spec: {maxBand: Sheddable}\n" +
		testkit.Tenant("intruder"))
	snap := testkit.Snapshot(t, 1, b.String())

	t1 := map[string]*tier1Cluster{}
	for _, r := range []string{"home", "away"} {
		reg := prometheus.NewRegistry()
		gw, err := gateway.New(gateway.Config{Cluster: "c-" + r, Registerer: reg, Logger: quiet}, snap)
		if err != nil {
			t.Fatal(err)
		}
		gw.Start(ctx, nil)
		serveHTTP(t, t1ln[r], (&proxy.Proxy{Gateway: gw, Logger: quiet}).Handler())
		pub := health.NewPublisher(gw, health.Config{Region: r, Cluster: "c-" + r, Replica: r, Interval: 100 * time.Millisecond, Logger: quiet})
		gs := grpc.NewServer()
		pub.Register(gs)
		go gs.Serve(hln[r])
		go pub.Run(ctx)
		t.Cleanup(gs.Stop)
		t1[r] = &tier1Cluster{gw: gw, reg: reg, url: "http://" + t1ln[r].Addr().String()}
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	token := func(tenant, band string) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"sub": "svc", "tenant": tenant, "criticality": band,
			"iss": "https://auth.example.com/", "aud": "meridian", "exp": time.Now().Add(time.Hour).Unix()})
		tok.Header["kid"] = "k"
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return "Bearer " + s
	}
	t2reg := prometheus.NewRegistry()
	in, err := tier2.NewInstance(ctx, tier2.InstanceConfig{Region: "home", Name: "t2-home", SubscribeAll: true,
		Keys:       tier2.StaticKeySet(jose.JSONWebKey{Key: key.Public(), KeyID: "k", Algorithm: "ES256", Use: "sig"}),
		Registerer: t2reg, Logger: quiet}, snap)
	if err != nil {
		t.Fatal(err)
	}
	t2done := make(chan struct{})
	go func() { in.Run(ctx, nil); close(t2done) }()
	t.Cleanup(func() { <-t2done })
	t2ln := listen(t)
	serveHTTP(t, t2ln, in.Handler())
	t2url := "http://" + t2ln.Addr().String()

	p := &platform{home: homePods[0], away: awayPods[0], t1: t1, in: in, t2reg: t2reg, t2url: t2url, token: token}
	testkit.Eventually(t, "Tier-2 has fresh digests of both clusters", func() bool {
		_, h := p.digest("c-home")
		_, a := p.digest("c-away")
		return h == 1 && a == 1 && len(in.Fleet.Select(nil, regions.Request{Model: "m"})) == 2
	})
	// One request through both tiers: it also creates Tier-2's gate of m.
	if r := post(p.t2url, map[string]string{"Authorization": p.token("docs", "Standard")}); r.status != http.StatusOK {
		t.Fatalf("before overload: %d %s %v", r.status, r.body, r.err)
	}
	return p
}

// digest returns Tier-2's view of a cluster's pool.
func (p *platform) digest(cluster string) (sat float64, fresh int) {
	for _, d := range p.in.Fleet.Digests().Digests() {
		if d.Cluster == cluster {
			return d.Saturation, d.FreshPods
		}
	}
	return 0, 0
}

// overload makes home's pod hang and sends it eight Standard requests
// through Tier-1 home: about five reach the pod (saturating it), the rest
// wait in Tier-1's Gate. It returns once that is so, and Tier-2 has seen
// home saturated. heal ends the
// overload and returns the eight replies.
func (p *platform) overload(t testing.TB) (heal func() []reply) {
	t.Helper()
	if err := p.home.SetFaults(sim.Faults{Hang: true}); err != nil {
		t.Fatal(err)
	}
	home := p.t1["home"]
	gate := home.gw.Gate("m")
	replies := make(chan reply, 8)
	for range 8 {
		go func() { replies <- post(home.url, map[string]string{"x-meridian-tenant": "docs"}) }()
	}
	// One pod at 5 waiting requests is saturated (1.0); Standard stops at
	// 0.9 (the configured Critical reserve is 0.1), so the Gate lets about
	// five in and queues the rest.
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("last seen: %s", last)
		}
	}()
	testkit.Eventually(t, "Tier-1 home queues Standard requests in its Gate while the pod holds the rest", func() bool {
		m := p.home.Metrics()
		last = fmt.Sprintf("gate %d, pod waiting %d running %d, saturation %+v", gate.Len(), m.Waiting, m.Running,
			home.gw.Pools()[0].Saturation(time.Now(), priority.Thresholds{}))
		return gate.Len() > 0 && gate.Len()+m.Waiting+m.Running == 8
	})
	testkit.Eventually(t, "Tier-2's digest of home shows saturation ≥ 1", func() bool {
		s, _ := p.digest("c-home")
		return s >= 1
	})
	testkit.Eventually(t, "Tier-2's home gate has observed it", func() bool {
		return metric(t, p.t2reg, "meridian_priority_pool_saturation", map[string]string{"pool": "m"}) >= 1
	})
	return func() []reply {
		if err := p.home.SetFaults(sim.Faults{}); err != nil {
			t.Fatal(err)
		}
		out := make([]reply, 8)
		for i := range out {
			out[i] = <-replies
		}
		return out
	}
}

// TestOverloadThroughBothTiers runs two Regions, each one cluster with one
// simulated pod, a Tier-1 per cluster and a Tier-2 in Region home, and
// overloads home's pod (it hangs, so what it accepted stays queued):
//
//   - Tier-1 home admits Standard requests until the pool is saturated,
//     then queues the next one in its Gate without choosing a pod, and
//     sends it (200) once the pod recovers;
//   - a Sheddable request at Tier-1 (GIE's negative priority) is answered
//     429 with Retry-After in OpenAI's error shape;
//   - Tier-2 learns home's saturation from Tier-1's digest: a Critical
//     caller is spilled to Region away and served there, Tier-1 away sees
//     its band; a Sheddable caller is refused 429 at Tier-2; a claim above
//     the tenant's maxBand is lowered and counted.
func TestOverloadThroughBothTiers(t *testing.T) {
	p := newPlatform(t)

	// Overload home: its pod stops making progress, so what it accepts
	// stays queued on it. Standard requests go straight to Tier-1 home.
	heal := p.overload(t)
	home := p.t1["home"]
	queued, onPod := home.gw.Gate("m").Len(), p.home.Metrics().Waiting
	t.Logf("home: %d on the hung pod, %d waiting in Tier-1's Gate (no pod chosen yet)", onPod, queued)
	// Five fill the pod; a sixth may get in when a request that finished
	// since the last observation (the one before the overload) hands its
	// slot back before the next observation shows the queue.
	if onPod > 6 {
		t.Errorf("%d requests reached the saturated pod; the Gate should have held all but about 5", onPod)
	}

	// Sheddable at Tier-1 (GIE's header): 429 at once with Retry-After.
	r := post(home.url, map[string]string{"x-gateway-inference-objective": "-1", "x-gateway-inference-fairness-id": "batch"})
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("Sheddable at saturated Tier-1: %d Retry-After %q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	var oe struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal([]byte(r.body), &oe); err != nil || oe.Error.Code == "" || oe.Error.Message == "" {
		t.Errorf("429 body is not an OpenAI error: %s (%v)", r.body, err)
	}
	t.Logf("Tier-1 Sheddable 429 in %s: %s", r.took, r.body)
	if got := metric(t, home.reg, "meridian_priority_shed_total", map[string]string{"pool": "m", "band": "Sheddable", "reason": "saturated"}); got != 1 {
		t.Errorf("Tier-1 Sheddable sheds counted %v, want 1", got)
	}

	// Tier-2 has seen home saturated through the digest (overload waited
	// for it).
	r = post(p.t2url, map[string]string{"Authorization": p.token("payments", "Critical")})
	if r.status != http.StatusOK || r.header.Get("x-meridian-region") != "away" {
		t.Fatalf("Critical at saturated home: %d region %q %s", r.status, r.header.Get("x-meridian-region"), r.body)
	}
	if got := metric(t, p.t2reg, "meridian_priority_spilled_total", map[string]string{"pool": "m", "band": "Critical"}); got != 1 {
		t.Errorf("Tier-2 Critical spills %v, want 1", got)
	}
	if got := metric(t, p.t1["away"].reg, "meridian_priority_decisions_total", map[string]string{"pool": "m", "band": "Critical"}); got != 1 {
		t.Errorf("Tier-1 away admitted %v Critical requests, want 1 (x-meridian-band carries the band)", got)
	}
	r = post(p.t2url, map[string]string{"Authorization": p.token("batch", "Sheddable")})
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("Sheddable at saturated home through Tier-2: %d Retry-After %q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	t.Logf("Tier-2 Sheddable 429 in %s: %s", r.took, r.body)
	// A tenant whose Tenant object sets no maxBand may claim at most
	// Standard. (A tenant without a Tenant object is refused: 403.)
	r = post(p.t2url, map[string]string{"Authorization": p.token("intruder", "Critical")})
	if r.status != http.StatusOK {
		t.Fatalf("over-claimed request: %d %s", r.status, r.body)
	}
	if got := metric(t, p.t2reg, "meridian_priority_downgrades_total", map[string]string{"tenant": "intruder", "from": "Critical", "to": "Standard"}); got != 1 {
		t.Errorf("Tier-2 downgrades %v, want 1", got)
	}
	if got := metric(t, p.t1["away"].reg, "meridian_priority_decisions_total", map[string]string{"pool": "m", "band": "Critical"}); got != 1 {
		t.Errorf("Tier-1 away admitted %v Critical requests, want still 1: the lowered claim arrives as Standard", got)
	}

	// Home recovers: the queued Standard requests leave the Gate, get a
	// pod, and are served.
	for _, r := range heal() {
		if r.status != http.StatusOK {
			t.Errorf("Standard request at home: %d %s %v", r.status, r.body, r.err)
		}
	}
	if got := metric(t, home.reg, "meridian_priority_queued_requests", map[string]string{"pool": "m", "band": "Standard", "tenant": "docs"}); got != 0 {
		t.Errorf("queued after recovery: %v", got)
	}
}
