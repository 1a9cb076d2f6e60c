package tier1

import "math/bits"

// blockTable maps a block hash to the first index node holding it. It is an
// open-addressing table with linear probing and backward-shift deletion,
// whose 8-byte slots hold the node (plus one, so that zeroed memory is
// empty) and a 32-bit tag of the hash, so most probes are settled without
// touching the node, and entries move without reading their nodes. Go's map costs about 38 bytes an entry for the same
// job (measured by BenchmarkPrefixIndexMemory); this one costs 8 / load,
// load kept between 3/8 and 3/4.
type blockTable struct {
	slots []tableSlot // length a power of two, or zero
	shift uint        // 32 − log2(len(slots))
	n     int
}

type tableSlot struct {
	node uint32 // node index + 1; 0 means empty
	tag  uint32 // tagOf(hash)
}

// tagOf is the 32 bits of h a slot keeps: the top half of h × φ
// (Fibonacci hashing). Block hashes are xxHash64 values and already
// uniform, but callers (tests, token-id schemes) may use structured ones;
// the multiplication spreads sequential keys over the table.
func tagOf(h uint64) uint32 {
	return uint32((h * 0x9e3779b97f4a7c15) >> 32)
}

// homeOfTag is a tag's first probe position: its top log2(len) bits, so
// that moving an entry (deletion, growth) never reads its node.
func (t *blockTable) homeOfTag(tag uint32) uint64 {
	return uint64(tag) >> t.shift
}

// get returns the node for hash h, or nilNode.
func (t *blockTable) get(h uint64, x *PrefixIndex) int32 {
	if len(t.slots) == 0 {
		return nilNode
	}
	mask := uint64(len(t.slots) - 1)
	tag := tagOf(h)
	for i := t.homeOfTag(tag); ; i = (i + 1) & mask {
		s := t.slots[i]
		if s.node == 0 {
			return nilNode
		}
		if s.tag == tag && x.node(int32(s.node-1)).hash == h {
			return int32(s.node - 1)
		}
	}
}

// touch loads h's home slot and returns a value of it, so that a caller
// can bring the slots of many hashes into the cache with independent
// loads before using them one by one.
func (t *blockTable) touch(h uint64) uint32 {
	if len(t.slots) == 0 {
		return 0
	}
	return t.slots[t.homeOfTag(tagOf(h))].tag
}

// set makes hash h map to node, adding the entry if needed.
func (t *blockTable) set(h uint64, node int32, x *PrefixIndex) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow(x)
	}
	mask := uint64(len(t.slots) - 1)
	tag := tagOf(h)
	for i := t.homeOfTag(tag); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.node == 0 {
			*s = tableSlot{node: uint32(node) + 1, tag: tag}
			t.n++
			return
		}
		if s.tag == tag && x.node(int32(s.node-1)).hash == h {
			s.node = uint32(node) + 1
			return
		}
	}
}

// del removes hash h, whose entry must exist and whose current node must
// still carry h.
func (t *blockTable) del(h uint64, x *PrefixIndex) {
	mask := uint64(len(t.slots) - 1)
	tag := tagOf(h)
	i := t.homeOfTag(tag)
	for {
		s := t.slots[i]
		if s.node == 0 {
			return
		}
		if s.tag == tag && x.node(int32(s.node-1)).hash == h {
			break
		}
		i = (i + 1) & mask
	}
	// Backward-shift: pull later members of the probe run into the hole
	// when their home slot is at or before it.
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := t.slots[j]
		if s.node == 0 {
			break
		}
		home := t.homeOfTag(s.tag)
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = tableSlot{}
	t.n--
	if len(t.slots) > 64 && t.n*8 < len(t.slots) {
		t.resize(len(t.slots)/2, x)
	}
}

func (t *blockTable) grow(x *PrefixIndex) {
	t.resize(max(64, 2*len(t.slots)), x)
}

func (t *blockTable) resize(size int, x *PrefixIndex) {
	old := t.slots
	t.slots = make([]tableSlot, size)
	t.shift = uint(32 - bits.TrailingZeros(uint(size)))
	mask := uint64(size - 1)
	for _, s := range old {
		if s.node == 0 {
			continue
		}
		i := t.homeOfTag(s.tag)
		for t.slots[i].node != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}
