package sim

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestDeterminism(t *testing.T) {
	n := 3000
	if raceEnabled {
		n = 1000
	}
	reqs, at := loadMooncake(t, n)
	pods := []string{"h100", "a100", "l40s", "a10g"}
	// Faults make the pods draw from their random sources too.
	run := func(seed uint64) []Outcome {
		e := NewEngine(seed)
		for i, name := range pods {
			if _, err := e.AddPod(PodConfig{Name: fmt.Sprint(name, i), Profile: mustProfile(t, name), Faults: Faults{ErrorRate: 0.05}}); err != nil {
				t.Fatal(err)
			}
		}
		out := make([]Outcome, len(reqs))
		for i := range reqs {
			e.At(at[i], func() {
				e.Submit(e.Pods()[i%len(pods)], reqs[i], func(o Outcome) { out[i] = o })
			})
		}
		e.Run()
		return out
	}
	a, b, c := run(42), run(42), run(43)
	if !reflect.DeepEqual(a, b) {
		for i := range a {
			if !reflect.DeepEqual(a[i], b[i]) {
				t.Fatalf("same seed, request %d differs:\n%+v\n%+v", i, a[i], b[i])
			}
		}
	}
	if reflect.DeepEqual(a, c) {
		t.Error("different seeds gave identical runs despite random faults")
	}
	failed := 0
	for _, o := range a {
		if errors.Is(o.Err, ErrServerError) {
			failed++
		}
	}
	if lo, hi := n/40, n/10; failed < lo || failed > hi {
		t.Errorf("%d of %d requests hit a 5%% injected error, want %d to %d", failed, n, lo, hi)
	}
}

// TestInfiniteCacheHitRatio checks trace reading and block semantics with
// the pods' own prefix cache: with no eviction, 36.64% of the Mooncake
// trace's block references hit (the published figure).
func TestInfiniteCacheHitRatio(t *testing.T) {
	reqs, _ := loadMooncake(t, 0)
	c := newPrefixCache()
	hits, refs := 0, 0
	for _, r := range reqs {
		m := c.match(r.PrefixHashes)
		hits += m
		refs += len(r.PrefixHashes)
		var pinned []*cacheEntry
		for i, h := range r.PrefixHashes {
			e := c.pin(h)
			if e == nil {
				if i < m {
					t.Fatalf("matched block %d of %s vanished", i, r.ID)
				}
				e = c.insert(h, 32)
			}
			pinned = append(pinned, e)
		}
		for _, e := range pinned {
			c.unpin(e)
		}
	}
	got := 100 * float64(hits) / float64(refs)
	t.Logf("%d of %d block references hit: %.2f%%", hits, refs, got)
	if got < 36.54 || got > 36.74 {
		t.Errorf("infinite-cache hit ratio %.2f%%, want 36.64%% ± 0.1", got)
	}
	if c.blocks != c.evictable || c.blocks != 32*len(c.entries) {
		t.Errorf("cache accounting: %d blocks, %d evictable, %d entries", c.blocks, c.evictable, len(c.entries))
	}
}

// single runs requests (with arrival offsets) on one pod and returns outcomes.
func single(t *testing.T, cfg PodConfig, reqs []*Request, at []time.Duration) []Outcome {
	t.Helper()
	e := NewEngine(1)
	p, err := e.AddPod(cfg)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]Outcome, len(reqs))
	for i := range reqs {
		e.At(at[i], func() { e.Submit(p, reqs[i], func(o Outcome) { out[i] = o }) })
	}
	e.Run()
	for i, o := range out {
		if o.Err != nil {
			t.Fatalf("request %d: %v", i, o.Err)
		}
	}
	return out
}

func req(prompt, output int) *Request { return &Request{PromptTokens: prompt, OutputTokens: output} }

func TestTTFTRisesWithQueueLength(t *testing.T) {
	cfg := PodConfig{Name: "h100", Profile: mustProfile(t, "h100")}
	mean := func(k int) time.Duration {
		reqs := make([]*Request, k)
		at := make([]time.Duration, k)
		for i := range reqs {
			reqs[i] = req(4000, 100)
		}
		var sum time.Duration
		for _, o := range single(t, cfg, reqs, at) {
			sum += o.TTFT()
		}
		return sum / time.Duration(k)
	}
	prev := time.Duration(0)
	for _, k := range []int{1, 4, 16, 64} {
		m := mean(k)
		t.Logf("%2d simultaneous 4000-token prompts: mean TTFT %v", k, m)
		if m <= prev {
			t.Errorf("mean TTFT with %d queued = %v, not above %v", k, m, prev)
		}
		prev = m
	}
}

func TestOlderGPUIsSlower(t *testing.T) {
	var ttft, e2e []time.Duration
	for _, name := range []string{"h100", "a100", "l40s", "a10g"} {
		o := single(t, PodConfig{Name: name, Profile: mustProfile(t, name)}, []*Request{req(2000, 200)}, []time.Duration{0})[0]
		t.Logf("%s: TTFT %v, e2e %v", name, o.TTFT(), o.Finish-o.Arrival)
		ttft = append(ttft, o.TTFT())
		e2e = append(e2e, o.Finish-o.Arrival)
	}
	for i := 1; i < len(ttft); i++ {
		if ttft[i] <= ttft[0] || e2e[i] <= e2e[0] {
			t.Errorf("profile %d not slower than h100: TTFT %v vs %v, e2e %v vs %v", i, ttft[i], ttft[0], e2e[i], e2e[0])
		}
	}
	if ttft[3] < 3*ttft[0] {
		t.Errorf("a10g TTFT %v is not well above h100's %v", ttft[3], ttft[0])
	}
}

func TestPrefixHitCutsTTFT(t *testing.T) {
	hashes := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	a := &Request{PromptTokens: 4200, OutputTokens: 10, PrefixHashes: hashes, HashBlockTokens: 512}
	b := &Request{PromptTokens: 4200, OutputTokens: 10, PrefixHashes: hashes, HashBlockTokens: 512}
	c := &Request{PromptTokens: 4200, OutputTokens: 10, PrefixHashes: []uint64{1, 2, 99}, HashBlockTokens: 512}
	out := single(t, PodConfig{Name: "p", Profile: mustProfile(t, "a100")},
		[]*Request{a, b, c}, []time.Duration{0, 10 * time.Second, 20 * time.Second})
	if out[0].CachedTokens != 0 || out[1].CachedTokens != 8*512 || out[2].CachedTokens != 2*512 {
		t.Errorf("cached tokens %d, %d, %d; want 0, 4096, 1024", out[0].CachedTokens, out[1].CachedTokens, out[2].CachedTokens)
	}
	if !(out[1].TTFT() < out[2].TTFT() && out[2].TTFT() < out[0].TTFT()) {
		t.Errorf("TTFT cold %v, full hit %v, partial hit %v; want full < partial < cold", out[0].TTFT(), out[1].TTFT(), out[2].TTFT())
	}
}

func TestAdapterSwapAddsLoadTime(t *testing.T) {
	prof := mustProfile(t, "l40s")
	prof.MaxLoRAs = 1
	cfg := PodConfig{Name: "p", Profile: prof, Adapters: []string{"a", "b"}}
	r := func(adapter string) *Request { return &Request{PromptTokens: 1000, OutputTokens: 5, Adapter: adapter} }
	// a (cold load), a again (resident), b (evicts a, loads b); spaced so
	// each runs alone.
	out := single(t, cfg, []*Request{r("a"), r("a"), r("b"), r("")},
		[]time.Duration{0, 10 * time.Second, 20 * time.Second, 30 * time.Second})
	resident, swap, base := out[1].TTFT(), out[2].TTFT(), out[3].TTFT()
	if resident != base {
		t.Errorf("resident adapter TTFT %v differs from base model %v", resident, base)
	}
	if swap-resident != prof.AdapterLoadTime || out[0].TTFT()-resident != prof.AdapterLoadTime {
		t.Errorf("swap TTFT %v, cold %v, resident %v; want the load time %v more", swap, out[0].TTFT(), resident, prof.AdapterLoadTime)
	}

	// With one slot, a request for another adapter waits until the
	// running adapter's request finishes.
	out = single(t, cfg, []*Request{r("a"), r("b")}, []time.Duration{0, 0})
	if out[1].FirstToken <= out[0].Finish {
		t.Errorf("second adapter's first token at %v, before the first finished at %v", out[1].FirstToken, out[0].Finish)
	}
}

func TestPreemptionUnderKVPressure(t *testing.T) {
	prof := mustProfile(t, "a10g")
	prof.NumGPUBlocks = 400 // 6,400 tokens
	reqs := make([]*Request, 8)
	at := make([]time.Duration, 8)
	for i := range reqs {
		reqs[i] = req(1000, 1500)
	}
	e := NewEngine(1)
	p, err := e.AddPod(PodConfig{Name: "p", Profile: prof})
	if err != nil {
		t.Fatal(err)
	}
	preemptions, tokens := 0, 0
	e.Every(50*time.Millisecond, func() {
		if u := p.Metrics().KVCacheUsage; u > 1 || u < 0 {
			t.Errorf("KV usage %v outside [0, 1]", u)
		}
	})
	for i := range reqs {
		e.At(at[i], func() {
			e.Submit(p, reqs[i], func(o Outcome) {
				if o.Err != nil {
					t.Errorf("request %d: %v", i, o.Err)
				}
				preemptions += o.Preemptions
				tokens += o.OutputTokens
			})
		})
	}
	e.Run()
	if preemptions == 0 || p.Metrics().Preemptions != uint64(preemptions) {
		t.Errorf("%d preemptions in outcomes, %d in metrics; want some", preemptions, p.Metrics().Preemptions)
	}
	if tokens != 8*1500 {
		t.Errorf("%d tokens generated, want %d", tokens, 8*1500)
	}
}

func TestVirtualFaults(t *testing.T) {
	prof := mustProfile(t, "h100")
	e := NewEngine(1)
	p, _ := e.AddPod(PodConfig{Name: "p", Profile: prof, Faults: Faults{Hang: true}})
	slow, _ := e.AddPod(PodConfig{Name: "slow", Profile: prof, Faults: Faults{SlowFactor: 3}})
	fast, _ := e.AddPod(PodConfig{Name: "fast", Profile: prof})
	var hung, resumed, slowO, fastO Outcome
	e.Submit(p, req(100, 10), func(o Outcome) { hung = o })
	e.Submit(slow, req(100, 10), func(o Outcome) { slowO = o })
	e.Submit(fast, req(100, 10), func(o Outcome) { fastO = o })
	e.Run()
	if !errors.Is(hung.Err, ErrUnfinished) || hung.OutputTokens != 0 {
		t.Errorf("hung pod outcome %+v, want unfinished", hung)
	}
	if got, want := slowO.Finish-slowO.Arrival, 3*(fastO.Finish-fastO.Arrival); got < want-time.Microsecond || got > want+time.Microsecond {
		t.Errorf("slow pod e2e %v, want 3× %v", got, fastO.Finish-fastO.Arrival)
	}

	// Lifting the hang later lets the request finish.
	e2 := NewEngine(1)
	p2, _ := e2.AddPod(PodConfig{Name: "p", Profile: prof, Faults: Faults{Hang: true}})
	e2.Submit(p2, req(100, 10), func(o Outcome) { resumed = o })
	e2.At(5*time.Second, func() {
		if err := e2.SetFaults(p2, Faults{CrashAfterTokens: 4}); err != nil {
			t.Error(err)
		}
	})
	e2.Run()
	if !errors.Is(resumed.Err, ErrCrashed) || resumed.OutputTokens != 4 || resumed.FirstToken < 5*time.Second {
		t.Errorf("resumed then crashed: %+v", resumed)
	}
}

func TestSubmitRejects(t *testing.T) {
	prof := mustProfile(t, "a10g")
	p, err := NewPod(PodConfig{Name: "p", Profile: prof, Adapters: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		r    *Request
		want error
	}{
		{req(0, 1), ErrInvalidRequest},
		{req(1, 0), ErrInvalidRequest},
		{req(32000, 1000), ErrContextLength},
		{&Request{PromptTokens: 10, OutputTokens: 1, Adapter: "zzz"}, ErrUnknownAdapter},
		{&Request{PromptTokens: 10, OutputTokens: 1, PrefixHashes: []uint64{1}, HashBlockTokens: 10}, ErrInvalidRequest},
		{&Request{PromptTokens: 10, OutputTokens: 1, PrefixHashes: []uint64{1, 2}, HashBlockTokens: 16}, ErrInvalidRequest},
	}
	for i, c := range cases {
		if err := p.Submit(0, c.r, nil); !errors.Is(err, c.want) {
			t.Errorf("case %d: %v, want %v", i, err, c.want)
		}
	}
	if p.Busy() {
		t.Error("rejected requests were queued")
	}
}

func TestFleet(t *testing.T) {
	f, err := ParseFleet([]byte(`
pools:
- name: fast
  profile: h100
  adapters: [a, b]
  count: 2
  labels: {region: us-east-1}
- name: old
  profile: A10G
  model: small
  count: 1
  overrides: {maxLoRAs: 8, adapterLoadTime: 60ms}
  faults: {slowFactor: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(1)
	pods, err := e.AddFleet(f)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods {
		names = append(names, p.Name())
	}
	if strings.Join(names, ",") != "fast-0,fast-1,old-0" {
		t.Errorf("pods %v", names)
	}
	old := pods[2].Config()
	if old.Profile.MaxLoRAs != 8 || old.Profile.AdapterLoadTime != 60*time.Millisecond || old.ModelName() != "small" ||
		old.Labels["gpu"] != "a10g" || old.Labels["pool"] != "old" || old.Faults.SlowFactor != 2 {
		t.Errorf("old pod config %+v", old)
	}
	if l := pods[0].Config().Labels; l["region"] != "us-east-1" || l["gpu"] != "h100" || !pods[1].HasAdapter("b") {
		t.Errorf("fast pod labels %v", l)
	}

	bad := []struct{ yaml, want string }{
		{"pools: [{name: x, profile: h100, count: 1, colour: red}]", "unknown field"},
		{"pools: [{name: x, profile: b200, count: 1}]", "pools[0].profile"},
		{"pools: [{name: x, profile: h100, count: 0}]", "pools[0].count"},
		{"pools: [{name: x, profile: h100, count: 1}, {name: x, profile: h100, count: 1}]", "pools[1].name"},
		{"pools: [{name: x, profile: h100, count: 1, faults: {errorRate: 3}}]", "pools[0].faults"},
		{"pools: [{name: x, profile: h100, count: 1, overrides: {adapterLoadTime: 5}}]", "duration"},
		{"pools: []", "pools"},
	}
	for _, b := range bad {
		if _, err := ParseFleet([]byte(b.yaml)); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: error %v, want it to mention %q", b.yaml, err, b.want)
		}
	}
}

func TestAdapterMetrics(t *testing.T) {
	prof := mustProfile(t, "h100")
	prof.MaxLoRAs = 1
	e := NewEngine(1)
	p, err := e.AddPod(PodConfig{Name: "p", Profile: prof, Adapters: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"a", "b", "b", ""} {
		e.Submit(p, &Request{PromptTokens: 500, OutputTokens: 20, Adapter: a}, func(Outcome) {})
	}
	// The first step (a's prefill) began alone at the first Submit; the
	// next admits the base-model request and skips both b requests, whose
	// adapter cannot have the only slot while a runs.
	e.RunUntil(100 * time.Millisecond)
	m := p.Metrics()
	if fmt.Sprint(m.RunningAdapters) != "[a]" || fmt.Sprint(m.WaitingAdapters) != "[b]" || m.Running != 2 || m.Waiting != 2 || m.MaxLoRA != 1 {
		t.Errorf("while a runs: %+v", m)
	}
	if m.KVCacheUsage <= 0 {
		t.Errorf("KV usage %v with two requests running", m.KVCacheUsage)
	}
	e.Run()
	m = p.Metrics()
	if m.RunningAdapters != nil || m.WaitingAdapters != nil || m.RequestsOK != 4 || m.KVCacheUsage != 0 {
		t.Errorf("after the run: %+v", m)
	}
}
