package tier1

import (
	"sync"
)

// PrefixEvent says that an endpoint was sent (and so now caches) a prompt
// whose prefix blocks hash to Hashes, at Stamp (UnixNano on the sender's
// clock). Tier-1 replicas exchange these so that each knows what the
// others sent. Applying an event is idempotent, and a set of events leaves
// the same index whatever order it is applied in: see PrefixIndex.
type PrefixEvent struct {
	Endpoint string
	Stamp    int64
	Hashes   []uint64
}

// PrefixIndex remembers, per endpoint, which prompt prefix blocks it was
// sent recently, up to a capacity per endpoint that approximates its KV
// cache. It answers "how many leading blocks of this prompt does each
// endpoint have".
//
// Each (endpoint, block) entry carries a stamp, and an endpoint keeps the
// capacity entries with the greatest (stamp, hash). Re-adding an entry
// keeps the greater stamp. Because that state is a function of the set of
// events only, replicas that exchange events converge however the events
// were ordered or repeated. Within one event the block stamps fall (or, in
// GIE mode, rise) by a nanosecond per block, so that a full endpoint
// evicts a prompt's tail blocks (GIE: its head blocks) first, as vLLM
// (hashicorp/golang-lru in GIE) does.
//
// Memory: one 24-byte node and one 8-byte holder link per (endpoint,
// block) entry plus one 8-byte table slot (at 3/8 to 3/4 load) per distinct block; see
// BenchmarkPrefixIndexMemory for the measured bytes per entry.
type PrefixIndex struct {
	mu     sync.RWMutex
	byHash blockTable     // block hash → first node holding it
	chunks [][]prefixNode // node slab; node i is chunks[i>>chunkBits][i&chunkMask]
	links  [][]holderLink // each node's holder-chain link, same indexing
	used   int32          // nodes handed out from the slab
	free   int32          // free list through next; nilNode when empty
	pods   []podEntries   // by endpoint slot
}

const (
	chunkBits = 12
	chunkMask = 1<<chunkBits - 1
	nilNode   = -1
)

type prefixNode struct {
	hash  uint64
	stamp int64
	prev  int32 // newer neighbour in the endpoint's list
	next  int32 // older neighbour; free-list link for free nodes
}

// holderLink chains the nodes holding one hash. It lives apart from the
// node, densely packed, so that walking a hash's holders (every decision,
// every dispatch) touches 8 bytes a holder instead of a 32-byte node.
type holderLink struct {
	pod  int32 // endpoint slot
	same int32 // next node with the same hash (another endpoint)
}

// podEntries is one endpoint's entries, newest first.
type podEntries struct {
	head, tail int32
	n          int
	capacity   int
}

// NewPrefixIndex returns an empty index.
func NewPrefixIndex() *PrefixIndex {
	return &PrefixIndex{free: nilNode}
}

func (x *PrefixIndex) node(i int32) *prefixNode {
	return &x.chunks[i>>chunkBits][i&chunkMask]
}

func (x *PrefixIndex) link(i int32) *holderLink {
	return &x.links[i>>chunkBits][i&chunkMask]
}

func (x *PrefixIndex) alloc() int32 {
	if x.free != nilNode {
		i := x.free
		x.free = x.node(i).next
		return i
	}
	if int(x.used)>>chunkBits == len(x.chunks) {
		x.chunks = append(x.chunks, make([]prefixNode, 1<<chunkBits))
		x.links = append(x.links, make([]holderLink, 1<<chunkBits))
	}
	i := x.used
	x.used++
	return i
}

func (x *PrefixIndex) pod(slot int32) *podEntries {
	for int(slot) >= len(x.pods) {
		x.pods = append(x.pods, podEntries{head: nilNode, tail: nilNode})
	}
	return &x.pods[slot]
}

// newer reports whether node a sorts before (is kept longer than) an entry
// with the given stamp and hash.
func newer(a *prefixNode, stamp int64, hash uint64) bool {
	return a.stamp > stamp || (a.stamp == stamp && a.hash > hash)
}

// add records hashes for an endpoint slot at stamp, with room for capacity
// entries (capacity ≤ 0 keeps the current one). gie selects GIE's
// behaviour: later blocks of an event are newer, and an endpoint's
// capacity is fixed by its first add. It returns how many leading blocks
// the endpoint already held.
func (x *PrefixIndex) add(slot int32, capacity int, stamp int64, hashes []uint64, gie bool) (held int) {
	if len(hashes) == 0 {
		return 0
	}
	ascending := gie
	x.mu.Lock()
	defer x.mu.Unlock()
	p := x.pod(slot)
	if capacity > 0 && (p.capacity == 0 || !gie) {
		p.capacity = capacity
	}
	if p.capacity <= 0 {
		return 0
	}
	hint := int32(nilNode)
	near := [2]int32{nilNode, nilNode}
	leading := true
	for i, h := range hashes {
		s := stamp - int64(i)
		if ascending {
			s = stamp + int64(i)
		}
		var existed bool
		hint, existed, near = x.put(slot, p, h, s, hint, near)
		if leading = leading && existed; leading {
			held++
		}
	}
	for p.n > p.capacity {
		x.evict(p)
	}
	return held
}

// put inserts or refreshes one entry. It returns the node to use as the
// next insertion hint, whether the entry existed, and, when it did, the
// entry's neighbours before it moved. The blocks of one prompt sit next to
// each other in an endpoint's list (they were stamped together), so the
// next block of a prompt sent again is usually one of those neighbours:
// checking them first avoids walking the block's holder chain, which for a
// system prompt shared by every pod is as long as the pool.
func (x *PrefixIndex) put(slot int32, p *podEntries, h uint64, s int64, hint int32, near [2]int32) (int32, bool, [2]int32) {
	found := int32(nilNode)
	for _, c := range near {
		// A live node of this endpoint (nothing is freed during an add)
		// with this hash is the endpoint's entry for it.
		if c != nilNode && x.node(c).hash == h {
			found = c
			break
		}
	}
	head := int32(nilNode)
	if found == nilNode {
		head = x.byHash.get(h, x)
		for i := head; i != nilNode; i = x.link(i).same {
			if x.link(i).pod == slot {
				found = i
				break
			}
		}
	}
	if found != nilNode {
		n := x.node(found)
		was := [2]int32{n.prev, n.next}
		if s > n.stamp {
			x.unlink(p, found)
			n.stamp = s
			x.insert(p, found, hint)
		}
		return found, true, was
	}
	none := [2]int32{nilNode, nilNode}
	if p.n >= p.capacity && p.tail != nilNode && newer(x.node(p.tail), s, h) {
		return hint, false, none // older than everything kept: it would be evicted at once
	}
	i := x.alloc()
	*x.node(i) = prefixNode{hash: h, stamp: s}
	*x.link(i) = holderLink{pod: slot, same: head} // head is nilNode when the hash is new
	x.byHash.set(h, i, x)
	x.insert(p, i, hint)
	p.n++
	return i, false, none
}

// insert links node i into p's list in (stamp, hash) order, searching from
// hint (or the head).
func (x *PrefixIndex) insert(p *podEntries, i int32, hint int32) {
	n := x.node(i)
	at := hint
	if at == nilNode || at == i {
		at = p.head
	}
	// Find the first node not newer than n: walk toward the tail while the
	// cursor is newer, toward the head while its predecessor is not.
	if at != nilNode && newer(x.node(at), n.stamp, n.hash) {
		for at != nilNode && newer(x.node(at), n.stamp, n.hash) {
			at = x.node(at).next
		}
	} else {
		for at != nilNode {
			prev := x.node(at).prev
			if prev == nilNode || newer(x.node(prev), n.stamp, n.hash) {
				break
			}
			at = prev
		}
	}
	// Link n just before at (at == nilNode: at the tail).
	if at == nilNode {
		n.prev, n.next = p.tail, nilNode
		if p.tail != nilNode {
			x.node(p.tail).next = i
		} else {
			p.head = i
		}
		p.tail = i
		return
	}
	a := x.node(at)
	n.prev, n.next = a.prev, at
	if a.prev != nilNode {
		x.node(a.prev).next = i
	} else {
		p.head = i
	}
	a.prev = i
}

func (x *PrefixIndex) unlink(p *podEntries, i int32) {
	n := x.node(i)
	if n.prev != nilNode {
		x.node(n.prev).next = n.next
	} else {
		p.head = n.next
	}
	if n.next != nilNode {
		x.node(n.next).prev = n.prev
	} else {
		p.tail = n.prev
	}
	n.prev, n.next = nilNode, nilNode
}

// evict drops p's oldest entry.
func (x *PrefixIndex) evict(p *podEntries) {
	x.drop(p, p.tail)
}

// drop removes node i from its endpoint's list and its hash chain and frees
// it.
func (x *PrefixIndex) drop(p *podEntries, i int32) {
	x.unlink(p, i)
	p.n--
	n := x.node(i)
	l := x.link(i)
	head := x.byHash.get(n.hash, x)
	if head == i {
		if l.same == nilNode {
			x.byHash.del(n.hash, x)
		} else {
			x.byHash.set(n.hash, l.same, x)
		}
	} else {
		for j := head; j != nilNode; j = x.link(j).same {
			if m := x.link(j); m.same == i {
				m.same = l.same
				break
			}
		}
	}
	n.next = x.free
	x.free = i
}

// removePod forgets everything about an endpoint slot.
func (x *PrefixIndex) removePod(slot int32) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if int(slot) >= len(x.pods) {
		return
	}
	p := &x.pods[slot]
	for p.head != nilNode {
		x.drop(p, p.head)
	}
	*p = podEntries{head: nilNode, tail: nilNode}
}

// match counts, for every endpoint slot, the leading blocks of hashes it
// holds, into counts (indexed by slot, zeroed by the caller, long enough
// for every slot). With consecutive, a slot's count stops at its first
// missing block and the scan stops when no slot is still matching
// (Meridian). Without, the scan stops at the first block no endpoint
// holds and every holder of each earlier block counts it (GIE's
// matchLongestPrefix). It returns the number of blocks scanned that some
// endpoint held.
func (x *PrefixIndex) match(hashes []uint64, counts []int32, consecutive bool) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for b, h := range hashes {
		head := x.byHash.get(h, x)
		if head == nilNode {
			return b
		}
		any := false
		for i := head; i != nilNode; {
			l := &x.links[i>>chunkBits][i&chunkMask]
			if int(l.pod) < len(counts) && (!consecutive || counts[l.pod] == int32(b)) {
				counts[l.pod]++
				any = true
			}
			i = l.same
		}
		if !any {
			return b
		}
	}
	return len(hashes)
}

// matchOne is match for one slot.
func (x *PrefixIndex) matchOne(slot int32, hashes []uint64, consecutive bool) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	got := 0
	for _, h := range hashes {
		head := x.byHash.get(h, x)
		if head == nilNode {
			break
		}
		held := false
		for i := head; i != nilNode; i = x.link(i).same {
			if x.link(i).pod == slot {
				held = true
				break
			}
		}
		if held {
			got++
		} else if consecutive {
			break
		}
	}
	return got
}

// Len returns the number of (endpoint, block) entries held.
func (x *PrefixIndex) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := 0
	for i := range x.pods {
		n += x.pods[i].n
	}
	return n
}

// entries lists a slot's entries newest first, for tests.
func (x *PrefixIndex) entries(slot int32) []prefixNode {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if int(slot) >= len(x.pods) {
		return nil
	}
	var out []prefixNode
	for i := x.pods[slot].head; i != nilNode; i = x.node(i).next {
		out = append(out, *x.node(i))
	}
	return out
}
