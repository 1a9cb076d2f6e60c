package replay

import (
	"bytes"
	"encoding/json"
	"errors"
	"github.com/meridian-router/meridian/internal/traces"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/trace"
	"github.com/meridian-router/meridian/tier1"
)

var mooncakePath = traces.Path(traces.Mooncake)

func fleet(t testing.TB, yaml string) *sim.Fleet {
	t.Helper()
	f, err := sim.ParseFleet([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

const mixedFleet = `
pools:
- {name: h100, profile: h100, count: 2}
- {name: a10g, profile: a10g, count: 2}
`

// mooncake loads the first n records of the shared Mooncake trace.
func mooncake(t testing.TB, n int) *Workload {
	t.Helper()
	w, err := LoadTrace(mooncakePath, LoadOptions{Limit: n, Jitter: true, Seed: 1})
	if err != nil {
		t.Fatalf("load shared trace: %v", err)
	}
	return w
}

// synthetic is n short requests arriving every gap, without prefixes.
func synthetic(n int, gap time.Duration) *Workload {
	w := &Workload{}
	for i := range n {
		w.Records = append(w.Records, trace.Record{Line: i + 1, Arrival: time.Duration(i) * gap, InputTokens: 200, OutputTokens: 20})
	}
	return w
}

// twoH100s is a fresh engine's two simulated H100 pods.
func twoH100s(t testing.TB) []*sim.Pod {
	t.Helper()
	pods, err := sim.NewEngine(1).AddFleet(fleet(t, "pools: [{name: p, profile: h100, count: 2}]"))
	if err != nil {
		t.Fatal(err)
	}
	return pods
}

func mustPolicy(t testing.TB, kind string) Policy {
	t.Helper()
	p, err := ParsePolicy(kind, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRoundRobinAlternates(t *testing.T) {
	f := fleet(t, mixedFleet)
	e := sim.NewEngine(1)
	pods, err := e.AddFleet(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, replicas := range []int{1, 2} {
		rs, err := newRouters(mustPolicy(t, RoundRobin), pods, pods[0].Model(), replicas, 1)
		if err != nil {
			t.Fatal(err)
		}
		// Request i goes to replica i mod replicas, which sends its own
		// requests to the pods in turn.
		for i := range 16 {
			got, _, err := rs[i%replicas].route(&item{tokens: 10}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if want := (i / replicas) % len(pods); got != want {
				t.Fatalf("replicas=%d: request %d went to pod %d, want %d", replicas, i, got, want)
			}
		}
	}

	// End to end: every pod gets the same share.
	res, err := Run(synthetic(40, 100*time.Millisecond), mustPolicy(t, RoundRobin), Options{Fleet: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"h100-0", "h100-1", "a10g-0", "a10g-1"} {
		if res.Served[name] != 10 {
			t.Errorf("round-robin served %v, want 10 each", res.Served)
			break
		}
	}
}

func TestLeastRequestPrefersIdlerOfTwo(t *testing.T) {
	pods := twoH100s(t)
	rs, err := newRouters(mustPolicy(t, LeastRequest), pods, pods[0].Model(), 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	// With two pods both are always sampled, so requests never finishing
	// must alternate strictly by in-flight count.
	counts := make([]int, 2)
	for range 10 {
		k, _, err := rs[0].route(&item{tokens: 10}, 0)
		if err != nil {
			t.Fatal(err)
		}
		counts[k]++
		if d := counts[0] - counts[1]; d > 1 || d < -1 {
			t.Fatalf("in-flight counts %v: least-request let them drift apart", counts)
		}
	}
}

// TestGIEDefaultHasGIESemantics drives the gie-default policy's router
// (the tier1 core in GIE mode) and checks its scores against GIE's
// formulas (REFERENCE.md §2), and that Meridian decides differently where
// the two are meant to differ.
func TestGIEDefaultHasGIESemantics(t *testing.T) {
	e := sim.NewEngine(1)
	pods, err := e.AddFleet(fleet(t, "pools: [{name: p, profile: h100, count: 3}]"))
	if err != nil {
		t.Fatal(err)
	}
	gie := mustPolicy(t, GIEDefault)
	if gie.Scheduler.Scoring != config.ScoringGIE || gie.Scheduler.Weights != config.GIEWeights() {
		t.Fatalf("gie-default policy %+v, want GIE scoring with weights 2/2/3", gie.Scheduler)
	}
	snapshot := []sim.Metrics{
		{Waiting: 2, KVCacheUsage: 0.1, BlockSize: 16, NumGPUBlocks: 4000},
		{Waiting: 5, KVCacheUsage: 0.5, BlockSize: 16, NumGPUBlocks: 4000},
		{Waiting: 8, KVCacheUsage: 0.2, BlockSize: 16, NumGPUBlocks: 4000},
	}
	prompt := &item{tokens: 3000, hashIDs: []uint64{7, 8, 9, 10, 11, 12}}
	decide := func(p Policy) (int, []tier1.Score) {
		rs, err := newRouters(p, pods, pods[0].Model(), 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		r := rs[0].(*tier1Router)
		r.scrape(snapshot, 0)
		// Pod 2 was sent this prompt before the current scrape.
		r.sched.Dispatch(r.eps[2], r.prepare(prompt), epoch)
		r.scrape(snapshot, time.Millisecond)
		scores, err := r.sched.Explain(r.prepare(prompt), epoch.Add(time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		k, _, err := r.route(prompt, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		return k, scores
	}

	k, scores := decide(gie)
	// GIE: queue min–max (maxQ−q)/(maxQ−minQ), kv 1−usage, prefix matched
	// share; total Σ weight × score.
	want := [][3]float64{{1, 0.9, 0}, {0.5, 0.5, 0}, {0, 0.8, 1}}
	for i, s := range scores {
		got := [3]float64{s.Parts[tier1.Queue], s.Parts[tier1.KVCache], s.Parts[tier1.Prefix]}
		for j := range got {
			if d := got[j] - want[i][j]; d > 1e-9 || d < -1e-9 {
				t.Errorf("pod %d: GIE parts (queue, kv, prefix) = %v, want %v", i, got, want[i])
				break
			}
		}
		total := 2*want[i][0] + 2*want[i][1] + 3*want[i][2]
		if d := s.Total - total; d > 1e-9 || d < -1e-9 {
			t.Errorf("pod %d: total %v, want %v", i, s.Total, total)
		}
	}
	if k != 2 {
		t.Errorf("gie-default picked pod %d, want 2 (4.6 against 3.8 and 2.0)", k)
	}

	// Meridian discounts the cached prefix on a pod with 8 waiting to
	// nothing, and its queue score is absolute: it goes to the idle pod.
	if k, _ := decide(mustPolicy(t, Meridian)); k != 0 {
		t.Errorf("meridian picked pod %d, want 0", k)
	}
}

// TestReplicasSharePrefixOnlyInMeridianMode checks that a dispatch on one
// Meridian replica reaches the other's prefix index, and a GIE replica's
// does not.
func TestReplicasSharePrefixOnlyInMeridianMode(t *testing.T) {
	pods := twoH100s(t)
	snapshot := []sim.Metrics{{BlockSize: 16, NumGPUBlocks: 4000}, {BlockSize: 16, NumGPUBlocks: 4000}}
	prompt := &item{tokens: 2048, hashIDs: []uint64{1, 2, 3, 4}}
	for _, tc := range []struct {
		kind   string
		shared bool
	}{{Meridian, true}, {GIEDefault, false}} {
		rs, err := newRouters(mustPolicy(t, tc.kind), pods, pods[0].Model(), 2, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			r.scrape(snapshot, 0)
		}
		k, _, err := rs[0].route(prompt, 0)
		if err != nil {
			t.Fatal(err)
		}
		other := rs[1].(*tier1Router)
		scores, err := other.sched.Explain(other.prepare(prompt), epoch)
		if err != nil {
			t.Fatal(err)
		}
		seen := scores[k].Parts[tier1.Prefix] > 0
		if seen != tc.shared {
			t.Errorf("%s: replica 1 sees replica 0's dispatch to pod %d: %v, want %v", tc.kind, k, seen, tc.shared)
		}
	}
}

func TestDeterministic(t *testing.T) {
	w := mooncake(t, 100)
	policies, err := ParsePolicies(strings.Join(PolicyKinds, ","), nil)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Fleet: fleet(t, mixedFleet), Seed: 7, Replicas: 2, RateScale: 2}
	var out [2]bytes.Buffer
	for i := range out {
		rs, err := Compare(w, policies, o)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteJSON(&out[i], rs); err != nil {
			t.Fatal(err)
		}
	}
	if out[0].String() != out[1].String() {
		t.Fatalf("same seed, different JSON:\n%s\n---\n%s", out[0].String(), out[1].String())
	}
	// The random policies do depend on the seed.
	o.Seed = 8
	rs, err := Compare(w, []Policy{mustPolicy(t, Random)}, o)
	if err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if err := WriteJSON(&again, rs); err != nil {
		t.Fatal(err)
	}
	var first Report
	if err := json.Unmarshal(out[0].Bytes(), &first); err != nil {
		t.Fatal(err)
	}
	if first.Results[1].Policy != Random || first.Results[1].TTFT == rs[0].TTFT && first.Results[1].E2E == rs[0].E2E {
		t.Errorf("random with seeds 7 and 8 gave the same latencies %+v", rs[0].TTFT)
	}
}

func TestJSONShape(t *testing.T) {
	w := synthetic(30, 50*time.Millisecond)
	o := Options{Fleet: fleet(t, mixedFleet)}
	plain, err := Compare(w, []Policy{mustPolicy(t, Meridian)}, o)
	if err != nil {
		t.Fatal(err)
	}
	good, err := GoodputAll(w, []Policy{mustPolicy(t, Meridian)}, o, SLO{TTFT: 2 * time.Second}, GoodputSearch{MaxScale: 4})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"policy", "requests", "completed", "failed", "ttft_ms", "e2e_ms", "throughput_rps",
		"output_tokens_per_s", "prefix_hit_ratio", "queue_spread_max", "preemptions"}
	for _, tc := range []struct {
		rs   []*Result
		keys []string
	}{{plain, keys}, {good, append(slices.Clone(keys), "goodput_rps")}} {
		var buf bytes.Buffer
		if err := WriteJSON(&buf, tc.rs); err != nil {
			t.Fatal(err)
		}
		var doc map[string][]map[string]json.RawMessage
		if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
		if len(doc) != 1 || len(doc["results"]) != 1 {
			t.Fatalf("want {\"results\":[one]}, got %s", buf.String())
		}
		checkKeys(t, doc["results"][0], tc.keys)
		for field, sub := range map[string][]string{"ttft_ms": {"p50", "p90", "p99"}, "e2e_ms": {"p50", "p99"}} {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(doc["results"][0][field], &m); err != nil {
				t.Fatal(err)
			}
			checkKeys(t, m, sub)
		}
		var rep Report
		if err := json.Unmarshal(buf.Bytes(), &rep); err != nil || rep.Results[0].Requests != 30 {
			t.Errorf("decoding back: %v, %+v", err, rep.Results)
		}
	}
	if g := good[0].GoodputRPS; g == nil || *g <= 0 {
		t.Errorf("goodput %v: a light synthetic load meets a 2 s SLO at some rate", g)
	}
}

func checkKeys(t *testing.T, m map[string]json.RawMessage, want []string) {
	t.Helper()
	var got []string
	for k := range m {
		got = append(got, k)
	}
	slices.Sort(got)
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		t.Errorf("keys %v, want exactly %v", got, want)
	}
}

func TestGoodputSearch(t *testing.T) {
	w, err := LoadTrace(traces.Path(traces.Azure), LoadOptions{Limit: 300})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Fleet: fleet(t, mixedFleet), RateScale: 4}
	p := mustPolicy(t, Meridian)
	slo := SLO{TTFT: 2 * time.Second}
	r, err := Goodput(w, p, o, slo, GoodputSearch{Precision: 1.1})
	if err != nil {
		t.Fatal(err)
	}
	if r.GoodputRPS == nil || *r.GoodputRPS <= 0 {
		t.Fatalf("goodput %v", r.GoodputRPS)
	}
	if ok, att := slo.Met(r); !ok {
		t.Errorf("reported scale %v misses the SLO (attainment %v)", r.RateScale, att)
	}
	// The search stops below a rate that clearly overloads the fleet.
	o.RateScale = 64
	above, err := Run(w, p, o)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := slo.Met(above); ok || r.RateScale >= 64 {
		t.Errorf("scale 64 meets the SLO (%v) or the search went there (%v)", ok, r.RateScale)
	}
	// An SLO nothing meets gives zero goodput.
	r, err = Goodput(w, p, Options{Fleet: o.Fleet}, SLO{TTFT: time.Microsecond}, GoodputSearch{MinScale: 0.25})
	if err != nil {
		t.Fatal(err)
	}
	if r.GoodputRPS == nil || *r.GoodputRPS != 0 {
		t.Errorf("goodput %v for an impossible SLO, want 0", r.GoodputRPS)
	}
}

func TestBadInput(t *testing.T) {
	_, err := ParsePolicy("least-conn", nil)
	if !errors.Is(err, ErrUnknownPolicy) || !strings.Contains(err.Error(), "round-robin, random, least-request, least-outstanding, gie-default, meridian, oracle") {
		t.Errorf("unknown policy: %v", err)
	}
	_, err = ParseWeights("queue=2,prefixx=3")
	if !errors.Is(err, ErrUnknownWeight) || !strings.Contains(err.Error(), `"prefixx"`) ||
		!strings.Contains(err.Error(), "queue, kvCache, prefix, loraAffinity, runningRequests, predictedLatency, lru") {
		t.Errorf("unknown weight: %v", err)
	}
	if _, err := ParseWeights("queue=-1"); err == nil {
		t.Error("negative weight accepted")
	}
	if _, err := Sweep(mustPolicy(t, Meridian), "lora=1,2"); !errors.Is(err, ErrUnknownWeight) {
		t.Errorf("unknown sweep weight: %v", err)
	}
	if _, err := Sweep(mustPolicy(t, RoundRobin), "prefix=1,2"); err == nil {
		t.Error("sweep of round-robin accepted")
	}

	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}
{"timestamp": 5, "input_length": 10, "output_length": 5, "hash_ids": [1]}
{"timestamp": 9, "input_length": "ten", "output_length": 5, "hash_ids": [2]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = LoadTrace(bad, LoadOptions{})
	var le *trace.LineError
	if !errors.As(err, &le) || le.Line != 3 || le.Field != "input_length" || !strings.Contains(err.Error(), `line 3: field "input_length"`) {
		t.Errorf("malformed line: %v", err)
	}
	csv := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(csv, []byte("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,374,44\r\n2023-11-16 18:15:50.9951690,374,x\r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTrace(csv, LoadOptions{}); err == nil || !strings.Contains(err.Error(), `line 3: field "GeneratedTokens"`) {
		t.Errorf("malformed csv line: %v", err)
	}
	if _, err := LoadTrace(filepath.Join(dir, "trace.txt"), LoadOptions{}); err == nil || !strings.Contains(err.Error(), "--format") {
		t.Errorf("unknown extension: %v", err)
	}

	// The command's own checks.
	for _, inv := range []Invocation{
		{Trace: bad, Fleet: "x.yaml"},                                        // no policy
		{Trace: bad, Fleet: "x.yaml", Policy: "meridian", Compare: "random"}, // both
		{Trace: bad, Fleet: "x.yaml", Policy: "meridian", Gateway: "dir"},    // gateway without scheduler
		{Trace: bad, Fleet: "x.yaml", Compare: "random,meridian", Sweep: "prefix=1"},
		{Trace: bad, Fleet: "x.yaml", Policy: "random", Weights: "kv=1"},
	} {
		if err := inv.Execute(&bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("%+v: no error", inv)
		}
	}
}

// TestGatewayPolicy takes a scheduler's policy from the example platform.
func TestGatewayPolicy(t *testing.T) {
	p, err := GatewayPolicy("../deploy/examples/platform", "us-east-1a/support-agent")
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != Meridian || p.Scheduler.Weights == (config.Weights{}) || p.Name != "meridian us-east-1a/support-agent" {
		t.Errorf("policy %+v", p)
	}
	if _, err := GatewayPolicy("../deploy/examples/platform", "no-such"); err == nil || !strings.Contains(err.Error(), "us-east-1a/support-agent") {
		t.Errorf("unknown scheduler: %v", err)
	}
}

func TestPromptText(t *testing.T) {
	a := promptText(nil, []uint64{1, 2, 3}, 1200, 1<<20)
	b := promptText(nil, []uint64{1, 2, 4}, 1200, 1<<20)
	if len(a) != 1200*tokenChars {
		t.Fatalf("len %d, want %d", len(a), 1200*tokenChars)
	}
	if !bytes.Equal(a[:1024*tokenChars], b[:1024*tokenChars]) || bytes.Equal(a[1024*tokenChars:], b[1024*tokenChars:]) {
		t.Error("equal ids must give equal text, different ids different text")
	}
	if got := promptText(nil, []uint64{1, 2, 3}, 1200, 100); len(got) != 100 {
		t.Errorf("limit: len %d", len(got))
	}
}

func TestPlotAndTable(t *testing.T) {
	rs, err := Compare(synthetic(20, 100*time.Millisecond), []Policy{mustPolicy(t, RoundRobin), mustPolicy(t, GIEDefault)},
		Options{Fleet: fleet(t, mixedFleet)})
	if err != nil {
		t.Fatal(err)
	}
	var svg, table bytes.Buffer
	if err := WritePlot(&svg, rs, "test"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(svg.Bytes(), []byte("<svg")) || !bytes.Contains(svg.Bytes(), []byte("gie-default")) {
		t.Errorf("plot is not an SVG naming the policies: %.200s", svg.String())
	}
	if err := WriteTable(&table, rs); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(table.String()), "\n"); len(lines) != 3 || !strings.Contains(lines[2], "gie-default") {
		t.Errorf("table:\n%s", table.String())
	}
}

// TestSyntheticAdapters gives requests Zipf-distributed synthetic
// adapters: the pools that list none serve them all, every request
// completes, and the workload says the adapters are synthetic.
func TestSyntheticAdapters(t *testing.T) {
	w, err := LoadTrace(traces.Path(traces.Azure),
		LoadOptions{Limit: 200, ZipfAdapters: 40, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(w.AdapterNote, "SYNTHETIC") || len(w.AdapterNames) != 40 || len(w.Adapters) != 200 {
		t.Fatalf("note %q, %d names, %d assignments", w.AdapterNote, len(w.AdapterNames), len(w.Adapters))
	}
	top := 0
	for _, a := range w.Adapters {
		if a == w.AdapterNames[0] || a == w.AdapterNames[1] || a == w.AdapterNames[2] {
			top++
		}
	}
	if top < 160 { // 90% expected
		t.Errorf("top 3 adapters carry %d of 200 requests, want about 180", top)
	}
	p, err := ParsePolicy(Meridian, &config.Weights{Queue: 2, KVCache: 2, LoraAffinity: 1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(w, p, Options{Fleet: fleet(t, mixedFleet)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed != 0 || res.Completed != 200 {
		t.Errorf("completed %d, failed %v", res.Completed, res.FailedBy)
	}
	// A pool that lists its own adapters keeps them: requests for others
	// fail there as unknown.
	res, err = Run(w, mustPolicy(t, RoundRobin), Options{Fleet: fleet(t, "pools: [{name: p, profile: h100, count: 2, adapters: [only-this]}]")})
	if err != nil {
		t.Fatal(err)
	}
	if res.FailedBy["unknown-adapter"] != 200 {
		t.Errorf("failures %v, want 200 unknown-adapter", res.FailedBy)
	}
}

func TestDurationAndLimit(t *testing.T) {
	w, err := LoadTrace(mooncakePath, LoadOptions{Duration: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if last := w.Records[len(w.Records)-1].Arrival; last >= 30*time.Second || len(w.Records) < 10 {
		t.Errorf("%d records, last at %v", len(w.Records), last)
	}
	w, err = LoadTrace(mooncakePath, LoadOptions{Limit: 7, UniquePrompts: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Records) != 7 || w.Records[0].HashIDs != nil {
		t.Errorf("%d records, hash ids %v", len(w.Records), w.Records[0].HashIDs)
	}
}

// TestReplicasShareLoad: a Meridian replica tells the other what tier1's
// gateway publishes live, through the same Scheduler method: its in-flight
// count and prefill backlog on the pod, at dispatch, at the first token and
// at the end.
func TestReplicasShareLoad(t *testing.T) {
	pods := twoH100s(t)
	rs, err := newRouters(mustPolicy(t, Meridian), pods, pods[0].Model(), 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	snapshot := []sim.Metrics{{BlockSize: 16, NumGPUBlocks: 4000}, {BlockSize: 16, NumGPUBlocks: 4000}}
	for _, r := range rs {
		r.scrape(snapshot, 0)
	}
	prompt := &item{tokens: 2048, hashIDs: []uint64{1, 2, 3, 4}}
	k, done, err := rs[0].route(prompt, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := rs[0].(*tier1Router).eps[k], rs[1].(*tier1Router).eps[k]
	check := func(when string, want tier1.PeerLoad) {
		t.Helper()
		if got := mine.LoadReport(); got != want {
			t.Fatalf("%s: replica 0's load %+v, want %+v", when, got, want)
		}
		if got := (tier1.PeerLoad{InFlight: theirs.PeerInFlight(), Backlog: theirs.PeerBacklog()}); got != want {
			t.Fatalf("%s: replica 1 sees %+v, want replica 0's %+v", when, got, want)
		}
	}
	check("dispatched", tier1.PeerLoad{InFlight: 1, Backlog: 2048})
	prompt.firstToken(time.Second)
	check("first token", tier1.PeerLoad{InFlight: 1})
	done(&sim.Outcome{})
	check("done", tier1.PeerLoad{})
}
