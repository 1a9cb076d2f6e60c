package tier1

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/request"
)

// pathFixture is a pool of pods whose prefix index is full (every pod at
// its capacity, so each dispatch evicts as in production) and a stream of
// raw OpenAI chat-completions bodies that share prefixes the way chat
// traffic does:
//
//   - a system prompt, one of 8, of 1 KB (16 blocks), shared by 1/8 of
//     the traffic each;
//   - the conversation so far, one of 512 conversations, from 0 to 224
//     blocks long (uniform per conversation), sent again with every turn;
//   - a new user turn filling the prompt to the wanted number of blocks,
//     unique to the request (it starts with the request's sequence
//     number), so its blocks are new to the index.
//
// The text carries newlines and non-ASCII characters, escaped as Python's
// json.dumps writes them (\n, \u00e9), so the parser decodes escapes as it
// would for real clients. Requests name the base model.
type pathFixture struct {
	s      *Scheduler
	eps    []*Endpoint
	ms     []Metrics
	convs  [][]byte // per conversation, the body with a placeholder turn number
	seqAt  []int    // offset of the turn number in convs[i]
	blocks int
	next   atomic.Int64 // requests made, for turn numbers and the clock
}

// productionKVBlocks is a pod's KV cache in the benchmarks: 20,000 blocks
// of 16 tokens (320K tokens, an H100 serving an 8B model), which the index
// holds as 20,000 blocks of 64 characters: 1.28M entries over 64 pods.
const productionKVBlocks = 20000

const (
	pathSystems       = 8
	pathConversations = 512
	seqDigits         = 16
)

var (
	pathFixturesMu sync.Mutex
	pathFixtures   = map[string]*pathFixture{}
)

// newPathFixture returns the fixture for these sizes, built once per test
// binary: filling 64 pods to capacity takes a few seconds.
func newPathFixture(tb testing.TB, pods, blocks, kvBlocks int) *pathFixture {
	return memo(&pathFixturesMu, pathFixtures, fmt.Sprint(pods, blocks, kvBlocks), func() *pathFixture {
		return buildPathFixture(tb, pods, blocks, kvBlocks)
	})
}

// pathText is deterministic prose of n bytes for (kind, id): words, with a
// newline every few sentences and an accented word now and then, as JSON
// string content (escapes written out).
func pathText(kind string, id, n int) []byte {
	r := rand.New(rand.NewPCG(uint64(id), uint64(len(kind))))
	words := []string{"the", "model", "server", "request", "cache", "prefix", "answer", "briefly", "careful",
		"context", "token", "latency", "r\\u00e9sum\\u00e9", "caf\\u00e9", "routing", "pod", "block", "user"}
	out := make([]byte, 0, n+32)
	out = append(out, kind...)
	out = append(out, ' ')
	out = strconv.AppendInt(out, int64(id), 10)
	out = append(out, ':', ' ')
	for len(out) < n {
		switch r.IntN(24) {
		case 0:
			out = append(out, `.\n`...)
		case 1:
			out = append(out, ", "...)
		default:
			out = append(out, words[r.IntN(len(words))]...)
			out = append(out, ' ')
		}
	}
	// Cut at n without splitting an escape.
	out = out[:n]
	for j := max(0, n-6); j < n; j++ {
		if out[j] == '\\' {
			want := 2
			if j+1 < n && out[j+1] == 'u' {
				want = 6
			}
			if j+want > n {
				return out[:j]
			}
			j++
		}
	}
	return out
}

// buildPathFixture makes the fixture; each pod reports kvBlocks KV blocks
// of 16 tokens, which the index holds as kvBlocks prefix blocks.
func buildPathFixture(tb testing.TB, pods, blocks, kvBlocks int) *pathFixture {
	r := rand.New(rand.NewPCG(uint64(pods), uint64(blocks)))
	ms := make([]Metrics, pods)
	for i := range ms {
		ms[i] = Metrics{Waiting: r.IntN(6), Running: r.IntN(60), KVCacheUsage: r.Float64() * 0.8,
			MaxLoRA: 2, LoRAReported: true, BlockSize: 16, GPUBlocks: kvBlocks, ScrapedAt: t0}
	}
	pool, eps := newPool(ms...)
	policy := config.DefaultPolicy()
	policy.Weights = allWeights
	s, err := NewScheduler(pool, config.Scheduler{Name: "bench", ModelName: "llama"}, policy,
		Options{MaxMetricsAge: 24 * time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	f := &pathFixture{s: s, eps: eps, ms: ms, blocks: blocks}
	bs := policy.BlockSize
	for c := range pathConversations {
		sys := pathText("system", c%pathSystems, 16*bs-len("system")-2)
		history := pathText("history", c, r.IntN(225)*bs)
		var body []byte
		body = append(body, `{"model":"llama","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"`...)
		body = append(body, sys...)
		body = append(body, `"},{"role":"user","content":"`...)
		body = append(body, history...)
		body = append(body, `"},{"role":"user","content":"turn `...)
		seqAt := len(body)
		body = append(body, make([]byte, seqDigits)...)
		body = append(body, ' ')
		// The new turn fills the prompt to blocks blocks (plus a part
		// block) of decoded text: sized on copies whose turn number is
		// digits (the placeholder's NUL bytes are not JSON), grown until
		// the decoded prompt is long enough (escapes decode shorter).
		target := blocks*bs + bs/2
		var turn []byte
		for n := 0; ; {
			turn = pathText("turn", c, n)
			sized := append(append(append([]byte{}, body...), turn...), `"}]}`...)
			copy(sized[seqAt:seqAt+seqDigits], strings.Repeat("0", seqDigits))
			b, err := request.Parse(sized, 0)
			if err != nil {
				tb.Fatalf("conversation %d: %v", c, err)
			}
			have := len(request.AppendPromptText(nil, b))
			if have >= target {
				break
			}
			n += target - have
		}
		body = append(body, turn...)
		body = append(body, `"}]}`...)
		f.convs = append(f.convs, body)
		f.seqAt = append(f.seqAt, seqAt)
	}
	// Fill every pod to capacity with unrelated traffic, then run the
	// workload itself until the index holds its prefixes.
	fill := &Request{Model: "llama", Hashes: make([]uint64, blocks), PromptTokens: 16 * blocks}
	capacity := s.capacity(&ms[0])
	at := t0.Add(-time.Hour)
	for i := 0; !indexFull(pool.PrefixIndex(), pods, capacity); i++ {
		for j := range fill.Hashes {
			fill.Hashes[j] = r.Uint64()
		}
		tk := s.Dispatch(eps[i%pods], fill, at)
		tk.Done()
		at = at.Add(time.Microsecond)
	}
	d := f.decider()
	for range 4 * pathConversations {
		if err := d.decide(); err != nil {
			tb.Fatal(err)
		}
	}
	if !indexFull(pool.PrefixIndex(), pods, capacity) {
		tb.Fatalf("index not full: %s", indexFill(pool.PrefixIndex()))
	}
	return f
}

// indexFull reports whether each of pods slots holds its capacity in
// blocks, to within an anchor's weight (the next anchor would evict).
func indexFull(x *PrefixIndex, pods, capacity int) bool {
	held, caps := x.Blocks()
	if len(held) < pods {
		return false
	}
	for i := range pods {
		if caps[i] != capacity || held[i] > capacity || held[i] <= capacity-anchorEvery {
			return false
		}
	}
	return true
}

// indexFill describes each slot's blocks held and capacity, for failures.
func indexFill(x *PrefixIndex) string {
	held, caps := x.Blocks()
	return fmt.Sprint("held ", held, " of ", caps)
}

// pathDecider makes decisions on a fixture; one per goroutine.
type pathDecider struct {
	f    *pathFixture
	r    *rand.Rand
	body []byte
	req  Request
	dst  []*Endpoint
	// The requests in flight: each finishes pathInFlight decisions after
	// it was dispatched, so that busy pods look busy to the scorers.
	inflight [pathInFlight]Ticket
	k        int // decisions made by this decider
}

// pathInFlight is how many requests a decider keeps in flight: 128 over
// 64 pods, two a pod.
const pathInFlight = 128

func (f *pathFixture) decider() *pathDecider {
	return &pathDecider{f: f, r: rand.New(rand.NewPCG(uint64(f.next.Add(1)), 7)), dst: make([]*Endpoint, 0, 8)}
}

// decide is one request's whole decision path as the data plane runs it,
// from the raw body to the request's completion: parse the body, hash its
// prefix blocks, filter, score with all seven scorers, pick a primary and
// two fallbacks, dispatch to the primary (accounting and prefix index
// update), and finish the request dispatched pathInFlight decisions ago.
// (The first token's report, which refits the pod's latency model, comes
// later and is not part of the decision.) Every 8th request re-scrapes
// one pod, round robin, as the scraper would, so that the counts since
// the scrape stay bounded; the scrape keeps its time (the fixture's
// MaxMetricsAge is a day), so that it allocates nothing.
func (d *pathDecider) decide() error {
	f := d.f
	n := f.next.Add(1)
	c := d.r.IntN(len(f.convs))
	// The turn's number makes its blocks new; the copy is the data plane's
	// read of the body.
	d.body = append(d.body[:0], f.convs[c]...)
	for i, v := f.seqAt[c]+seqDigits-1, n; i >= f.seqAt[c]; i, v = i-1, v/10 {
		d.body[i] = byte('0' + v%10)
	}
	now := t0.Add(time.Duration(n) * time.Microsecond)

	body, err := request.Parse(d.body, 0)
	if err != nil {
		return err
	}
	d.req.Model, d.req.Adapter = body.Model, ""
	f.s.Prepare(&d.req, body)
	d.dst, err = f.s.Schedule(&d.req, now, d.dst[:0])
	body.Release() // as the data plane does once the request is scheduled
	if err != nil {
		return err
	}
	ep := d.dst[0]
	tk := f.s.Dispatch(ep, &d.req, now)
	slot := &d.inflight[d.k%pathInFlight]
	d.k++
	slot.Done() // a no-op on a zero Ticket
	*slot = tk
	if n%8 == 0 {
		i := int(n/8) % len(f.eps)
		f.eps[i].SetMetrics(&f.ms[i])
	}
	return nil
}

// BenchmarkDecisionPath is the whole per-request decision path at
// production scale: raw chat body → request.Parse → prefix hashes →
// Schedule → Dispatch (accounting, prefix index update with evictions) →
// Done. See pathFixture for the workload.
func BenchmarkDecisionPath(b *testing.B) {
	for _, size := range []struct{ pods, blocks int }{{64, 256}} {
		b.Run(fmt.Sprintf("pods=%d/blocks=%d", size.pods, size.blocks), func(b *testing.B) {
			f := newPathFixture(b, size.pods, size.blocks, productionKVBlocks)
			d := f.decider()
			b.ReportAllocs()
			b.SetBytes(int64(len(f.convs[0])))
			cpu := testkit.StartCPU()
			for b.Loop() {
				if err := d.decide(); err != nil {
					b.Fatal(err)
				}
			}
			cpu.Report(b)
		})
	}
}

// BenchmarkDecisionPathParallel is BenchmarkDecisionPath from GOMAXPROCS
// goroutines at once over one pool: with -cpu 1,2 its ns/op shows how
// decisions per second scale with cores.
func BenchmarkDecisionPathParallel(b *testing.B) {
	b.Run("pods=64/blocks=256", func(b *testing.B) {
		f := newPathFixture(b, 64, 256, productionKVBlocks)
		b.ReportAllocs()
		cpu := testkit.StartCPU()
		b.RunParallel(func(pb *testing.PB) {
			d := f.decider()
			for pb.Next() {
				if err := d.decide(); err != nil {
					b.Error(err)
					return
				}
			}
		})
		cpu.Report(b)
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	})
}

// TestDecisionPathAllocs pins the allocations of the whole decision path
// (parse, hash, schedule, dispatch, done) at 64 pods and 256 blocks with
// the index full: the parsed Body and the bytes of its strings, nothing
// else. The pods' caches are small so that the test fills them quickly;
// evictions happen as in production.
func TestDecisionPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	f := newPathFixture(t, 64, 256, 600)
	d := f.decider()
	allocs := testing.AllocsPerRun(300, func() {
		if err := d.decide(); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 2 {
		t.Errorf("%.1f allocations per decision, want ≤ 2", allocs)
	}
	if len(d.req.Hashes) != 256 {
		t.Fatalf("%d blocks hashed, want 256", len(d.req.Hashes))
	}
	x := f.s.pool.PrefixIndex()
	if !indexFull(x, 64, f.s.capacity(&f.ms[0])) {
		t.Fatalf("index not full: %s", indexFill(x))
	}
	// Meridian's index holds anchors, not blocks: at least 8 times fewer
	// entries than the blocks it stands for (16 with these aligned prompts).
	if n, blocks := x.Len(), 64*f.s.capacity(&f.ms[0]); n*8 > blocks {
		t.Errorf("index holds %d entries for %d blocks, want at most an eighth", n, blocks)
	}
}

// TestDecisionPathConcurrent runs whole decisions from several goroutines
// over one full index, so that -race sees adds to different pods, adds to
// the same pod, matches and evictions interleave; the index must still be
// consistent and full afterwards.
func TestDecisionPathConcurrent(t *testing.T) {
	f := buildPathFixture(t, 16, 64, 200)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := f.decider()
			for range 150 {
				if err := d.decide(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	checkIndex(t, f.s.pool.PrefixIndex())
	if x := f.s.pool.PrefixIndex(); !indexFull(x, 16, f.s.capacity(&f.ms[0])) {
		t.Fatalf("index not full: %s", indexFill(x))
	}
}
