package tier1

import (
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

func seq(from, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(from + i)
	}
	return out
}

func counts(x *PrefixIndex, hashes []uint64, slots int, consecutive bool) []int32 {
	c := make([]int32, slots)
	x.match(hashes, c, consecutive, &matchScratch{})
	return c
}

func TestPrefixIndexMatch(t *testing.T) {
	x := NewPrefixIndex()
	x.add(0, 100, 1000, seq(1, 8), false) // pod 0 has blocks 1..8
	x.add(1, 100, 1000, seq(1, 3), false) // pod 1 has 1..3
	x.add(2, 100, 1000, []uint64{1, 2, 4, 5}, false)
	q := seq(1, 10)
	if got, want := counts(x, q, 4, true), []int32{8, 3, 2, 0}; !slices.Equal(got, want) {
		t.Errorf("consecutive: %v, want %v", got, want)
	}
	// GIE counts every block each endpoint holds until a block nobody holds.
	if got, want := counts(x, q, 4, false), []int32{8, 3, 4, 0}; !slices.Equal(got, want) {
		t.Errorf("GIE: %v, want %v", got, want)
	}
	if got := x.matchOne(2, q, true); got != 2 {
		t.Errorf("matchOne consecutive: %d, want 2", got)
	}
	if got := x.matchOne(2, q, false); got != 4 {
		t.Errorf("matchOne GIE: %d, want 4", got)
	}
	x.removePod(0)
	if got, want := counts(x, q, 4, true), []int32{0, 3, 2, 0}; !slices.Equal(got, want) {
		t.Errorf("after removePod: %v, want %v", got, want)
	}
	if x.Len() != 7 {
		t.Errorf("Len = %d, want 7", x.Len())
	}
}

func TestPrefixIndexEvictionOrder(t *testing.T) {
	// Meridian: a full endpoint drops a prompt's tail blocks first.
	x := NewPrefixIndex()
	x.add(0, 4, 1000, seq(1, 6), false)
	if got := counts(x, seq(1, 6), 1, true)[0]; got != 4 {
		t.Errorf("Meridian kept %d leading blocks, want 4", got)
	}
	// A newer prompt displaces the older one.
	x.add(0, 4, 2000, seq(100, 3), false)
	if got := counts(x, seq(100, 3), 1, true)[0]; got != 3 {
		t.Errorf("newer prompt: %d blocks, want 3", got)
	}
	if got := counts(x, seq(1, 6), 1, true)[0]; got != 1 {
		t.Errorf("older prompt: %d blocks, want 1", got)
	}
	// GIE (hashicorp LRU fed in order): the head blocks go first, so the
	// prompt no longer matches at all.
	g := NewPrefixIndex()
	g.add(0, 4, 1000, seq(1, 6), true)
	if got := counts(g, seq(1, 6), 1, false)[0]; got != 0 {
		t.Errorf("GIE kept a match of %d, want 0 (blocks 1,2 evicted)", got)
	}
	if got := g.matchOne(0, seq(3, 4), false); got != 4 {
		t.Errorf("GIE kept %d of blocks 3..6, want 4", got)
	}
	// GIE fixes capacity at the first add.
	g.add(0, 100, 2000, seq(50, 10), true)
	if g.Len() != 4 {
		t.Errorf("GIE capacity changed: Len %d, want 4", g.Len())
	}
	// Meridian follows the server's reported size.
	x.add(0, 2, 3000, nil, false)
	x.add(0, 2, 3000, seq(200, 1), false)
	if x.Len() != 2 {
		t.Errorf("Meridian shrink: Len %d, want 2", x.Len())
	}
}

// TestPrefixIndexConvergence applies the same events in different orders,
// repeated, to two indexes and requires identical state: replicas that
// exchange events converge.
func TestPrefixIndexConvergence(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	type ev struct {
		slot   int32
		stamp  int64
		hashes []uint64
	}
	var evs []ev
	for i := range 300 {
		evs = append(evs, ev{slot: int32(r.IntN(3)), stamp: int64(1000 + r.IntN(500)), hashes: seq(r.IntN(40)*4, 1+r.IntN(12))})
		_ = i
	}
	apply := func(order []ev) *PrefixIndex {
		x := NewPrefixIndex()
		for _, e := range order {
			x.add(e.slot, 25, e.stamp, e.hashes, false)
		}
		return x
	}
	a := apply(evs)
	shuffled := slices.Clone(evs)
	r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	shuffled = append(shuffled, shuffled[:100]...) // duplicates
	b := apply(shuffled)
	for slot := range int32(3) {
		ea, eb := a.entries(slot), b.entries(slot)
		if len(ea) != 25 {
			t.Fatalf("slot %d holds %d entries, want the capacity 25", slot, len(ea))
		}
		for i := range ea {
			if ea[i].hash != eb[i].hash || ea[i].stamp != eb[i].stamp {
				t.Fatalf("slot %d entry %d: %d@%d vs %d@%d", slot, i, ea[i].hash, ea[i].stamp, eb[i].hash, eb[i].stamp)
			}
		}
		for i := 1; i < len(ea); i++ {
			if !newer(&ea[i-1], ea[i].stamp, ea[i].hash) {
				t.Fatalf("slot %d not ordered at %d", slot, i)
			}
		}
	}
}

// BenchmarkPrefixIndexMemory fills an index to capacity (64 endpoints ×
// 31,250 blocks, GIE's default, with prompts sharing prefixes the way a
// system prompt is shared) and reports the heap bytes per entry.
func BenchmarkPrefixIndexMemory(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		x := NewPrefixIndex()
		const pods, capacity = 64, 31250
		r := rand.New(rand.NewPCG(7, 7))
		stamp := int64(1)
		hashes := make([]uint64, 256)
		b.StartTimer()
		for x.Len() < pods*capacity {
			// A prompt: 16 blocks of one of 50 shared system prompts, then
			// 240 unique blocks.
			sys := uint64(r.IntN(50)) << 40
			for i := range hashes {
				if i < 16 {
					hashes[i] = sys | uint64(i)
				} else {
					hashes[i] = r.Uint64()
				}
			}
			x.add(int32(r.IntN(pods)), capacity, stamp, hashes, false)
			stamp += 1000
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(x.Len()), "bytes/entry")
		b.ReportMetric(float64(x.Len()), "entries")
		runtime.KeepAlive(x)
		b.StartTimer()
	}
}

// checkIndex verifies the index's invariants: every entry is reachable
// from its hash's chain in its hash's stripe, chains hold only live
// entries of that hash, each block's bitmap names exactly the endpoints on
// its chain, and each stripe's table counts each of its distinct hashes
// once.
func checkIndex(t *testing.T, x *PrefixIndex) {
	t.Helper()
	distinct := [numStripes]map[uint64]int{}
	for i := range distinct {
		distinct[i] = map[uint64]int{}
	}
	for slot, p := range *x.pods.Load() {
		n, weight := 0, 0
		for i := p.head; i != nilNode; i = x.node(i).next {
			nd := x.node(i)
			if pod := x.link(i).pod(); pod != int32(slot) {
				t.Fatalf("node %d in slot %d's list says pod %d", i, slot, pod)
			}
			st := stripeOf(nd.hash)
			if !slices.Contains(p.chunks, i>>chunkBits) {
				t.Fatalf("node %d of slot %d lies in chunk %d, not one of its own %v", i, slot, i>>chunkBits, p.chunks)
			}
			held, head, _ := x.stripes[st].table.holds(nd.hash, int32(slot), x)
			if !held {
				t.Fatalf("entry %x of slot %d missing from its bitmap", nd.hash, slot)
			}
			found := false
			var chain []int32
			for j := head; j != nilNode; j = x.link(j).same {
				if x.node(j).hash != nd.hash {
					t.Fatalf("chain of %x holds %x", nd.hash, x.node(j).hash)
				}
				found = found || j == i
				chain = append(chain, x.link(j).pod())
			}
			if !found {
				t.Fatalf("entry %x of slot %d unreachable", nd.hash, slot)
			}
			tb := &x.stripes[st].table
			k := tb.find(nd.hash, x)
			bitsSet := 0
			for w := range tb.words() {
				bitsSet += bits.OnesCount64(tb.bits(k, w))
			}
			if bitsSet != len(chain) {
				t.Fatalf("block %x: bitmap names %d endpoints, chain %v", nd.hash, bitsSet, chain)
			}
			distinct[st][nd.hash]++
			n++
			weight += x.link(i).weight()
		}
		if n != p.entries || weight != p.n {
			t.Fatalf("slot %d: %d listed weighing %d blocks, entries = %d, n = %d", slot, n, weight, p.entries, p.n)
		}
	}
	for st := range x.stripes {
		if x.stripes[st].table.n != len(distinct[st]) {
			t.Fatalf("stripe %d's table holds %d hashes, want %d", st, x.stripes[st].table.n, len(distinct[st]))
		}
	}
}

func TestPrefixIndexChurn(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	x := NewPrefixIndex()
	for i := range 3000 {
		slot := int32(r.IntN(5))
		// Small hash space: many shared hashes, collisions in the table's
		// probe runs, and deletions in the middle of runs.
		hs := make([]uint64, 1+r.IntN(20))
		for j := range hs {
			hs[j] = uint64(r.IntN(500)) * 0x9e3779b97f4a7c15
		}
		x.add(slot, 10+r.IntN(60), int64(i), hs, r.IntN(2) == 0)
		if i%500 == 499 {
			x.removePod(int32(r.IntN(5)))
		}
		if i%100 == 0 {
			checkIndex(t, x)
		}
	}
	checkIndex(t, x)
}

// TestPrefixIndexWidePool checks match against each endpoint's own entries
// in a pool wider than one bitmap word (200 slots, three words), where a
// slot's first add widens the tables it touches, with churn and removals.
func TestPrefixIndexWidePool(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := NewPrefixIndex()
	const slots = 200
	for i := range 4000 {
		slot := int32(r.IntN(slots))
		if i < 300 {
			slot = int32(i % 3 * 90) // 0, 90, 180 first: widen early
		}
		x.add(slot, 30, int64(i), seq(r.IntN(30)*4, 1+r.IntN(16)), false)
		if i%1000 == 999 {
			x.removePod(int32(r.IntN(slots)))
		}
	}
	checkIndex(t, x)
	for range 200 {
		q := seq(r.IntN(30)*4, 1+r.IntN(24))
		for _, consecutive := range []bool{true, false} {
			got := counts(x, q, slots, consecutive)
			// The reference: each slot's entries; GIE's scan stops at the
			// first block no slot holds.
			held := make([]map[uint64]bool, slots)
			for s := range held {
				held[s] = map[uint64]bool{}
				for _, e := range x.entries(int32(s)) {
					held[s][e.hash] = true
				}
			}
			end := len(q)
			for b, h := range q {
				anyHeld := false
				for s := range held {
					anyHeld = anyHeld || held[s][h]
				}
				if !anyHeld {
					end = b
					break
				}
			}
			for s := range held {
				want := 0
				for _, h := range q[:end] {
					if held[s][h] {
						want++
					} else if consecutive {
						break
					}
				}
				if int(got[s]) != want {
					t.Fatalf("consecutive=%v slot %d: matched %d, want %d", consecutive, s, got[s], want)
				}
			}
		}
	}
}
