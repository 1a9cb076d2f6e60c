package tier2

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/configtest"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/sim"
)

// TestRoutingSettingsReloadLive changes each Tier-2 setting that is not
// the JWT issuer/keys (those: TestAuthSettingsReload) through the
// directory source and through etcd while Critical requests flow through
// the front door to two simulated model servers standing in for the
// clusters' Tier-1s, and sees each take effect: the admission thresholds
// (a Sheddable request refused 429, then admitted), the JWT clock skew (a
// token expired 5 minutes ago refused, then accepted), digestMaxAge (a
// silent cluster dropped from the routing decision), the retry budget (a
// failover refused, then allowed), outlier detection (a failing cluster
// ejected by failure rate, readmitted at the configured share, ejected
// after 2 consecutive failures for the configured ejection), the canary
// analysis
// period, and a gossip change reported as needing a restart. No request
// of the flowing traffic fails.
func TestRoutingSettingsReloadLive(t *testing.T) {
	configtest.Sources(t, configtest.SourceOptions{Logger: slog.New(slog.DiscardHandler), Check: Usable}, func(t *testing.T, start func(string, map[string][]byte) configtest.Live) {
		h := newReloadHarness(t)
		jwks, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{jwk(h.key)}})
		live := start(h.yaml(routingStep{}), map[string][]byte{"keys.json": jwks})
		h.start(t, live.Snapshot, live.Updates)
		h.scenario(t, live.Apply)
	})
}

// routingStep is one configuration of the scenario: YAML fragments for
// spec.routing (beyond the weights and RTTs every step has), spec.gossip
// and spec.auth.jwt (beyond the issuer, audience and keys).
type routingStep struct {
	routing, gossip, jwt string
}

// reloadHarness is a Tier-2 in region r1 in front of two simulated model
// servers: cluster c1 in r1 (home, primary: the only weight is proximity
// and r2 is 200 ms away) and c2 in r2 (the failover). Each cluster's
// pool-health digest is put into the fleet every 20 ms, as the health
// feed would, from what digests says.
type reloadHarness struct {
	pods  [2]*sim.LivePod
	key   testKey
	quiet *slog.Logger
	logs  *recordingHandler

	mu      sync.Mutex
	digests [2]*regions.Digest // nil: that cluster's feed is silent

	in  *Instance
	url string
}

func newReloadHarness(t *testing.T) *reloadHarness {
	t.Helper()
	prof, err := sim.LookupProfile("h100")
	if err != nil {
		t.Fatal(err)
	}
	h := &reloadHarness{logs: &recordingHandler{}}
	h.quiet = slog.New(slog.DiscardHandler)
	for i := range h.pods {
		pods, err := sim.StartPods(t.Context(), sim.PodSpec{Pod: sim.PodConfig{Name: fmt.Sprintf("c%d", i+1), Profile: prof, Model: "chat-model"},
			TimeScale: 50, DefaultMaxTokens: 2}, 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pods[0].Close() })
		h.pods[i] = pods[0]
	}
	_, h.key, _ = newKeys(t)
	for i := range h.digests {
		h.digests[i] = &regions.Digest{ReadyPods: 100, TotalPods: 100, FreshPods: 100, Saturation: 0.1}
	}
	return h
}

func (h *reloadHarness) yaml(s routingStep) string {
	gossip := ""
	if s.gossip != "" {
		gossip = "  gossip: " + s.gossip + "\n"
	}
	jwtExtra := ""
	if s.jwt != "" {
		jwtExtra = "\n      " + s.jwt
	}
	return testkit.Topology(testkit.Cluster{Region: "r1", Name: "c1", Tier1: h.pods[0].URL()}, testkit.Cluster{Region: "r2", Name: "c2", Tier1: h.pods[1].URL()}) +
		gossip + fmt.Sprintf(`  routing:
    weights: {regionProximity: 1}
    rtts: [{a: r1, b: r2, rtt: 200ms}]
%s
`, indent(s.routing, "    ")) +
		testkit.Gateway("r1", "c1") + fmt.Sprintf(`  auth:
    jwt:
      issuer: https://auth.example.com/
      audiences: [meridian]
      jwksFile: keys.json%s
      requiredClaims: {present: [sub, tenant]}
`, jwtExtra) + testkit.ChatScheduler +
		testkit.Gateway("r2", "c2") + testkit.ChatScheduler +
		testkit.Tenant("claims-team") + `spec:
  maxBand: Critical
  models: [chat-model]
`
}

func indent(s, by string) string {
	if s == "" {
		return ""
	}
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = by + l
	}
	return strings.Join(lines, "\n")
}

// start runs the Tier-2 on first, following updates, with a gossip node
// of its own (so that a spec.gossip change has timings to differ from),
// and the digest feed.
func (h *reloadHarness) start(t *testing.T, first *config.Snapshot, updates <-chan *config.Snapshot) {
	t.Helper()
	in, err := NewInstance(t.Context(), InstanceConfig{Region: "r1", Name: "t2", Logger: slog.New(h.logs),
		Keys: StaticKeySet(jwk(h.key)), GossipBind: "127.0.0.1:0", GossipProfile: "local"}, first)
	if err != nil {
		t.Fatal(err)
	}
	h.in = in
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); in.Run(ctx, updates) }()
	go func() { defer wg.Done(); h.feed(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	h.url = serveFront(t, in.Handler(), nil) // closed before the cleanup above
	testkit.Eventually(t, "both clusters in the routing decision", func() bool { return len(h.candidates()) == 2 })
}

// feed puts each cluster's digest, as set in h.digests, every 20 ms with a
// new version, until ctx ends.
func (h *reloadHarness) feed(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for v := uint64(1); ; v++ {
		h.mu.Lock()
		for i, d := range h.digests {
			if d == nil {
				continue
			}
			dd := *d
			dd.Region, dd.Cluster, dd.Pool, dd.Model = fmt.Sprintf("r%d", i+1), fmt.Sprintf("c%d", i+1), "chat", "chat-model"
			dd.Version, dd.Produced = v, time.Now()
			h.in.Fleet.Digests().Put(dd)
		}
		h.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// setDigest replaces cluster i's digest (nil: it falls silent).
func (h *reloadHarness) setDigest(i int, d *regions.Digest) {
	h.mu.Lock()
	h.digests[i] = d
	h.mu.Unlock()
}

// candidates lists the clusters the routing decision offers for the
// model, best first.
func (h *reloadHarness) candidates() []string {
	var out []string
	for _, tg := range h.in.Fleet.Select(nil, regions.Request{Model: "chat-model"}) {
		out = append(out, tg.Cluster)
	}
	return out
}

func (h *reloadHarness) token(t *testing.T, edit func(jwt.MapClaims)) string {
	c := goodClaims()
	c["iat"], c["exp"] = time.Now().Add(-time.Minute).Unix(), time.Now().Add(time.Hour).Unix()
	if edit != nil {
		edit(c)
	}
	return "Bearer " + sign(t, h.key, c)
}

// post sends one chat completion and returns its status and body.
func (h *reloadHarness) post(tok string) (int, string, error) {
	req, _ := http.NewRequest(http.MethodPost, h.url+"/v1/chat/completions",
		strings.NewReader(`{"model": "chat-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hello"}]}`))
	req.Header.Set("Authorization", tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// postHeader sends one chat completion and returns its status and
// response headers.
func (h *reloadHarness) postHeader(t *testing.T, tok string) (int, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.url+"/v1/chat/completions",
		strings.NewReader(`{"model": "chat-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hello"}]}`))
	req.Header.Set("Authorization", tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header
}

func (h *reloadHarness) status(t *testing.T, tok string) int {
	t.Helper()
	code, _, err := h.post(tok)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

// reload writes y through the source (write returns the revision it
// became) while four clients send Critical requests, waits until the
// Tier-2 has applied it, and fails the test if any of those requests did
// not succeed.
func (h *reloadHarness) reload(t *testing.T, write func(string) int64, s routingStep) {
	t.Helper()
	tok := h.token(t, nil)
	var rev int64
	testkit.UnderTraffic(t, 4, func(int, int) string {
		code, body, err := h.post(tok)
		return testkit.Failure(code, err, string(body))
	}, func() string {
		rev = write(h.yaml(s))
		return fmt.Sprintf("revision %d", rev)
	}, func() bool { return h.logs.applied() >= rev })
}

// scenario runs every change through write.
func (h *reloadHarness) scenario(t *testing.T, write func(string) int64) {
	in := h.in
	crit := h.token(t, nil)
	shed := h.token(t, func(c jwt.MapClaims) { c["criticality"] = "Sheddable" })
	if code := h.status(t, crit); code != http.StatusOK {
		t.Fatalf("a Critical request before any change: %d", code)
	}

	// Admission: home saturation 0.7 (digest-shipped) with the away
	// cluster full. The default Critical reserve (0.65) keeps Sheddable
	// out above 0.35; with no reserve it is admitted.
	h.setDigest(0, &regions.Digest{ReadyPods: 100, TotalPods: 100, FreshPods: 100, Saturation: 0.7})
	h.setDigest(1, &regions.Digest{ReadyPods: 100, TotalPods: 100, FreshPods: 100, Saturation: 1.5})
	testkit.Eventually(t, "Sheddable refused at home saturation 0.7 with the default reserve", func() bool {
		return h.status(t, shed) == http.StatusTooManyRequests
	})
	h.reload(t, write, routingStep{routing: "admission: {criticalReserve: 0}"})
	testkit.Eventually(t, "Sheddable admitted at 0.7 with criticalReserve 0", func() bool { return h.status(t, shed) == http.StatusOK })

	// queueThreshold and kvCacheThreshold, on digests that ship no
	// saturation (Tier-2 derives it): 2 waiting per pod is 0.4 at the
	// default threshold 5 (Sheddable refused), 0.2 at 10; KV 0.3 is 0.375
	// at the default 0.8, 0.3 at 1.
	h.reload(t, write, routingStep{})
	h.setDigest(0, &regions.Digest{ReadyPods: 100, TotalPods: 100, QueueTotal: 200})
	testkit.Eventually(t, "Sheddable refused at 2 waiting per pod, default queueThreshold", func() bool {
		return h.status(t, shed) == http.StatusTooManyRequests
	})
	h.reload(t, write, routingStep{routing: "admission: {queueThreshold: 10}"})
	testkit.Eventually(t, "Sheddable admitted with queueThreshold 10", func() bool { return h.status(t, shed) == http.StatusOK })
	h.setDigest(0, &regions.Digest{ReadyPods: 100, TotalPods: 100, KVMean: 0.3})
	testkit.Eventually(t, "Sheddable refused at KV 0.3, default kvCacheThreshold", func() bool {
		return h.status(t, shed) == http.StatusTooManyRequests
	})
	h.reload(t, write, routingStep{routing: "admission: {kvCacheThreshold: 1}"})
	testkit.Eventually(t, "Sheddable admitted with kvCacheThreshold 1", func() bool { return h.status(t, shed) == http.StatusOK })
	h.setDigest(0, &regions.Digest{ReadyPods: 100, TotalPods: 100, FreshPods: 100, Saturation: 0.1})
	h.setDigest(1, &regions.Digest{ReadyPods: 100, TotalPods: 100, FreshPods: 100, Saturation: 0.1})

	// staleAfter: the home digest (at most 20 ms old, saturation 0.1)
	// is believed at the default 2s; at 1ms its numbers are not, and a
	// blind Tier-2 refuses Sheddable (Critical still goes).
	h.reload(t, write, routingStep{})
	testkit.Eventually(t, "Sheddable admitted at saturation 0.1", func() bool { return h.status(t, shed) == http.StatusOK })
	h.reload(t, write, routingStep{routing: "admission: {staleAfter: 1ms}"})
	testkit.Eventually(t, "Sheddable refused with staleAfter 1ms", func() bool {
		return h.status(t, shed) == http.StatusTooManyRequests
	})
	// retryAfter: that refusal asks for 1s by default, 7s once set.
	retryAfter := func() string {
		t.Helper()
		var got string
		testkit.Eventually(t, "a Sheddable refusal", func() bool {
			code, hdr := h.postHeader(t, shed)
			got = hdr.Get("Retry-After")
			return code == http.StatusTooManyRequests
		})
		return got
	}
	if ra := retryAfter(); ra != "1" {
		t.Fatalf("Retry-After %q with the default retryAfter; want 1", ra)
	}
	h.reload(t, write, routingStep{routing: "admission: {staleAfter: 1ms, retryAfter: 7s}"})
	if ra := retryAfter(); ra != "7" {
		t.Fatalf("Retry-After %q with retryAfter 7s; want 7", ra)
	}

	// JWT clock skew: a token that expired 5 minutes ago is refused with
	// the default 30 s and accepted with 10 minutes.
	expired := h.token(t, func(c jwt.MapClaims) {
		c["iat"], c["exp"] = time.Now().Add(-time.Hour).Unix(), time.Now().Add(-5*time.Minute).Unix()
	})
	if code := h.status(t, expired); code != http.StatusUnauthorized {
		t.Fatalf("a token expired 5m ago with the default skew: %d, want 401", code)
	}
	h.reload(t, write, routingStep{jwt: "clockSkew: 10m"})
	if code := h.status(t, expired); code != http.StatusOK {
		t.Fatalf("a token expired 5m ago with clockSkew 10m: %d, want 200", code)
	}

	// digestMaxAge: c2's feed falls silent. With 1h its last digest keeps
	// it a candidate; with 1s it is dropped (c1's, 20 ms old at most, is
	// not).
	h.reload(t, write, routingStep{routing: "digestMaxAge: 1h"})
	h.setDigest(1, nil)
	if got := h.candidates(); len(got) != 2 {
		t.Fatalf("candidates %v with c2 silent and digestMaxAge 1h; want c1 and c2", got)
	}
	h.reload(t, write, routingStep{routing: "digestMaxAge: 1s"})
	testkit.Eventually(t, "silent c2 dropped with digestMaxAge 1s", func() bool {
		got := h.candidates()
		return len(got) == 1 && got[0] == "c1"
	})
	h.setDigest(1, &regions.Digest{ReadyPods: 100, TotalPods: 100, FreshPods: 100, Saturation: 0.1})
	h.reload(t, write, routingStep{})
	testkit.Eventually(t, "c2 back once its feed resumes", func() bool { return len(h.candidates()) == 2 })

	// Retry budget: c1 answers 500 to everything. With one retry per
	// window (ratio 0.0001: none earned by a few hundred requests) the
	// first failing request fails over to c2 and the second is not
	// retried; with 1000 per window both fail over. Outlier detection is
	// out of the way (1000 consecutive failures).
	noOutliers := "outlierDetection: {consecutiveFailures: 1000, failureRate: 1, minRequests: 1000000}"
	h.reload(t, write, routingStep{routing: "retryBudget: {ratio: 0.0001, minRetries: 1, window: 1h}\n" + noOutliers})
	failing := func(fail bool) {
		t.Helper()
		f := sim.Faults{}
		if fail {
			f.ErrorRate = 1
		}
		if err := h.pods[0].SetFaults(f); err != nil {
			t.Fatal(err)
		}
	}
	failing(true)
	if code := h.status(t, crit); code != http.StatusOK {
		t.Fatalf("first request with c1 failing and one retry in the budget: %d, want 200 (failed over)", code)
	}
	if code := h.status(t, crit); code == http.StatusOK {
		t.Fatal("second request with c1 failing and the budget spent: 200, want a failure (no retry)")
	}
	failing(false)
	h.reload(t, write, routingStep{routing: "retryBudget: {ratio: 10, minRetries: 1000, window: 1h}\n" + noOutliers})
	failing(true)
	for i := range 3 {
		if code := h.status(t, crit); code != http.StatusOK {
			t.Fatalf("request %d with c1 failing and 1000 retries in the budget: %d, want 200", i, code)
		}
	}
	failing(false)
	if st := h.clusterStatus("c1"); st.Ejections != 0 {
		t.Fatalf("c1 ejected %d times with consecutiveFailures 1000", st.Ejections)
	}

	// Outlier detection. failureRate 0.0001 after minRequests 1 over an
	// interval of 1h: one failure among the few hundred successes c1 has
	// served ejects it (where 1000 consecutive failures are needed and
	// the default rate is 0.5 after 20), for baseEjection 1ms; it comes
	// back at readmitShare 0.5 of its requests, doubling only every
	// readmitStep (1h).
	generous := "retryBudget: {ratio: 10, minRetries: 1000, window: 1h}\n"
	h.reload(t, write, routingStep{routing: generous + "outlierDetection: {consecutiveFailures: 1000, failureRate: 0.0001, minRequests: 1, interval: 1h, baseEjection: 1ms, readmitShare: 0.5, readmitStep: 1h}"})
	failing(true)
	if code := h.status(t, crit); code != http.StatusOK {
		t.Fatalf("a request with c1 failing: %d, want 200 (failed over)", code)
	}
	failing(false)
	if st := h.clusterStatus("c1"); st.Ejections != 1 {
		t.Fatalf("c1 ejected %d times after one failure with failureRate 0.0001; want 1", st.Ejections)
	}
	testkit.Eventually(t, "c1's 1ms ejection over", func() bool { return !h.clusterStatus("c1").Ejected })
	if share := h.clusterStatus("c1").ReadmitShare; share < 0.5 || share > 0.51 {
		t.Fatalf("c1 readmitted at share %v with readmitShare 0.5 doubling every 1h", share)
	}

	// consecutiveFailures 2: two failures in a row eject c1 (each request
	// still succeeds on c2), for baseEjection 1h doubled (a second
	// ejection within ejectionMemory) up to maxEjection 2h, where the
	// defaults are 2s and 2m. First c1 takes its full share again: the
	// default readmitStep (1s) doubles the 0.5 within a second.
	h.reload(t, write, routingStep{routing: generous + "outlierDetection: {consecutiveFailures: 2, failureRate: 1, minRequests: 1000000, baseEjection: 1h, maxEjection: 2h, readmitShare: 0.5}"})
	testkit.Eventually(t, "c1 back to its full share", func() bool { return h.clusterStatus("c1").ReadmitShare == 1 })
	failing(true)
	for i := range 2 {
		if code := h.status(t, crit); code != http.StatusOK {
			t.Fatalf("request %d with c1 failing: %d, want 200 (failed over)", i, code)
		}
	}
	st := h.clusterStatus("c1")
	if st.Ejections != 2 {
		t.Fatalf("c1 ejected %d times in all after 2 failures in a row with consecutiveFailures 2; want 2", st.Ejections)
	}
	if left := time.Until(st.EjectedUntil); left < 90*time.Minute {
		t.Fatalf("c1 ejected until %s (%s from now) with baseEjection 1h, doubled, maxEjection 2h", st.EjectedUntil, left)
	}
	failing(false)
	if got := h.candidates(); len(got) != 1 || got[0] != "c2" {
		t.Fatalf("candidates %v with c1 ejected; want c2 only", got)
	}

	// The canary analysis period is read every round.
	if p, _ := in.Canary.timing(in.Router.snap.Load().snap); p != 5*time.Second {
		t.Fatalf("canary period %s by default", p)
	}
	h.reload(t, write, routingStep{routing: "canaryAnalysis: {period: 2s, window: 30s}"})
	if p, w := in.Canary.timing(in.Router.snap.Load().snap); p != 2*time.Second || w != 30*time.Second {
		t.Fatalf("canary period %s, window %s after the reload; want 2s, 30s", p, w)
	}

	// Gossip timings are read at start: a change is applied for the rest
	// and reported.
	h.reload(t, write, routingStep{gossip: "{probeInterval: 2s}"})
	if !h.logs.has(slog.LevelWarn, "spec.gossip changed") {
		t.Fatal("a changed spec.gossip was not reported")
	}
}

func (h *reloadHarness) clusterStatus(name string) regions.ClusterStatus {
	for _, st := range h.in.Fleet.Status() {
		if st.Cluster == name {
			return st
		}
	}
	return regions.ClusterStatus{}
}

// recordingHandler keeps the records logged through it: the revisions
// Tier-2 applied and the messages at each level.
type recordingHandler struct {
	mu      sync.Mutex
	rev     int64
	records []slog.Record
}

func (r *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (r *recordingHandler) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recordingHandler) WithGroup(string) slog.Handler            { return r }

func (r *recordingHandler) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec.Message == "tier2: configuration applied" {
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "revision" {
				r.rev = max(r.rev, a.Value.Int64())
			}
			return true
		})
	}
	if rec.Level >= slog.LevelWarn {
		r.records = append(r.records, rec.Clone())
	}
	return nil
}

// applied is the highest revision Tier-2 reported applied.
func (r *recordingHandler) applied() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rev
}

func (r *recordingHandler) has(level slog.Level, substr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.records {
		if rec.Level == level && strings.Contains(rec.Message, substr) {
			return true
		}
	}
	return false
}

// CanaryConfig's Period and Window (`meridian tier2 --canary-period`)
// override the configuration's; unset, the configuration's apply, and
// without one the defaults.
func TestCanaryTimingOverride(t *testing.T) {
	snap := func(y string) *config.Snapshot {
		docs, errs := config.Decode("t.yaml", []byte(y))
		if err := errs.Err(); err != nil {
			t.Fatal(err)
		}
		s, err := config.Build(docs, 1)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	plain := snap(reloadTopology)
	withTiming := snap(strings.Replace(reloadTopology, "  regions:", "  routing:\n    canaryAnalysis: {period: 2s, window: 30s}\n  regions:", 1))
	for _, tc := range []struct {
		name           string
		cfg            CanaryConfig
		snap           *config.Snapshot
		period, window time.Duration
	}{
		{"defaults", CanaryConfig{}, plain, 5 * time.Second, time.Minute},
		{"configured", CanaryConfig{}, withTiming, 2 * time.Second, 30 * time.Second},
		{"flag overrides", CanaryConfig{Period: 7 * time.Second}, withTiming, 7 * time.Second, 30 * time.Second},
	} {
		c := &Canary{cfg: tc.cfg}
		if p, w := c.timing(tc.snap); p != tc.period || w != tc.window {
			t.Errorf("%s: period %s, window %s; want %s, %s", tc.name, p, w, tc.period, tc.window)
		}
	}
}
