package tier1

import (
	"math/bits"
	"sync/atomic"
)

// blockTable maps a block hash to its holders: a bitmap of the endpoint
// slots that hold the block, and the first index node of its holder chain.
// It is an open-addressing table with linear probing and backward-shift
// deletion, one per stripe, changed only under the stripe's lock.
//
// Matches read it without any lock: every word is read and written with
// atomic operations, and a resize or a widening publishes a new slot array
// through one pointer. A match that runs during a change may see an entry
// twice or miss it (backward shift moves entries), or read the bitmap of
// the entry that moved into a slot: a transient error in a routing
// estimate, never an unsafe read. Writers see a consistent table.
//
// A slot is 2 + W words: the hash, the chain's head node plus one (0 marks
// an empty slot), then the W-word bitmap (slots 0..64W−1). Keeping the full
// hash and the bitmap in the slot lets a match settle each block with one
// load, without touching a node or walking a chain; a system prompt held
// by every pod of a 64-pod pool costs one slot, not 64 links. With 64 pods
// or fewer a slot is 24 bytes, at a load between 3/8 and 3/4.
type blockTable struct {
	cur atomic.Pointer[tableSlots]
	n   int // entries; under the stripe's lock
}

// tableSlots is one generation of a blockTable's slots. Its shape never
// changes; only the words' contents do.
type tableSlots struct {
	w      []atomic.Uint64 // slot i at w[i*stride:(i+1)*stride]
	stride int             // 2 + bitmap words
	shift  uint            // 64 − log2(slots)
	mask   uint64          // slots − 1
}

const (
	wordHash = 0
	wordHead = 1
	wordBits = 2
)

// homeOf is h's first probe position in a table of 2^(64−shift) slots:
// the top bits of h × φ (Fibonacci hashing). Block hashes are xxHash64
// values and already uniform, but callers (tests, token-id schemes) may
// use structured ones; the multiplication spreads sequential keys. The
// stripe is chosen by other bits (stripeOf).
func homeOf(h uint64, shift uint) uint64 {
	return (h * 0x9e3779b97f4a7c15) >> shift
}

// words is how many bitmap words a table has (0 when it has no slots).
func (t *tableSlots) words() int {
	if t == nil {
		return 0
	}
	return t.stride - wordBits
}

// find returns the slot holding h, or -1. It is safe without the lock (see
// blockTable); the probe is bounded so that a reader racing with writers
// always ends.
func (t *tableSlots) find(h uint64) int {
	if t == nil {
		return -1
	}
	n := t.mask + 1
	i := homeOf(h, t.shift)
	for range n {
		s := t.w[int(i)*t.stride:]
		if s[wordHead].Load() == 0 {
			return -1
		}
		if s[wordHash].Load() == h {
			return int(i)
		}
		i = (i + 1) & t.mask
	}
	return -1
}

// bits returns word k of slot i's bitmap (0 past the table's width).
func (t *tableSlots) bits(i, k int) uint64 {
	if k >= t.stride-wordBits {
		return 0
	}
	return t.w[i*t.stride+wordBits+k].Load()
}

// head returns slot i's chain head.
func (t *tableSlots) head(i int) int32 {
	return int32(t.w[i*t.stride+wordHead].Load()) - 1
}

// slots returns the current slot array, for a reader.
func (b *blockTable) slots() *tableSlots { return b.cur.Load() }

// touch loads h's home slot and returns a value of it, so that a caller
// can bring the slots of many hashes into the cache with independent
// loads before using them one by one.
func (b *blockTable) touch(h uint64) uint32 {
	t := b.cur.Load()
	if t == nil {
		return 0
	}
	return uint32(t.w[int(homeOf(h, t.shift))*t.stride+wordHead].Load())
}

// holds reports whether endpoint slot pod holds h, h's chain head
// (nilNode when h is absent) and how many endpoints hold h.
func (b *blockTable) holds(h uint64, pod int32) (held bool, head int32, holders int) {
	t := b.cur.Load()
	i := t.find(h)
	if i < 0 {
		return false, nilNode, 0
	}
	for k := range t.words() {
		holders += bits.OnesCount64(t.bits(i, k))
	}
	return t.bits(i, int(pod>>6))&(1<<(pod&63)) != 0, t.head(i), holders
}

// add records that pod holds h and that node is the new head of h's chain,
// adding the entry if needed. The caller holds the stripe's lock.
func (b *blockTable) add(h uint64, node, pod int32) {
	t := b.cur.Load()
	if w := int(pod>>6) + 1; t.words() < w {
		t = b.resize(max(64, t.size()), w) // a new table, or a wider one
	}
	if (b.n+1)*4 > t.size()*3 {
		t = b.resize(2*t.size(), t.words())
	}
	i := homeOf(h, t.shift)
	for {
		s := t.w[int(i)*t.stride:]
		if s[wordHead].Load() == 0 {
			s[wordHash].Store(h)
			s[wordBits+int(pod>>6)].Store(1 << (pod & 63))
			s[wordHead].Store(uint64(node) + 1) // last: the slot is live from here
			b.n++
			return
		}
		if s[wordHash].Load() == h {
			s[wordBits+int(pod>>6)].Or(1 << (pod & 63))
			s[wordHead].Store(uint64(node) + 1)
			return
		}
		i = (i + 1) & t.mask
	}
}

// remove records that pod no longer holds h and that h's chain now starts
// at head (nilNode: no holder is left, and the entry goes). The caller
// holds the stripe's lock; h must be present.
func (b *blockTable) remove(h uint64, pod, head int32) {
	t := b.cur.Load()
	i := t.find(h)
	if i < 0 {
		return
	}
	s := t.w[i*t.stride:]
	if head != nilNode {
		s[wordBits+int(pod>>6)].And(^uint64(1 << (pod & 63)))
		if int32(s[wordHead].Load())-1 != head {
			s[wordHead].Store(uint64(head) + 1)
		}
		return
	}
	b.del(t, uint64(i))
}

// setHead makes h's chain start at head; h must be present.
func (b *blockTable) setHead(h uint64, head int32) {
	t := b.cur.Load()
	if i := t.find(h); i >= 0 {
		t.w[i*t.stride+wordHead].Store(uint64(head) + 1)
	}
}

// del empties slot i, pulling later members of its probe run into the hole
// when their home slot is at or before it.
func (b *blockTable) del(t *tableSlots, i uint64) {
	mask := t.mask
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := t.w[int(j)*t.stride:]
		if s[wordHead].Load() == 0 {
			break
		}
		home := homeOf(s[wordHash].Load(), t.shift)
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.copySlot(i, j)
			i = j
		}
	}
	d := t.w[int(i)*t.stride:]
	d[wordHead].Store(0) // first: the slot is empty from here
	for k := range t.stride {
		if k != wordHead {
			d[k].Store(0)
		}
	}
	b.n--
	if t.size() > 64 && b.n*8 < t.size() {
		b.resize(t.size()/2, t.words())
	}
}

// copySlot copies slot j over slot i.
func (t *tableSlots) copySlot(i, j uint64) {
	d, s := t.w[int(i)*t.stride:], t.w[int(j)*t.stride:]
	for k := range t.stride {
		d[k].Store(s[k].Load())
	}
}

func (t *tableSlots) size() int {
	if t == nil {
		return 0
	}
	return int(t.mask + 1)
}

// resize publishes a new slot array of size slots and words bitmap words
// holding the current entries.
func (b *blockTable) resize(size, words int) *tableSlots {
	old := b.cur.Load()
	t := &tableSlots{
		w:      make([]atomic.Uint64, size*(wordBits+words)),
		stride: wordBits + words,
		shift:  uint(64 - bits.TrailingZeros(uint(size))),
		mask:   uint64(size - 1),
	}
	for i := range old.size() {
		s := old.w[i*old.stride:]
		if s[wordHead].Load() == 0 {
			continue
		}
		j := homeOf(s[wordHash].Load(), t.shift)
		for t.w[int(j)*t.stride+wordHead].Load() != 0 {
			j = (j + 1) & t.mask
		}
		d := t.w[int(j)*t.stride:]
		for k := range old.stride {
			d[k].Store(s[k].Load())
		}
	}
	b.cur.Store(t)
	return t
}
