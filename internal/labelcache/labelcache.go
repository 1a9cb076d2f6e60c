// Package labelcache remembers a Prometheus vector's children by their
// label values. WithLabelValues hashes and validates every value on every
// call; the request path asks for the same few children several times a
// request, and a map lookup on the values themselves costs a fraction of
// that.
package labelcache

import "sync"

// MaxChildren bounds what one Cache keeps: past it (label values beyond
// any configuration's) a child is looked up each time, as without a cache.
const MaxChildren = 1 << 14

// Cache maps label values K to a child M. Only cache children of a vector
// whose children are never deleted: a deleted child would go on counting
// unseen. The zero Cache is ready; it is safe for concurrent use.
type Cache[K comparable, M any] struct {
	mu sync.RWMutex
	m  map[K]M
}

// Get returns the child for k, calling lookup (WithLabelValues) only the
// first time.
func (c *Cache[K, M]) Get(k K, lookup func() M) M {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	v = lookup()
	c.mu.Lock()
	if c.m == nil {
		c.m = map[K]M{}
	}
	if len(c.m) < MaxChildren {
		c.m[k] = v
	}
	c.mu.Unlock()
	return v
}
