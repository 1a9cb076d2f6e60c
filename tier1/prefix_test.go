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
// system prompt is shared) and reports the heap bytes per entry and per
// block held: exact is GIE mode's index (an entry a block), anchored
// Meridian's (an entry every anchorEvery blocks).
func BenchmarkPrefixIndexMemory(b *testing.B) {
	for _, anchored := range []bool{false, true} {
		name := "exact"
		if anchored {
			name = "anchored"
		}
		b.Run(name, func(b *testing.B) { benchIndexMemory(b, anchored) })
	}
}

func benchIndexMemory(b *testing.B, anchored bool) {
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
		for full := 0; full < pods; {
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
			if anchored {
				x.addAnchored(int32(r.IntN(pods)), capacity, stamp, hashes)
			} else {
				x.add(int32(r.IntN(pods)), capacity, stamp, hashes, false)
			}
			stamp += 1000
			held, _ := x.Blocks()
			full = 0
			for _, h := range held {
				if h > capacity-anchorEvery {
					full++
				}
			}
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		held, _ := x.Blocks()
		blocks := 0
		for _, h := range held {
			blocks += h
		}
		heap := float64(after.HeapAlloc - before.HeapAlloc)
		b.ReportMetric(heap/float64(x.Len()), "bytes/entry")
		b.ReportMetric(heap/float64(blocks), "bytes/block")
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

// chain returns n chained hashes, block i's covering blocks 0..i as
// request.BlockHashes's do: prompts built from the same (id, i) pairs share
// a prefix exactly as long as their first difference.
func chain(ids ...uint64) []uint64 {
	out := make([]uint64, len(ids))
	h := uint64(0x9e3779b97f4a7c15)
	for i, id := range ids {
		h = (h ^ id) * 0x100000001b3
		h ^= h >> 29
		out[i] = h
	}
	return out
}

// prompt is the chain over ids base, base+1, …, base+n−1.
func prompt(base, n int) []uint64 { return chain(ids(base, n)...) }

func anchoredCounts(x *PrefixIndex, hashes []uint64, slots int) []int32 {
	c := make([]int32, slots)
	x.matchAnchored(hashes, c, &matchScratch{})
	return c
}

// TestPrefixIndexAnchored pins the anchored index of Meridian mode: a
// prompt is held as every 16th block plus its last, charged in blocks; a
// match counts whole runs of 16, plus a prompt's last block found between
// the best slots' last anchor and the next (a conversation's previous
// turn); the dispatch reports the same.
func TestPrefixIndexAnchored(t *testing.T) {
	x := NewPrefixIndex()
	p := prompt(0, 40) // anchors at blocks 15, 31 and 39
	if held := x.addAnchored(0, 1000, 1000, p); held != 0 {
		t.Fatalf("first add: held %d, want 0", held)
	}
	if got := x.Len(); got != 3 {
		t.Errorf("Len = %d entries, want 3 (blocks 15, 31, 39)", got)
	}
	if held, _ := x.Blocks(); held[0] != 40 {
		t.Errorf("slot 0 is charged %d blocks, want 40", held[0])
	}
	// The same prompt: all of it. A longer one (the next turn): the 40
	// blocks, found as the previous prompt's last block. One that diverges
	// at block 20: the 16 blocks up to the shared anchor.
	next := chain(append(ids(0, 40), ids(500, 30)...)...)
	diverged := chain(append(ids(0, 20), ids(900, 30)...)...)
	for _, tc := range []struct {
		name   string
		hashes []uint64
		want   int32
	}{{"same", p, 40}, {"next turn", next, 40}, {"diverged at 20", diverged, 16}, {"first 10", p[:10], 0}} {
		if got := anchoredCounts(x, tc.hashes, 2); got[0] != tc.want || got[1] != 0 {
			t.Errorf("%s: counts %v, want [%d 0]", tc.name, got, tc.want)
		}
	}
	if held := x.addAnchored(0, 1000, 2000, next); held != 40 {
		t.Errorf("next turn's dispatch: held %d, want 40", held)
	}
	// A short prompt is one entry, its last block.
	x.addAnchored(1, 1000, 1000, prompt(0, 5))
	if got := anchoredCounts(x, prompt(0, 9), 2); got[1] != 5 {
		t.Errorf("short prompt: slot 1 matched %d, want 5", got[1])
	}
	checkIndex(t, x)
}

func ids(base, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(base + i)
	}
	return out
}

// TestPrefixIndexAnchoredEviction checks that a full endpoint keeps whole
// prefixes: the newest anchors whose blocks fit its capacity, a prompt's
// head before its tail, so that counting leading anchors finds all it
// holds; and that re-adding in another order converges.
func TestPrefixIndexAnchoredEviction(t *testing.T) {
	x := NewPrefixIndex()
	a, b := prompt(0, 64), prompt(1000, 64) // 4 anchors of 16 blocks each
	x.addAnchored(0, 96, 1000, a)
	x.addAnchored(0, 96, 2000, b) // 128 blocks > 96: a's last two anchors go
	if got := anchoredCounts(x, a, 1)[0]; got != 32 {
		t.Errorf("older prompt: %d blocks kept, want 32 (its head)", got)
	}
	if got := anchoredCounts(x, b, 1)[0]; got != 64 {
		t.Errorf("newer prompt: %d blocks, want 64", got)
	}
	if held, _ := x.Blocks(); held[0] != 96 {
		t.Errorf("charged %d blocks, want 96", held[0])
	}
	y := NewPrefixIndex()
	y.addAnchored(0, 96, 2000, b)
	y.addAnchored(0, 96, 1000, a)
	y.addAnchored(0, 96, 2000, b)
	ex, ey := x.entries(0), y.entries(0)
	if len(ex) != len(ey) {
		t.Fatalf("%d entries against %d", len(ex), len(ey))
	}
	for i := range ex {
		if ex[i].hash != ey[i].hash || ex[i].stamp != ey[i].stamp {
			t.Fatalf("entry %d differs: %x@%d, %x@%d", i, ex[i].hash, ex[i].stamp, ey[i].hash, ey[i].stamp)
		}
	}
	checkIndex(t, x)
	checkIndex(t, y)
}

// TestPrefixIndexAnchoredChurn runs random conversations through the
// anchored index, with removals, against a reference that holds every
// block each slot was sent (no capacity): a match never exceeds the
// reference and falls short of it by less than one anchor's run of blocks.
func TestPrefixIndexAnchoredChurn(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	x := NewPrefixIndex()
	const slots = 6
	ref := make([]map[uint64]bool, slots)
	for s := range ref {
		ref[s] = map[uint64]bool{}
	}
	convs := make([][]uint64, 12)
	for i := range convs {
		convs[i] = ids(i*100000, 1+r.IntN(20))
	}
	for step := range 3000 {
		c := r.IntN(len(convs))
		convs[c] = append(convs[c], ids(step*1000+7, 1+r.IntN(40))...)
		if len(convs[c]) > 200 {
			convs[c] = ids(c*100000+step, 1+r.IntN(20))
		}
		h := chain(convs[c]...)
		if r.IntN(2) == 0 {
			slot := int32(r.IntN(slots))
			x.addAnchored(slot, 1<<20, int64(step), h)
			for _, v := range h {
				ref[slot][v] = true
			}
		}
		got := anchoredCounts(x, h, slots)
		for s := range slots {
			want := 0
			for i, v := range h {
				if ref[s][v] {
					want = i + 1 // chained: holding block i is holding 0..i
				}
			}
			if int(got[s]) > want || int(got[s]) < want-(anchorEvery-1) {
				t.Fatalf("step %d slot %d: matched %d, reference %d", step, s, got[s], want)
			}
		}
		if step%1000 == 999 {
			s := int32(r.IntN(slots))
			x.removePod(s)
			ref[s] = map[uint64]bool{}
			checkIndex(t, x)
		}
	}
	checkIndex(t, x)
}
