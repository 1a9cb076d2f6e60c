package sim

// prefixCache is vLLM's automatic prefix cache reduced to what routing
// observes: a map from chained block hash to cached KV blocks, where blocks
// that no running request references stay cached but are evictable in LRU
// order. Blocks count against the pod's KV capacity whether pinned or not;
// only pinned ones count as "in use" for kv_cache_usage_perc, as in vLLM,
// where cached-but-free blocks sit in the free queue.
type prefixCache struct {
	entries map[uint64]*cacheEntry
	// head is the least recently freed evictable entry, tail the most
	// recent; only entries with refs == 0 are linked.
	head, tail *cacheEntry
	blocks     int // KV blocks held by all entries
	evictable  int // KV blocks held by entries with refs == 0
}

type cacheEntry struct {
	hash       uint64
	blocks     int
	refs       int
	prev, next *cacheEntry
}

func newPrefixCache() *prefixCache {
	return &prefixCache{entries: make(map[uint64]*cacheEntry)}
}

// match returns how many leading hashes are cached.
func (c *prefixCache) match(hashes []uint64) int {
	for i, h := range hashes {
		if _, ok := c.entries[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// pin takes a reference on a cached hash, or returns nil if it is absent.
func (c *prefixCache) pin(h uint64) *cacheEntry {
	e, ok := c.entries[h]
	if !ok {
		return nil
	}
	if e.refs == 0 {
		c.unlink(e)
		c.evictable -= e.blocks
	}
	e.refs++
	return e
}

// insert caches a new hash of the given size with one reference. The
// caller has checked it is absent.
func (c *prefixCache) insert(h uint64, blocks int) *cacheEntry {
	e := &cacheEntry{hash: h, blocks: blocks, refs: 1}
	c.entries[h] = e
	c.blocks += blocks
	return e
}

// unpin drops a reference; an entry nobody references becomes the most
// recently used evictable one.
func (c *prefixCache) unpin(e *cacheEntry) {
	e.refs--
	if e.refs > 0 {
		return
	}
	c.evictable += e.blocks
	e.prev, e.next = c.tail, nil
	if c.tail != nil {
		c.tail.next = e
	} else {
		c.head = e
	}
	c.tail = e
}

// evict drops least recently used evictable entries until at least need
// blocks were freed or none are left, and returns the blocks freed.
func (c *prefixCache) evict(need int) int {
	freed := 0
	for freed < need && c.head != nil {
		e := c.head
		c.unlink(e)
		delete(c.entries, e.hash)
		c.blocks -= e.blocks
		c.evictable -= e.blocks
		freed += e.blocks
	}
	return freed
}

func (c *prefixCache) unlink(e *cacheEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		c.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = nil, nil
}
