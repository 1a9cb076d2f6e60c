package tier1

import (
	"math/bits"
	"sync"
	"sync/atomic"
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
// Each distinct block has one table slot holding a bitmap of the
// endpoints that hold it, so a match reads one slot a block whatever the
// number of holders; the endpoints' nodes of a block are also chained
// (holder links), which a dispatch and an eviction follow to find a node.
//
// Concurrency: no lock covers the whole index. The block tables and the
// holder links are split by hash into stripes, each with its own lock;
// an endpoint's list of entries and its nodes have its own lock. A match
// takes each stripe's read lock once; an add takes its endpoint's lock,
// and each stripe's lock once for the event's blocks that fall in it, so
// adds to different endpoints and matches run in parallel.
//
// Memory: one 24-byte node and one 8-byte holder link per (endpoint,
// block) entry, in chunks of 2048 owned by the endpoint (small enough
// that an anchored endpoint's last chunk, mostly empty, costs little),
// plus one table slot per distinct block, 8 bytes and 8 more per 64
// endpoint slots of the pool (16 up to 64 pods), at 1/2 to 3/4 load; see
// BenchmarkPrefixIndexMemory for the measured bytes per entry.
//
// Meridian mode uses the index anchored (addAnchored, matchAnchored): an
// entry every anchorEvery blocks of a prompt, charged that many blocks.
// GIE mode uses it exact (add, match): an entry a block.
type PrefixIndex struct {
	stripes [numStripes]stripe
	podsMu  sync.Mutex                    // serialises growing pods
	pods    atomic.Pointer[[]*podEntries] // by endpoint slot
	// chunks holds every node, by ref >> chunkBits. Each chunk belongs to
	// one endpoint, so that an endpoint's nodes, made in the order of its
	// prompts' blocks, lie together in memory: the entries it evicts (its
	// list's tail, one old prompt's blocks) are read as a run of memory,
	// not a cache miss each. It is a fixed array, never a growing slice:
	// nodes are read under an endpoint's or a stripe's lock, while another
	// endpoint may be adding a chunk.
	chunksMu sync.Mutex // serialises adding chunks
	nchunks  int32
	chunks   [maxChunks]*nodeChunk
}

// A node is named by a ref: its chunk, shifted left by chunkBits, or'ed
// with its index in the chunk.
const (
	stripeBits = 8
	numStripes = 1 << stripeBits
	stripeMask = numStripes - 1
	chunkBits  = 11
	chunkMask  = 1<<chunkBits - 1
	// maxChunks bounds the nodes: 2^26 entries in all (64 pods of 1M
	// blocks, or of 16M in anchored mode). Past it, new entries are not
	// recorded.
	maxChunks = 1 << 15
	nilNode   = -1
	// unresolvedNode marks, during an add, a block the endpoint holds
	// whose node is not found yet.
	unresolvedNode = -2
	// shortChain is the most holders a block may have for an add to walk
	// its chain to the endpoint's node; past it the add looks next to the
	// endpoint's neighbouring blocks first.
	shortChain = 4
)

// stripe is the part of the index for the hashes that map to it: their
// table slots and the holder links of their nodes.
type stripe struct {
	mu    sync.RWMutex
	table blockTable // block hash → its holders
	_     [64]byte
}

type nodeChunk struct {
	nodes [1 << chunkBits]prefixNode
	links [1 << chunkBits]holderLink
}

type prefixNode struct {
	hash  uint64
	stamp int64
	prev  int32 // newer neighbour in the endpoint's list
	next  int32 // older neighbour; free-list link for free nodes
}

// holderLink chains the nodes holding one hash, under the hash's stripe's
// lock. It lives apart from the node, densely packed, so that walking a
// hash's holders touches 8 bytes a holder instead of a 24-byte node.
//
// It also keeps the entry's weight: how many prompt blocks the entry stands
// for (1 for an exact entry; up to anchorEvery for an anchor, see
// addAnchored), which is what it is charged against its endpoint's
// capacity. The weight lives here rather than in the node so that a node
// stays 24 bytes.
type holderLink struct {
	podw uint32 // endpoint slot in the low 24 bits, weight − 1 in the top 8
	same int32  // next node with the same hash (another endpoint)
}

const (
	podBits = 24
	podMask = 1<<podBits - 1
	// maxWeight is the largest weight a link can keep.
	maxWeight = 1 << (32 - podBits)
)

func newLink(pod int32, weight int, same int32) holderLink {
	return holderLink{podw: uint32(pod) | uint32(weight-1)<<podBits, same: same}
}

// pod is the endpoint slot holding the entry.
func (l *holderLink) pod() int32 { return int32(l.podw & podMask) }

// weight is how many blocks the entry is charged.
func (l *holderLink) weight() int { return int(l.podw>>podBits) + 1 }

// podEntries is one endpoint's entries, newest first. Its list and
// counts, its nodes' fields but the links, and its slab change only under
// mu.
type podEntries struct {
	mu         sync.Mutex
	head, tail int32
	n          int // blocks held: the entries' weights
	entries    int
	capacity   int // in blocks
	// The endpoint's slab: its chunks, the nodes handed out from them,
	// and its free nodes (a list through next; nilNode when empty).
	chunks []int32
	used   int32
	free   int32
	// Scratch for add, under mu.
	found   []int32  // per block of the event: its node, or nilNode
	fresh   []bool   // per block: the node was made by this add
	byRank  []int32  // block (or evicted node) positions grouped by stripe
	gone    []int32  // nodes to free
	anchors []uint64 // addAnchored's entries
	sink    uint32   // keeps the prefetching loads
}

// NewPrefixIndex returns an empty index.
func NewPrefixIndex() *PrefixIndex {
	x := &PrefixIndex{}
	x.pods.Store(new([]*podEntries))
	return x
}

// stripeOf is the stripe of a block hash: bits of h × φ that the block
// table's tag (the top 32) does not use.
func stripeOf(h uint64) int32 {
	return int32((h*0x9e3779b97f4a7c15)>>(32-stripeBits)) & stripeMask
}

func (x *PrefixIndex) node(i int32) *prefixNode {
	return &x.chunks[i>>chunkBits].nodes[i&chunkMask]
}

func (x *PrefixIndex) link(i int32) *holderLink {
	return &x.chunks[i>>chunkBits].links[i&chunkMask]
}

// alloc takes a node from p's slab (p.mu held), or returns nilNode when
// the index has no room left. Freed nodes are reused last freed first: an
// eviction frees an old prompt's blocks from its tail, so the next prompt's
// blocks take them from its head, in memory order again.
func (x *PrefixIndex) alloc(p *podEntries) int32 {
	if p.free != nilNode {
		i := p.free
		p.free = x.node(i).next
		return i
	}
	c := int(p.used) >> chunkBits
	if c == len(p.chunks) {
		x.chunksMu.Lock()
		if x.nchunks == maxChunks {
			x.chunksMu.Unlock()
			return nilNode
		}
		id := x.nchunks
		x.chunks[id] = new(nodeChunk)
		x.nchunks++
		x.chunksMu.Unlock()
		p.chunks = append(p.chunks, id)
	}
	i := p.chunks[c]<<chunkBits | p.used&chunkMask
	p.used++
	return i
}

// pod returns an endpoint slot's entries, adding the slot if needed.
func (x *PrefixIndex) pod(slot int32) *podEntries {
	if pods := *x.pods.Load(); int(slot) < len(pods) {
		return pods[slot]
	}
	x.podsMu.Lock()
	defer x.podsMu.Unlock()
	pods := *x.pods.Load()
	if int(slot) < len(pods) {
		return pods[slot]
	}
	grown := make([]*podEntries, slot+1)
	copy(grown, pods)
	for i := len(pods); i < len(grown); i++ {
		grown[i] = &podEntries{head: nilNode, tail: nilNode, free: nilNode}
	}
	x.pods.Store(&grown)
	return grown[slot]
}

// podIfAny returns an endpoint slot's entries, or nil.
func (x *PrefixIndex) podIfAny(slot int32) *podEntries {
	if pods := *x.pods.Load(); int(slot) < len(pods) {
		return pods[slot]
	}
	return nil
}

// newer reports whether node a sorts before (is kept longer than) an entry
// with the given stamp and hash.
func newer(a *prefixNode, stamp int64, hash uint64) bool {
	return a.stamp > stamp || (a.stamp == stamp && a.hash > hash)
}

// add records hashes for an endpoint slot at stamp, one entry a block (the
// exact index, which GIE mode keeps), with room for capacity entries
// (capacity ≤ 0 keeps the current one). gie selects GIE's behaviour: later
// blocks of an event are newer, and an endpoint's capacity is fixed by its
// first add. It returns how many leading blocks the endpoint already held.
func (x *PrefixIndex) add(slot int32, capacity int, stamp int64, hashes []uint64, gie bool) (held int) {
	if len(hashes) == 0 || slot > podMask {
		return 0
	}
	p := x.pod(slot)
	p.mu.Lock()
	defer p.mu.Unlock()
	return x.addLocked(p, slot, capacity, stamp, hashes, 1, 1, gie)
}

// anchorEvery is k of the anchored index (Meridian mode): an endpoint's
// entries are the hashes of every k-th block of the prompts it was sent,
// plus each prompt's last block. See addAnchored.
const anchorEvery = 16

// anchorsOf appends to dst the anchors of a prompt of len(hashes) blocks:
// the hashes of blocks k−1, 2k−1, … and of the last block.
func anchorsOf(dst, hashes []uint64, k int) []uint64 {
	for i := k - 1; i < len(hashes); i += k {
		dst = append(dst, hashes[i])
	}
	if n := len(hashes); n%k != 0 {
		dst = append(dst, hashes[n-1])
	}
	return dst
}

// addAnchored is add for the anchored index of Meridian mode: it records
// only the prompt's anchors (anchorsOf with k = anchorEvery), each charged
// the blocks it stands for (k, and the last one the blocks after the last
// whole run of k), so that capacity stays a number of blocks while the
// index holds a k-th of the entries, with a k-th of the cache misses a
// dispatch and a match cost.
//
// That loses nothing about which prefixes an endpoint was sent: a block's
// hash covers the whole prefix up to it (request.BlockHashes), so holding
// block i's hash means having been sent blocks 0..i. It loses only where,
// between two anchors, two prompts diverge: a match reports the last
// anchor both share, plus what matchAnchored's second look finds. Within
// an event the stamps fall by a nanosecond per anchor, so an anchor is
// always newer than every later anchor of any prompt holding both (each
// event holding the later one holds the earlier one, with a greater
// stamp); eviction, oldest first, therefore keeps each endpoint's anchors
// closed under prefixes, as vLLM's tail-first eviction keeps its blocks.
//
// It returns how many leading blocks of hashes the endpoint already held:
// up to its last held leading anchor, then the last block before the next
// anchor that it holds as some earlier prompt's last block (a
// conversation's previous turn), if any.
func (x *PrefixIndex) addAnchored(slot int32, capacity int, stamp int64, hashes []uint64) (held int) {
	const k = anchorEvery
	n := len(hashes)
	if n == 0 || slot > podMask {
		return 0
	}
	p := x.pod(slot)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.anchors = anchorsOf(p.anchors[:0], hashes, k)
	last := n - (len(p.anchors)-1)*k // the last anchor's weight
	a := x.addLocked(p, slot, capacity, stamp, p.anchors, k, last, false)
	if a == len(p.anchors) {
		return n
	}
	// Blocks a·k .. up to the next anchor (not held): the last one the
	// endpoint holds, as a prompt's last block.
	for i := min((a+1)*k-1, n-1) - 1; i >= a*k; i-- {
		h := hashes[i]
		st := &x.stripes[stripeOf(h)]
		st.mu.RLock()
		ok, _, _ := st.table.holds(h, slot, x)
		st.mu.RUnlock()
		if ok {
			return i + 1
		}
	}
	return a * k
}

// addLocked is add with p (slot's entries) locked, for entries each
// charged step blocks but the last, charged last blocks. It returns how
// many leading entries the endpoint already held.
//
// It works in passes so that each stripe's lock is taken once: find the
// endpoint's node of every block it holds and make nodes for the others,
// stripe by stripe; restamp and link the entries into the endpoint's list
// in block order; unlink the oldest entries beyond capacity; free them,
// stripe by stripe.
func (x *PrefixIndex) addLocked(p *podEntries, slot int32, capacity int, stamp int64, hashes []uint64, step, last int, gie bool) (held int) {
	if capacity > 0 && (p.capacity == 0 || !gie) {
		p.capacity = capacity
	}
	if p.capacity <= 0 || len(hashes) == 0 {
		return 0
	}
	weightOf := func(i int) int {
		if i == len(hashes)-1 {
			return last
		}
		return step
	}
	stampOf := func(i int) int64 {
		if gie {
			return stamp + int64(i)
		}
		return stamp - int64(i)
	}
	n := len(hashes)
	p.found, p.fresh = grow(p.found, n), grow(p.fresh, n)
	clear(p.fresh)

	// Pass 1: each block's slot, one stripe at a time: its bitmap says
	// whether the endpoint holds it. The endpoint's node is then on the
	// block's holder chain, found there when the chain is short; a block
	// held by many endpoints (a shared system prompt) is left to pass 1b.
	// A block not held gets a new node, unless it is older than
	// everything a full endpoint keeps: it would be evicted at once (every
	// entry kept now stays at least as new). Each step first loads what
	// every block of the run needs next, so that the cache misses of a
	// run's blocks overlap instead of coming one a block.
	full := p.n >= p.capacity && p.tail != nilNode
	var tail prefixNode
	if full {
		tail = *x.node(p.tail)
	}
	p.byRank = groupByStripe(p.byRank, n, func(i int) (int32, bool) {
		return stripeOf(hashes[i]), true
	})
	unresolved := 0
	for run := range stripeRuns(p.byRank) {
		st := &x.stripes[stripeOf(hashes[run[0]])]
		st.mu.Lock()
		for _, i := range run {
			p.sink += st.table.touch(hashes[i])
		}
		for _, i := range run {
			if _, head, _ := st.table.holds(hashes[i], slot, x); head != nilNode {
				p.sink += x.link(head).podw
			}
		}
		for _, i := range run {
			// Again, now that the slots are in the cache: an earlier block
			// of this event may have added the same hash.
			h, s := hashes[i], stampOf(int(i))
			held, head, holders := st.table.holds(h, slot, x)
			p.found[i] = nilNode
			if held && holders > shortChain {
				p.found[i] = unresolvedNode
				unresolved++
				continue
			}
			if held {
				j := head
				for x.link(j).pod() != slot { // the bitmap says it is there
					j = x.link(j).same
				}
				p.found[i] = j
				continue
			}
			if full && newer(&tail, s, h) {
				continue
			}
			j := x.alloc(p)
			if j == nilNode {
				continue
			}
			*x.node(j) = prefixNode{hash: h, stamp: s, prev: nilNode, next: nilNode}
			*x.link(j) = newLink(slot, weightOf(int(i)), head) // head is nilNode when the hash is new
			st.table.add(h, j, slot, x)
			p.found[i], p.fresh[i] = j, true
		}
		st.mu.Unlock()
	}

	// Pass 1b: the blocks of long chains, from their neighbours in the
	// endpoint's own list: the blocks of one prompt were stamped together,
	// so a prompt sent again finds them next to each other. The first of a
	// run walks its chain.
	if unresolved > 0 {
		for i := range n {
			if p.found[i] != unresolvedNode {
				continue
			}
			if i > 0 && p.found[i-1] >= 0 && !p.fresh[i-1] {
				p.found[i] = x.besides(p.found[i-1], hashes[i])
			}
			if p.found[i] == unresolvedNode {
				p.found[i] = x.holder(slot, hashes[i])
			}
		}
	}
	// The nodes pass 2 restamps, loaded together.
	for i, j := range p.found[:n] {
		if j != nilNode && !p.fresh[i] {
			p.sink += uint32(x.node(j).stamp)
		}
	}

	// Pass 2: stamps and list order, in block order.
	hint := int32(nilNode)
	leading := true
	for i := range hashes {
		j := p.found[i]
		if j == nilNode {
			leading = false
			continue
		}
		existed := !p.fresh[i]
		if leading = leading && existed; leading {
			held++
		}
		nd := x.node(j)
		switch s := stampOf(i); {
		case !existed:
			x.insert(p, j, hint)
			p.n += x.link(j).weight()
			p.entries++
		case s > nd.stamp:
			x.unlink(p, j)
			nd.stamp = s
			x.insert(p, j, hint)
		}
		hint = j
	}

	// Passes 3 and 4: evict beyond capacity.
	p.gone = p.gone[:0]
	for p.n > p.capacity {
		i := p.tail
		x.unlink(p, i)
		p.n -= x.link(i).weight()
		p.entries--
		p.gone = append(p.gone, i)
	}
	x.free(p, p.gone)
	return held
}

// besides returns the neighbour of node i in its endpoint's list whose hash
// is h, or unresolvedNode.
func (x *PrefixIndex) besides(i int32, h uint64) int32 {
	nd := x.node(i)
	for _, c := range [2]int32{nd.prev, nd.next} {
		if c != nilNode && x.node(c).hash == h {
			return c
		}
	}
	return unresolvedNode
}

// holder returns slot's node for hash h, or nilNode.
func (x *PrefixIndex) holder(slot int32, h uint64) int32 {
	st := &x.stripes[stripeOf(h)]
	st.mu.RLock()
	defer st.mu.RUnlock()
	held, head, _ := st.table.holds(h, slot, x)
	if !held {
		return nilNode
	}
	for j := head; j != nilNode; j = x.link(j).same {
		if x.link(j).pod() == slot {
			return j
		}
	}
	return nilNode
}

// free removes p's nodes, already unlinked from its list, from their hash
// chains and frees them, one stripe at a time. It reuses p.byRank.
func (x *PrefixIndex) free(p *podEntries, nodes []int32) {
	if len(nodes) == 0 {
		return
	}
	p.byRank = groupByStripe(p.byRank, len(nodes), func(k int) (int32, bool) {
		return stripeOf(x.node(nodes[k]).hash), true
	})
	for run := range stripeRuns(p.byRank) {
		st := &x.stripes[stripeOf(x.node(nodes[run[0]]).hash)]
		st.mu.Lock()
		for _, k := range run { // as in add: overlap the misses
			p.sink += st.table.touch(x.node(nodes[k]).hash) + uint32(x.link(nodes[k]).same)
		}
		for _, k := range run {
			x.drop(p, st, nodes[k])
		}
		st.mu.Unlock()
	}
}

// groupByStripe fills dst with the positions 0..n-1 that keep reports,
// grouped by stripe (the stripes in the order first seen), each run of
// one stripe ended by -1. Only the stripes seen are visited: a prompt
// touches a few of them.
func groupByStripe(dst []int32, n int, of func(i int) (st int32, keep bool)) []int32 {
	var count [numStripes]int32
	var seen [numStripes]uint8
	nseen := 0
	kept := 0
	for i := range n {
		if st, keep := of(i); keep {
			if count[st] == 0 {
				seen[nseen] = uint8(st)
				nseen++
			}
			count[st]++
			kept++
		}
	}
	dst = grow(dst, kept+nseen)
	// count becomes each seen stripe's next position, leaving a slot for
	// its run's end marker.
	next := int32(0)
	for _, st := range seen[:nseen] {
		c := count[st]
		count[st] = next
		next += c
		dst[next] = -1
		next++
	}
	for i := range n {
		if st, keep := of(i); keep {
			dst[count[st]] = int32(i)
			count[st]++
		}
	}
	return dst
}

// stripeRuns splits groupByStripe's output into its runs.
func stripeRuns(grouped []int32) func(yield func([]int32) bool) {
	return func(yield func([]int32) bool) {
		start := 0
		for i, v := range grouped {
			if v == -1 {
				if !yield(grouped[start:i]) {
					return
				}
				start = i + 1
			}
		}
	}
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

// drop removes p's node i, unlinked from p's list, from its hash chain
// and its block's bitmap, and frees it. st is its stripe, locked by the
// caller.
func (x *PrefixIndex) drop(p *podEntries, st *stripe, i int32) {
	n := x.node(i)
	l := x.link(i)
	if k := st.table.find(n.hash, x); k >= 0 { // always, while the index is consistent
		head := st.table.head(k)
		if head == i {
			head = l.same
		} else {
			for j := head; j != nilNode; j = x.link(j).same {
				if m := x.link(j); m.same == i {
					m.same = l.same
					break
				}
			}
		}
		st.table.removeAt(k, l.pod(), head, x)
	}
	n.next = p.free
	p.free = i
}

// Reset forgets every endpoint's entries, for a pool whose hashes change
// meaning (another scoring mode or block size). Endpoints keep their
// slots; each one's capacity is set again by its next add.
func (x *PrefixIndex) Reset() {
	for slot := range *x.pods.Load() {
		x.removePod(int32(slot))
	}
}

// removePod forgets everything about an endpoint slot.
func (x *PrefixIndex) removePod(slot int32) {
	p := x.podIfAny(slot)
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gone = p.gone[:0]
	for i := p.head; i != nilNode; i = x.node(i).next {
		p.gone = append(p.gone, i)
	}
	x.free(p, p.gone)
	p.head, p.tail, p.n, p.entries, p.capacity = nilNode, nilNode, 0, 0, 0
}

// matchScratch is a match's working memory, reused across matches by one
// caller at a time.
type matchScratch struct {
	anchors []uint64 // matchAnchored's anchors
	byRank  []int32  // block positions grouped by stripe
	held    []uint64 // per block, its bitmap's words
	sink    uint32   // keeps the prefetching loads
}

// allSlots appends to live (grown past its capacity only when nw words
// do not fit) one bitmap word per 64 slots, with a bit set for every slot
// below slots: the slots a match starts with.
func allSlots(live []uint64, nw, slots int) []uint64 {
	if nw > cap(live) {
		live = make([]uint64, 0, nw)
	}
	for w := range nw {
		m := ^uint64(0)
		if rest := slots - 64*w; rest < 64 {
			m = 1<<rest - 1
		}
		live = append(live, m)
	}
	return live
}

// match counts, for every endpoint slot, the leading blocks of hashes it
// holds, into counts (indexed by slot, zeroed by the caller, long enough
// for every slot). With consecutive, a slot's count stops at its first
// missing block and the scan stops when no slot is still matching
// (Meridian). Without, the scan stops at the first block no endpoint
// holds and every holder of each earlier block counts it (GIE's
// matchLongestPrefix). It returns the number of blocks scanned that some
// endpoint held.
//
// It reads every block's bitmap first, one stripe at a time (one read
// lock a stripe, not a block, so that decisions on other cores, whose
// dispatches write the stripes, do not trade the locks' cache lines 256
// times a decision), with the slots' loads overlapping; then it counts in
// block order. The blocks past the end of the match are read too: the
// dispatch that follows needs the same slots.
func (x *PrefixIndex) match(hashes []uint64, counts []int32, consecutive bool, sc *matchScratch) int {
	nw := (len(counts) + 63) / 64
	n := len(hashes)
	if nw == 0 || n == 0 {
		return 0
	}
	x.loadBitmaps(hashes, nw, sc)
	var buf [8]uint64
	live := allSlots(buf[:0], nw, len(counts))
	for b := range n {
		any := false
		for w := range live {
			held := sc.held[b*nw+w]
			if consecutive {
				now := live[w] & held
				for gone := live[w] &^ now; gone != 0; gone &= gone - 1 {
					counts[64*w+bits.TrailingZeros64(gone)] = int32(b)
				}
				live[w] = now
				any = any || now != 0
				continue
			}
			held &= live[w]
			any = any || held != 0
			for ; held != 0; held &= held - 1 {
				counts[64*w+bits.TrailingZeros64(held)]++
			}
		}
		if !any {
			return b
		}
	}
	if consecutive {
		for w, m := range live {
			for ; m != 0; m &= m - 1 {
				counts[64*w+bits.TrailingZeros64(m)] = int32(n)
			}
		}
	}
	return n
}

// loadBitmaps fills sc.held with the first nw words of each hash's bitmap
// (0 for a hash no endpoint holds), one stripe at a time.
func (x *PrefixIndex) loadBitmaps(hashes []uint64, nw int, sc *matchScratch) {
	sc.held = grow(sc.held, len(hashes)*nw)
	sc.byRank = groupByStripe(sc.byRank, len(hashes), func(i int) (int32, bool) {
		return stripeOf(hashes[i]), true
	})
	for run := range stripeRuns(sc.byRank) {
		st := &x.stripes[stripeOf(hashes[run[0]])]
		st.mu.RLock()
		for _, i := range run {
			sc.sink += st.table.touch(hashes[i])
		}
		for _, i := range run {
			k := st.table.findTag(hashes[i])
			for w := range nw {
				v := uint64(0)
				if k >= 0 {
					v = st.table.bits(k, w)
				}
				sc.held[int(i)*nw+w] = v
			}
		}
		st.mu.RUnlock()
	}
}

// matchAnchored is match (consecutive) for the anchored index that
// addAnchored keeps: it counts, for every endpoint slot, the leading
// blocks of hashes it was sent, into counts (zeroed by the caller). It
// reads the bitmaps of the prompt's anchors (blocks k−1, 2k−1, …, k =
// anchorEvery), and a slot's count is k times the leading anchors it
// holds. Then, for the slots that hold the most, it reads the blocks
// between their last anchor and the next, the last held of which (an
// earlier prompt's last block, say a conversation's previous turn) sets
// their count. Other slots' counts may fall short of the truth by up to
// k−1 blocks. It returns the largest count.
//
// Because an endpoint's anchors stay closed under prefixes (see
// addAnchored), counting its leading anchors is the same as finding its
// last one.
func (x *PrefixIndex) matchAnchored(hashes []uint64, counts []int32, sc *matchScratch) int {
	const k = anchorEvery
	nw := (len(counts) + 63) / 64
	n := len(hashes)
	if nw == 0 || n == 0 {
		return 0
	}
	sc.anchors = sc.anchors[:0]
	for i := k - 1; i < n; i += k {
		sc.anchors = append(sc.anchors, hashes[i])
	}
	na := len(sc.anchors)
	x.loadBitmaps(sc.anchors, nw, sc)
	var buf [8]uint64
	live := allSlots(buf[:0], nw, len(counts))
	// a: the leading anchors the best slots hold; live: those slots.
	a := 0
	for ; a < na; a++ {
		any := false
		for w := range live {
			now := live[w] & sc.held[a*nw+w]
			any = any || now != 0
		}
		if !any {
			break
		}
		for w := range live {
			now := live[w] & sc.held[a*nw+w]
			for gone := live[w] &^ now; gone != 0; gone &= gone - 1 {
				counts[64*w+bits.TrailingZeros64(gone)] = int32(a * k)
			}
			live[w] = now
		}
	}
	// The best slots hold blocks 0..a·k−1; look between there and the next
	// anchor (or the prompt's end) for a last block that they hold.
	best := a * k
	lo, hi := a*k, min((a+1)*k-1, n) // blocks lo..hi−1
	x.loadBitmaps(hashes[lo:hi], nw, sc)
	for w := range live {
		m := live[w]
		for ; m != 0; m &= m - 1 {
			slot := 64*w + bits.TrailingZeros64(m)
			c := a * k
			for i := hi - 1; i >= lo; i-- {
				if sc.held[(i-lo)*nw+w]&(1<<(slot&63)) != 0 {
					c = i + 1
					break
				}
			}
			counts[slot] = int32(c)
			best = max(best, c)
		}
	}
	return best
}

// matchOne is match for one slot.
func (x *PrefixIndex) matchOne(slot int32, hashes []uint64, consecutive bool) int {
	got := 0
	for _, h := range hashes {
		st := &x.stripes[stripeOf(h)]
		st.mu.RLock()
		held, _, _ := st.table.holds(h, slot, x)
		st.mu.RUnlock()
		if held {
			got++
		} else if consecutive {
			break
		}
	}
	return got
}

// Len returns the number of (endpoint, block) entries held; an anchor is
// one entry.
func (x *PrefixIndex) Len() int {
	n := 0
	for _, p := range *x.pods.Load() {
		p.mu.Lock()
		n += p.entries
		p.mu.Unlock()
	}
	return n
}

// Blocks returns, per endpoint slot, the blocks its entries stand for (what
// is charged against its capacity: an anchor stands for up to anchorEvery
// blocks) and its capacity in blocks.
func (x *PrefixIndex) Blocks() (held, capacity []int) {
	for _, p := range *x.pods.Load() {
		p.mu.Lock()
		held, capacity = append(held, p.n), append(capacity, p.capacity)
		p.mu.Unlock()
	}
	return held, capacity
}

// entries lists a slot's entries newest first, for tests.
func (x *PrefixIndex) entries(slot int32) []prefixNode {
	p := x.podIfAny(slot)
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []prefixNode
	for i := p.head; i != nilNode; i = x.node(i).next {
		out = append(out, *x.node(i))
	}
	return out
}
