package tier1

import "math/bits"

// blockTable maps a block hash to its holders: a bitmap of the endpoint
// slots that hold the block, and the first index node of its holder chain.
// It is an open-addressing table with linear probing and backward-shift
// deletion, one per stripe, under the stripe's lock.
//
// A slot is 1 + W words: the chain's head node plus one (0 marks an empty
// slot) and a 32-bit tag of the hash, then the W-word bitmap (slots
// 0..64W−1). With the bitmap in the slot a match settles each block with
// one load, without touching a node or walking a chain: a system prompt
// held by every pod of a 64-pod pool costs one slot, not 64 links. With 64
// pods or fewer a slot is 16 bytes, at a load between 1/2 and 3/4 (1/4
// after many deletions).
//
// Writers confirm a tag against the head node's hash. A match trusts the
// tag (32 bits, plus the stripe's 8): two blocks of a stripe whose tags
// collide within a probe run (about one lookup in 10⁹ at the loads kept)
// would share a count, a negligible error in a routing estimate that saves
// a cache miss a block.
type blockTable struct {
	w      []uint64 // slot i at w[i*stride:(i+1)*stride]
	stride int      // 1 + bitmap words
	slots  uint64   // number of slots
	n      int      // entries
}

// tagOf is the 32 bits of h a slot keeps: the top half of h × φ (Fibonacci
// hashing). Block hashes are xxHash64 values and already uniform, but
// callers (tests, token-id schemes) may use structured ones; the
// multiplication spreads sequential keys. It also gives the home slot
// (homeOfTag), so that moving an entry never reads its node; the stripe is
// chosen by other bits (stripeOf).
func tagOf(h uint64) uint32 {
	return uint32((h * 0x9e3779b97f4a7c15) >> 32)
}

// homeOfTag scales the tag to the table (tag × slots / 2^32), so that the
// table may have any size: it grows by half, not double, keeping its load
// between 1/2 and 3/4 rather than 3/8 and 3/4.
func (t *blockTable) homeOfTag(tag uint32) uint64 {
	return uint64(tag) * t.slots >> 32
}

// next is the slot after i, wrapping.
func (t *blockTable) next(i uint64) uint64 {
	if i++; i == t.slots {
		return 0
	}
	return i
}

// words is how many bitmap words the table has.
func (t *blockTable) words() int { return max(0, t.stride-1) }

func (t *blockTable) size() int {
	if t.w == nil {
		return 0
	}
	return int(t.slots)
}

// find returns the slot holding h, or -1. x's nodes confirm the tag.
func (t *blockTable) find(h uint64, x *PrefixIndex) int {
	if t.w == nil {
		return -1
	}
	tag := tagOf(h)
	for i := t.probeTag(tag, t.homeOfTag(tag)); i >= 0; i = t.probeTag(tag, t.next(uint64(i))) {
		if x.node(t.head(i)).hash == h {
			return i
		}
	}
	return -1
}

// findTag returns the first slot whose tag is h's, or -1: a match's
// lookup, which touches no node.
func (t *blockTable) findTag(h uint64) int {
	if t.w == nil {
		return -1
	}
	tag := tagOf(h)
	return t.probeTag(tag, t.homeOfTag(tag))
}

// probeTag returns the first slot from i on, in probe order, whose tag is
// tag, or -1 at the first empty slot.
func (t *blockTable) probeTag(tag uint32, i uint64) int {
	for ; ; i = t.next(i) {
		s := t.w[int(i)*t.stride]
		if s == 0 {
			return -1
		}
		if uint32(s>>32) == tag {
			return int(i)
		}
	}
}

// bits returns word k of slot i's bitmap (0 past the table's width).
func (t *blockTable) bits(i, k int) uint64 {
	if k >= t.stride-1 {
		return 0
	}
	return t.w[i*t.stride+1+k]
}

func (t *blockTable) head(i int) int32 {
	return int32(uint32(t.w[i*t.stride])) - 1
}

// touch loads h's home slot and the slot a cache line after it, and
// returns a value of them, so that a caller can bring the slots of many
// hashes into the cache with independent loads before using them one by
// one: a probe, or a deletion's backward shift, often reads on into the
// next line.
func (t *blockTable) touch(h uint64) uint32 {
	if t.w == nil {
		return 0
	}
	i := t.homeOfTag(tagOf(h))
	j := i + uint64(8/t.stride)
	if j >= t.slots {
		j -= t.slots
	}
	return uint32(t.w[int(i)*t.stride] + t.w[int(j)*t.stride])
}

// holds reports whether endpoint slot pod holds h, h's chain head
// (nilNode when h is absent) and how many endpoints hold h.
func (t *blockTable) holds(h uint64, pod int32, x *PrefixIndex) (held bool, head int32, holders int) {
	i := t.find(h, x)
	if i < 0 {
		return false, nilNode, 0
	}
	for k := range t.words() {
		holders += bits.OnesCount64(t.bits(i, k))
	}
	return t.bits(i, int(pod>>6))&(1<<(pod&63)) != 0, t.head(i), holders
}

// add records that pod holds h and that node is the new head of h's chain,
// adding the entry if needed.
func (t *blockTable) add(h uint64, node, pod int32, x *PrefixIndex) {
	if w := int(pod>>6) + 1; t.words() < w {
		t.resize(max(64, t.size()), w) // a new table, or a wider one
	}
	if (t.n+1)*4 > t.size()*3 {
		t.resize(t.size()*3/2, t.words())
	}
	tag := tagOf(h)
	for i := t.homeOfTag(tag); ; i = t.next(i) {
		s := t.w[int(i)*t.stride:]
		if s[0] == 0 {
			s[0] = uint64(tag)<<32 | uint64(node+1)
			s[1+pod>>6] = 1 << (pod & 63)
			t.n++
			return
		}
		if uint32(s[0]>>32) == tag && x.node(int32(uint32(s[0]))-1).hash == h {
			s[0] = uint64(tag)<<32 | uint64(node+1)
			s[1+pod>>6] |= 1 << (pod & 63)
			return
		}
	}
}

// removeAt records that pod no longer holds the block of slot i and that
// its chain now starts at head (nilNode: no holder is left, and the entry
// goes).
func (t *blockTable) removeAt(i int, pod, head int32, x *PrefixIndex) {
	if head == nilNode {
		t.del(uint64(i), x)
		return
	}
	s := t.w[i*t.stride:]
	s[0] = s[0]&^(1<<32-1) | uint64(head+1)
	s[1+pod>>6] &^= 1 << (pod & 63)
}

// del empties slot i, pulling later members of its probe run into the hole
// when their home slot is at or before it.
func (t *blockTable) del(i uint64, x *PrefixIndex) {
	for j := t.next(i); ; j = t.next(j) {
		s := t.w[int(j)*t.stride:]
		if s[0] == 0 {
			break
		}
		home := t.homeOfTag(uint32(s[0] >> 32))
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			copy(t.w[int(i)*t.stride:int(i+1)*t.stride], s[:t.stride])
			i = j
		}
	}
	clear(t.w[int(i)*t.stride : int(i+1)*t.stride])
	t.n--
	if t.size() > 64 && t.n*4 < t.size() {
		t.resize(max(64, t.size()*2/3), t.words())
	}
}

// resize moves the entries to a new slot array of size slots and words
// bitmap words.
func (t *blockTable) resize(size, words int) {
	old := *t
	t.w = make([]uint64, size*(1+words))
	t.stride = 1 + words
	t.slots = uint64(size)
	for i := range old.size() {
		s := old.w[i*old.stride : (i+1)*old.stride]
		if s[0] == 0 {
			continue
		}
		j := t.homeOfTag(uint32(s[0] >> 32))
		for t.w[int(j)*t.stride] != 0 {
			j = t.next(j)
		}
		copy(t.w[int(j)*t.stride:], s)
	}
}
