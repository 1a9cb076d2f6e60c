package sim

import (
	"errors"
	"fmt"
	"github.com/meridian-router/meridian/internal/traces"
	"io"
	"os"
	"testing"
	"time"

	"github.com/meridian-router/meridian/sim/trace"
)

func mustProfile(t testing.TB, name string) Profile {
	t.Helper()
	p, err := LookupProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// loadMooncake reads the shared Mooncake trace (first n records; n <= 0
// for all) into requests.
func loadMooncake(t testing.TB, n int) ([]*Request, []time.Duration) {
	t.Helper()
	return loadTrace(t, traces.Mooncake, trace.NewMooncake, n)
}

// loadTrace reads the shared trace name, in the format parse reads (first
// n records; n <= 0 for all), into requests.
func loadTrace[R trace.Reader](t testing.TB, name string, parse func(io.Reader) R, n int) ([]*Request, []time.Duration) {
	t.Helper()
	f, err := os.Open(traces.Path(name))
	if err != nil {
		t.Fatalf("open shared trace: %v", err)
	}
	defer f.Close()
	return readRequests(t, parse(f), n)
}

// readRequests reads the first n records of r (n <= 0: all) as requests
// and their arrival times.
func readRequests(t testing.TB, r trace.Reader, n int) ([]*Request, []time.Duration) {
	t.Helper()
	var reqs []*Request
	var at []time.Duration
	for n <= 0 || len(reqs) < n {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, TraceRequest(rec))
		at = append(at, rec.Arrival)
	}
	return reqs, at
}

// replayRoundRobin replays requests on pods of the given profiles,
// round-robin, and returns the outcomes in request order.
func replayRoundRobin(t testing.TB, seed uint64, profiles []string, reqs []*Request, at []time.Duration) ([]Outcome, *Engine) {
	t.Helper()
	e := NewEngine(seed)
	for i, name := range profiles {
		if _, err := e.AddPod(PodConfig{Name: fmt.Sprintf("%s-%d", name, i), Profile: mustProfile(t, name)}); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]Outcome, len(reqs))
	got := make([]bool, len(reqs))
	for i := range reqs {
		i := i
		e.At(at[i], func() {
			e.Submit(e.Pods()[i%len(e.Pods())], reqs[i], func(o Outcome) {
				if got[i] {
					t.Errorf("request %d: done called twice", i)
				}
				got[i] = true
				out[i] = o
			})
		})
	}
	e.Run()
	for i := range got {
		if !got[i] {
			t.Fatalf("request %d: no outcome", i)
		}
	}
	return out, e
}

func TestMooncakeReplayConservation(t *testing.T) {
	n := 0 // the whole trace
	if raceEnabled {
		n = 3000
	}
	reqs, at := loadMooncake(t, n)
	pods := []string{"h100", "h100", "h100", "h100", "a100", "a100", "l40s", "l40s"}
	start := time.Now()
	out, e := replayRoundRobin(t, 1, pods, reqs, at)
	t.Logf("replayed %d requests in %v (virtual %v)", len(reqs), time.Since(start), e.Now())
	var ok, failed int
	var gen, cached uint64
	for i, o := range out {
		switch {
		case o.Err == nil:
			ok++
			if o.OutputTokens != reqs[i].OutputTokens {
				t.Errorf("request %d: %d tokens, want %d", i, o.OutputTokens, reqs[i].OutputTokens)
			}
			if o.FirstToken < o.Arrival || o.Finish < o.FirstToken {
				t.Errorf("request %d: arrival %v first %v finish %v out of order", i, o.Arrival, o.FirstToken, o.Finish)
			}
		default:
			failed++
			if !errors.Is(o.Err, ErrContextLength) {
				t.Errorf("request %d failed: %v", i, o.Err)
			}
		}
		gen += uint64(o.OutputTokens)
		cached += uint64(o.CachedTokens)
	}
	var m Metrics
	for _, p := range e.Pods() {
		pm := p.Metrics()
		m.GenerationTokens += pm.GenerationTokens
		m.RequestsOK += pm.RequestsOK
		m.Failures += pm.Failures
		m.PrefixCacheHits += pm.PrefixCacheHits
		m.PrefixCacheQueries += pm.PrefixCacheQueries
		m.PromptTokens += pm.PromptTokens
		m.Preemptions += pm.Preemptions
		if pm.Waiting+pm.Running != 0 || pm.KVCacheUsage != 0 {
			t.Errorf("pod %s not empty after the run: %+v", p.Name(), pm)
		}
	}
	if int(m.RequestsOK) != ok || int(m.Failures) != failed {
		t.Errorf("pods count %d ok %d failed, outcomes %d ok %d failed", m.RequestsOK, m.Failures, ok, failed)
	}
	// Token conservation: every prompt token was either cached or
	// computed (more than once if preempted), and every output token
	// reported was generated.
	var prompt uint64
	for _, r := range reqs {
		prompt += uint64(r.PromptTokens)
	}
	if m.PrefixCacheQueries < prompt || m.PrefixCacheHits+m.PromptTokens < prompt ||
		(m.Preemptions == 0 && (m.PrefixCacheQueries != prompt || m.PrefixCacheHits+m.PromptTokens != prompt)) {
		t.Errorf("prompt tokens %d, queried %d, hit %d, computed %d, %d preemptions: do not add up",
			prompt, m.PrefixCacheQueries, m.PrefixCacheHits, m.PromptTokens, m.Preemptions)
	}
	if m.GenerationTokens < gen {
		t.Errorf("pods generated %d tokens, outcomes report %d", m.GenerationTokens, gen)
	}
	t.Logf("ok %d failed %d; prefix hits %d / queries %d tokens (%.1f%%)", ok, failed, m.PrefixCacheHits, m.PrefixCacheQueries, 100*float64(m.PrefixCacheHits)/float64(m.PrefixCacheQueries))
}

func TestEngineClock(t *testing.T) {
	e := NewEngine(1)
	var ticks []time.Duration
	stop := e.Every(time.Second, func() { ticks = append(ticks, e.Now()) })
	var order []int
	e.At(2500*time.Millisecond, func() { order = append(order, 2) })
	e.At(2500*time.Millisecond, func() { order = append(order, 3) })
	e.At(time.Second/2, func() {
		order = append(order, 1)
		e.At(0, func() { order = append(order, 0) }) // in the past: runs now, after what is due
	})
	e.RunUntil(1500 * time.Millisecond)
	if e.Now() != 1500*time.Millisecond || len(ticks) != 1 {
		t.Errorf("after RunUntil(1.5s): now %v, ticks %v", e.Now(), ticks)
	}
	// Run stops at 2.5 s: after that only the periodic tick is left.
	if end := e.Run(); end != 2500*time.Millisecond {
		t.Errorf("Run ended at %v, want 2.5s", end)
	}
	if len(ticks) != 2 || ticks[1] != 2*time.Second {
		t.Errorf("ticks %v, want [1s 2s]", ticks)
	}
	if fmt.Sprint(order) != "[1 0 2 3]" {
		t.Errorf("order %v", order)
	}
	stop()
	e.RunUntil(10 * time.Second)
	if len(ticks) != 2 {
		t.Errorf("stopped ticker ran: %v", ticks)
	}
}

func TestSubmitToForeignPod(t *testing.T) {
	p, err := NewPod(PodConfig{Name: "stray", Profile: mustProfile(t, "h100")})
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(1)
	var got Outcome
	e.Submit(p, req(10, 1), func(o Outcome) { got = o })
	e.Run()
	if !errors.Is(got.Err, ErrInvalidRequest) || p.Busy() {
		t.Errorf("outcome %+v, pod busy %v", got, p.Busy())
	}
}

func TestEngineCancel(t *testing.T) {
	e := NewEngine(1)
	p, _ := e.AddPod(PodConfig{Name: "p", Profile: mustProfile(t, "a10g")})
	running, waiting, kept := req(20000, 100), req(100, 10), req(100, 10)
	out := map[*Request]Outcome{}
	for _, r := range []*Request{running, waiting, kept} {
		e.Submit(p, r, func(o Outcome) { out[o.Request] = o })
	}
	// At 10 ms the long prompt's first 2,048-token chunk is in the current
	// step (the whole budget), and the short ones wait.
	e.At(10*time.Millisecond, func() {
		if m := p.Metrics(); m.Running != 1 || m.Waiting != 2 {
			t.Fatalf("at 10 ms: %+v", m)
		}
		if !e.Cancel(p, running) || !e.Cancel(p, waiting) {
			t.Error("cancel: request not found")
		}
		if e.Cancel(p, running) {
			t.Error("second cancel of the same request succeeded")
		}
	})
	e.Run()
	for _, r := range []*Request{running, waiting} {
		if o := out[r]; !errors.Is(o.Err, ErrCancelled) || o.OutputTokens != 0 {
			t.Errorf("cancelled request outcome %+v", o)
		}
	}
	// The waiting request ends at once; the one in the step when its step ends.
	if out[waiting].Finish != 10*time.Millisecond || out[running].Finish <= 10*time.Millisecond {
		t.Errorf("cancelled at %v (waiting) and %v (in a step)", out[waiting].Finish, out[running].Finish)
	}
	if o := out[kept]; o.Err != nil || o.OutputTokens != 10 {
		t.Errorf("kept request outcome %+v", o)
	}
	if m := p.Metrics(); m.KVCacheUsage != 0 || m.Running+m.Waiting != 0 || m.Failures != 2 || m.RequestsOK != 1 {
		t.Errorf("pod after the run: %+v", m)
	}
}
