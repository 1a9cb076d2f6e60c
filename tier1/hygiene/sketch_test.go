package hygiene

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/request"
)

var t0 = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)

// staticPrompt is about 4 KB of system prompt that never changes.
func staticPrompt() string {
	var b strings.Builder
	for i := 0; b.Len() < 4000; i++ {
		fmt.Fprintf(&b, "Rule %d: answer the customer politely, cite the policy section, and never invent order numbers. ", i)
	}
	return b.String()
}

// toolSchema is a JSON tool schema whose keys are rotated by shift: the
// same tool, spelled differently, as a library that does not sort keys
// would send it.
func toolSchema(shift int) string {
	keys := []string{"name", "description", "strict", "type", "parameters", "required", "examples", "version", "owner", "timeout"}
	vals := []string{`"lookup_order"`, `"Find an order by its number and return its status and items."`, `true`, `"function"`,
		`{"type":"object","properties":{"order":{"type":"string","pattern":"^[A-Z]{2}[0-9]{8}$"}}}`, `["order"]`,
		`[{"order":"AB12345678"}]`, `"2024-06-01"`, `"orders-team"`, `30`}
	var b strings.Builder
	b.WriteString("Tools: {")
	for i := range keys {
		j := (i + shift) % len(keys)
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:%s", keys[j], vals[j])
	}
	b.WriteString("}\n")
	return b.String()
}

func chat(system, user string) *request.Body {
	return &request.Body{Model: "m", Kind: request.Chat, Messages: []request.Message{
		{Role: "system", Content: system}, {Role: "user", Content: user}}}
}

// scenario sends 40 prompts each for tenant A (timestamp first), B
// (timestamp last) and C (tool-schema keys reordered) to s.
func scenario(s *Sketch, model string) {
	static := staticPrompt()
	for i := range 40 {
		now := t0.Add(time.Duration(i) * time.Second)
		stamp := now.Add(time.Duration(i) * 1234567 * time.Nanosecond).Format(time.RFC3339Nano)
		observe(s, "A", model, chat("Current time: "+stamp+"\n"+static, "hello"), now)
		observe(s, "B", model, chat(static+"\nCurrent time: "+stamp, "hello"), now)
		observe(s, "C", model, chat(toolSchema(i)+static, "hello"), now)
	}
}

// observe hands s a prompt with the prefix hashes Tier-1's scheduler
// computes for it by default.
func observe(s *Sketch, tenant, model string, body *request.Body, now time.Time) {
	hashes, _ := request.PrefixHashes(nil, body, model, 64, 256, nil)
	s.Observe(tenant, model, body, hashes, now)
}

func find(t *testing.T, rep Report, tenant, model string) Entry {
	t.Helper()
	for _, e := range rep.Entries {
		if e.Tenant == tenant && e.Model == model {
			return e
		}
	}
	t.Fatalf("no entry for %s/%s in %+v", tenant, model, rep.Entries)
	return Entry{}
}

func TestScenarioRanksBreakingTenants(t *testing.T) {
	s := New(Config{Samples: true})
	scenario(s, "m1")
	scenario(s, "m2")
	rep := s.Report(t0.Add(time.Minute), "", func(model string, tokens float64) float64 { return tokens / 10000 })
	if len(rep.Entries) != 6 {
		t.Fatalf("%d entries, want 6: %+v", len(rep.Entries), rep.Entries)
	}
	for _, model := range []string{"m1", "m2"} {
		for _, tenant := range []string{"A", "C"} {
			e := find(t, rep, tenant, model)
			if !e.Breaking() || e.DivergenceOffset != 0 || e.Requests != 40 || e.EarlyDivergences != 39 {
				t.Errorf("%s/%s: %+v, want 39 of 40 breaking at block 0", tenant, model, e)
			}
			if 10*e.LostTokens <= 9*e.SharedTokens {
				t.Errorf("%s/%s: lost %d of %d shared tokens, want > 90%%", tenant, model, e.LostTokens, e.SharedTokens)
			}
			if e.LostPrefillSeconds != float64(e.LostTokens)/10000 {
				t.Errorf("%s/%s: lost prefill %v s for %d tokens", tenant, model, e.LostPrefillSeconds, e.LostTokens)
			}
		}
		b := find(t, rep, "B", model)
		if b.Breaking() || b.EarlyDivergences != 0 || b.LostTokens != 0 || b.SharedTokens == 0 || b.Sample != "" {
			t.Errorf("B/%s: %+v, want healthy", model, b)
		}
		a := find(t, rep, "A", model)
		// The sample shows the changing timestamp (the seconds and the
		// fraction of the last request), not the static text.
		if !strings.Contains(a.Sample, "2026-12-01T08:00:") || !strings.Contains(a.Sample, ":39.") || strings.Contains(a.Sample, "Rule 1") {
			t.Errorf("A/%s sample %q, want the timestamp", model, a.Sample)
		}
		if c := find(t, rep, "C", model); !strings.Contains(c.Sample, `":`) {
			t.Errorf("C/%s sample %q, want the reordered keys", model, c.Sample)
		}
	}
	for i, e := range rep.Entries[:4] {
		if e.Tenant == "B" {
			t.Errorf("B ranked %d: %+v", i, rep.Entries)
		}
	}
}

// TestWithoutSchedulerHashes: past the scheduler's hashes (or without
// them) the sketch hashes blocks itself and reaches the same verdicts.
func TestWithoutSchedulerHashes(t *testing.T) {
	with, without := New(Config{}), New(Config{})
	static := staticPrompt()
	for i := range 20 {
		now := t0.Add(time.Duration(i) * time.Second)
		for _, s := range []*Sketch{with, without} {
			a := chat(fmt.Sprintf("Current time: %d\n", 1000+i)+static, "hello")
			b := chat(static+fmt.Sprintf("\nCurrent time: %d", 1000+i), "hello")
			if s == with {
				observe(s, "A", "m", a, now)
				observe(s, "B", "m", b, now)
			} else {
				s.Observe("A", "m", a, nil, now)
				s.Observe("B", "m", b, nil, now)
			}
		}
	}
	rw, rwo := with.Report(t0.Add(time.Minute), "", nil), without.Report(t0.Add(time.Minute), "", nil)
	if len(rw.Entries) != 2 || fmt.Sprint(rw.Entries) != fmt.Sprint(rwo.Entries) || !rw.Entries[0].Breaking() || rw.Entries[1].Breaking() {
		t.Fatalf("with hashes %+v\nwithout %+v", rw.Entries, rwo.Entries)
	}
}

// TestConcurrentUse runs Observe, Report and Collect at once (under
// -race in CI).
func TestConcurrentUse(t *testing.T) {
	s := New(Config{Samples: true, MaxKeys: 64})
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())
	static := staticPrompt()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				observe(s, fmt.Sprintf("t%d", (g*7+i)%100), "m", chat(fmt.Sprintf("%d ", i)+static, "q"), t0.Add(time.Duration(i)*time.Millisecond))
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			s.Report(t0, "", nil)
			if _, err := reg.Gather(); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	n := 0
	for _, e := range s.Report(t0.Add(time.Second), "", nil).Entries {
		n += int(e.Requests)
	}
	if n == 0 || n > 800 {
		t.Fatalf("%d requests reported", n)
	}
}

func TestSamplesOffByDefault(t *testing.T) {
	s := New(Config{})
	scenario(s, "m")
	for _, e := range s.Report(t0.Add(time.Minute), "", nil).Entries {
		if e.Sample != "" {
			t.Fatalf("sample %q with samples off", e.Sample)
		}
	}
}

func TestWindowSlides(t *testing.T) {
	s := New(Config{Window: 10 * time.Minute})
	scenario(s, "m")
	if e := find(t, s.Report(t0.Add(9*time.Minute), "A", nil), "A", "m"); e.Requests != 40 {
		t.Fatalf("within the window: %+v", e)
	}
	if rep := s.Report(t0.Add(11*time.Minute), "", nil); len(rep.Entries) != 0 {
		t.Fatalf("after the window: %+v", rep.Entries)
	}
	// A new prompt after the window still compares with the old ones.
	observe(s, "A", "m", chat("Current time: 2026-12-01T08:12:00.5Z\n"+staticPrompt(), "hello"), t0.Add(12*time.Minute))
	if e := find(t, s.Report(t0.Add(12*time.Minute), "A", nil), "A", "m"); e.Requests != 1 || e.EarlyDivergences != 1 {
		t.Fatalf("after the window: %+v", e)
	}
}

func TestDifferentPromptsAreNotEarlyDivergence(t *testing.T) {
	s := New(Config{})
	for i := range 20 {
		// Unrelated prompts: nothing shared, nothing lost.
		observe(s, "D", "m", chat(strings.Repeat(fmt.Sprintf("topic %04d ", i), 400), "q"), t0)
		// Short prompts: too little shared to matter.
		observe(s, "E", "m", chat(fmt.Sprintf("id %d: be brief.", i), "q"), t0)
	}
	// Token-id prompts carry no text.
	observe(s, "F", "m", &request.Body{Kind: request.Completion, TokenIDs: []int64{1, 2, 3}}, t0)
	rep := s.Report(t0, "", nil)
	for _, e := range rep.Entries {
		if e.EarlyDivergences != 0 || e.LostTokens != 0 {
			t.Errorf("%+v", e)
		}
		if e.Tenant == "F" {
			t.Errorf("token-id prompt recorded: %+v", e)
		}
	}
}

func TestLongPromptComparedOnItsHead(t *testing.T) {
	s := New(Config{})
	long := strings.Repeat(staticPrompt(), 60) // 240 KB
	for i := range 3 {
		observe(s, "A", "m", &request.Body{Kind: request.Completion, Prompt: fmt.Sprintf("%08d", i) + long}, t0)
	}
	e := find(t, s.Report(t0, "A", nil), "A", "m")
	// At most MaxBlocks (256) blocks of 64 characters are compared: 4096
	// tokens a prompt, all of it shared (block 0 but for its first
	// characters) and lost.
	if e.EarlyDivergences != 2 || e.LostTokens != 2*256*16 {
		t.Fatalf("%+v", e)
	}
}

func TestObserveAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items: allocation counts mean nothing under it")
	}
	s := New(Config{Samples: true})
	static := staticPrompt()
	bodies := make([]*request.Body, 1002)
	for i := range bodies {
		bodies[i] = chat(fmt.Sprintf("Current time: %08d\n", i)+static, "hello")
	}
	hashes := make([][]uint64, len(bodies))
	for i, b := range bodies {
		hashes[i], _ = request.PrefixHashes(nil, b, "m", 64, 256, nil)
	}
	s.Observe("A", "m", bodies[0], hashes[0], t0)
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		i++
		s.Observe("A", "m", bodies[i], hashes[i], t0.Add(time.Duration(i)*time.Millisecond))
	})
	if allocs != 0 {
		t.Fatalf("Observe allocates %.1f times a request", allocs)
	}
	if e := find(t, s.Report(t0.Add(2*time.Second), "A", nil), "A", "m"); e.EarlyDivergences < 1000 {
		t.Fatalf("%+v", e)
	}
	texts := make([][]byte, len(bodies))
	for i, b := range bodies {
		texts[i] = request.AppendPromptText(nil, b)
	}
	i = 0
	if allocs := testing.AllocsPerRun(1000, func() {
		i++
		s.ObserveText("A", "m", texts[i], hashes[i], t0.Add(time.Duration(i)*time.Millisecond))
	}); allocs != 0 {
		t.Fatalf("ObserveText allocates %.1f times a request", allocs)
	}
}

// TestObserveTextIsObserve: the same prompts through Observe and, as
// text, through ObserveText give the same report, with and without the
// scheduler's hashes, for prompts longer than the compared head too.
func TestObserveTextIsObserve(t *testing.T) {
	static := staticPrompt()
	var bodies []*request.Body
	for i := range 40 {
		p := fmt.Sprintf("Current time: %08d\n", i) + static
		if i%3 == 0 {
			p = static + fmt.Sprintf(" Request %d.", i) // diverges late
		}
		if i%5 == 0 {
			p = strings.Repeat(p, 5) // past MaxBlocks
		}
		bodies = append(bodies, chat(p, "hello"), &request.Body{Kind: request.Completion, Prompt: p[i:]})
	}
	for _, withHashes := range []bool{false, true} {
		a, b := New(Config{Samples: true}), New(Config{Samples: true})
		for i, body := range bodies {
			var hashes []uint64
			if withHashes {
				hashes, _ = request.PrefixHashes(nil, body, "m", 64, 256, nil)
			}
			at := t0.Add(time.Duration(i) * time.Second)
			a.Observe("T", "m", body, hashes, at)
			b.ObserveText("T", "m", request.AppendPromptText(nil, body), hashes, at)
		}
		ra, rb := a.Report(t0.Add(time.Minute), "", nil), b.Report(t0.Add(time.Minute), "", nil)
		if len(ra.Entries) != 1 || ra.Entries[0].EarlyDivergences == 0 || ra.Entries[0].Sample == "" {
			t.Fatalf("%+v", ra.Entries)
		}
		if fmt.Sprintf("%+v", ra) != fmt.Sprintf("%+v", rb) {
			t.Errorf("hashes %v: Observe %+v, ObserveText %+v", withHashes, ra, rb)
		}
	}
}

// TestMemoryBoundedPerTenant sends prompts of 10k tenants: each costs a
// bounded sketch, and past MaxKeys the least recently seen are forgotten.
func TestMemoryBoundedPerTenant(t *testing.T) {
	const tenants = 10000
	static := staticPrompt()
	body := chat(static, "hello")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := New(Config{MaxKeys: tenants})
	names := make([]string, 2*tenants)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%05d", i)
	}
	for i := range tenants {
		observe(s, names[i], "m", body, t0)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / tenants
	const maxPerTenant = 2048 // entry ≈1.3 KiB plus map and key overhead
	if per > maxPerTenant {
		t.Fatalf("%d bytes a tenant, want at most %d", per, maxPerTenant)
	}
	t.Logf("%d bytes a tenant", per)
	// Another 10k tenants: the count stays bounded.
	for i := tenants; i < 2*tenants; i++ {
		observe(s, names[i], "m", body, t0.Add(time.Second))
	}
	n := 0
	for i := range s.shards {
		n += len(s.shards[i].entries)
	}
	if n > tenants+numShards {
		t.Fatalf("%d keys kept, cap %d", n, tenants)
	}
	if rep := s.Report(t0.Add(time.Second), names[2*tenants-1], nil); len(rep.Entries) != 1 {
		t.Fatalf("the latest tenant is not kept: %+v", rep.Entries)
	}
	runtime.KeepAlive(names)
}

func TestCollector(t *testing.T) {
	s := New(Config{})
	scenario(s, "m")
	observe(s, "bad\xff", "m", chat("x", "y"), t0)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := ""
			for _, l := range m.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue() + ","
			}
			got[mf.GetName()+"{"+labels+"}"] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"meridian_prompt_early_divergence_total{model=m,tenant=A,}": 39,
		"meridian_prompt_early_divergence_total{model=m,tenant=C,}": 39,
		"meridian_prompt_requests_total{model=m,tenant=A,}":         40,
		"meridian_prompt_requests_total{model=m,tenant=C,}":         40,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if len(got) != 6 || got["meridian_prompt_lost_prefill_tokens_total{model=m,tenant=A,}"] == 0 {
		t.Errorf("series: %v", got)
	}
}

func TestHandlerAndFetch(t *testing.T) {
	s := New(Config{Samples: true})
	scenario(s, "m")
	// The handler reports on the wall clock; the scenario is at t0.
	s2 := New(Config{Samples: true})
	now := time.Now()
	observe(s2, "A", "m", chat("t=1 "+staticPrompt(), "q"), now)
	observe(s2, "A", "m", chat("t=2 "+staticPrompt(), "q"), now)
	observe(s2, "B", "m", chat(staticPrompt(), "q"), now)
	mux := http.NewServeMux()
	mux.Handle(Path, s2.Handler(nil))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	rep, err := Fetch(t.Context(), strings.TrimPrefix(srv.URL, "http://"), "", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Entries) != 2 || rep.Entries[0].Tenant != "A" || rep.Entries[0].Sample == "" || rep.BlockSize != 64 {
		t.Fatalf("%+v", rep)
	}
	rep, err = Fetch(t.Context(), srv.URL+"/metrics", "B", time.Second)
	if err != nil || len(rep.Entries) != 1 || rep.Entries[0].Tenant != "B" {
		t.Fatalf("%+v, %v", rep, err)
	}

	// The JSON contract.
	resp, err := http.Get(srv.URL + Path)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Entries []map[string]any `json:"entries"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, k := range []string{"tenant", "model", "requests", "lostTokens", "divergenceOffset", "sample"} {
		if _, ok := raw.Entries[0][k]; !ok {
			t.Errorf("entry has no %q: %v", k, raw.Entries[0])
		}
	}

	// Bad input gets a clear answer.
	resp, err = http.Post(srv.URL+Path, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %s", resp.Status)
	}
	if _, err := Fetch(t.Context(), srv.URL+"/nowhere/", "", time.Second); err == nil {
		t.Fatal("a wrong path fetched a report")
	}
	if _, err := Fetch(t.Context(), "http://", "", time.Second); err == nil {
		t.Fatal("an empty host fetched a report")
	}

	// Reports of two Tier-1s merge per tenant and model.
	a := s.Report(t0.Add(time.Minute), "", nil)
	m, err := Merge(a, a)
	if err != nil {
		t.Fatal(err)
	}
	if e := find(t, m, "A", "m"); e.Requests != 80 || e.DivergenceOffset != 0 || e.Sample == "" {
		t.Fatalf("merged %+v", e)
	}
	var sb strings.Builder
	if err := m.WriteText(&sb); err != nil || !strings.Contains(sb.String(), "breaks cache") || !strings.Contains(sb.String(), "healthy") {
		t.Fatalf("%v\n%s", err, sb.String())
	}
}

// BenchmarkObserve measures the hook's cost per request, next to the
// prefix hashing Tier-1 already does for the same prompt (baseline: the
// ratio is what the hook adds to that). cpu-ns/op is the process's CPU
// time per request, steadier than wall time on a shared machine.
func BenchmarkObserve(b *testing.B) {
	static := staticPrompt()
	for _, tc := range []struct {
		name   string
		prompt string
	}{{"4KB", static}, {"16KB", strings.Repeat(static, 4)}, {"240KB", strings.Repeat(static, 60)}} {
		// Distinct timestamps: every prompt diverges early, the costlier
		// case (a sample is taken each time).
		var bodies [64]*request.Body
		var hashes [64][]uint64
		for i := range bodies {
			bodies[i] = chat(fmt.Sprintf("Current time: %08d\n", i)+tc.prompt, "hello")
			hashes[i], _ = request.PrefixHashes(nil, bodies[i], "model", 64, 256, nil)
		}
		b.Run(tc.name+"/baseline-prefix-hashes", func(b *testing.B) {
			dst, scratch := make([]uint64, 0, 256), make([]byte, 0, len(tc.prompt)+256)
			benchEach(b, func(i int) {
				dst, scratch = request.PrefixHashes(dst[:0], bodies[i%64], "model", 64, 256, scratch)
			})
		})
		b.Run(tc.name+"/observe", func(b *testing.B) {
			s := New(Config{Samples: true})
			benchEach(b, func(i int) { s.Observe("tenant", "model", bodies[i%64], hashes[i%64], t0) })
		})
		// The gateway's path: the text Tier-1 hashed, not copied again.
		var texts [64][]byte
		for i := range texts {
			texts[i] = request.AppendPromptHead(nil, bodies[i], 64*256)
		}
		b.Run(tc.name+"/observe-text", func(b *testing.B) {
			s := New(Config{Samples: true})
			benchEach(b, func(i int) { s.ObserveText("tenant", "model", texts[i%64], hashes[i%64], t0) })
		})
	}
}

// benchEach measures f, called with 1, 2, 3, … once an iteration, and
// reports its allocations and CPU time.
func benchEach(b *testing.B, f func(i int)) {
	b.ReportAllocs()
	cpu := testkit.StartCPU()
	i := 0
	for b.Loop() {
		i++
		f(i)
	}
	cpu.Report(b)
}
