package regions

import (
	"bytes"
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DigestStore keeps the newest fresh Digest of every pool. It is the
// gossip channel for digests: its LocalState and Merge methods have the
// shape of tier2/gossip's Channel, so Tier-2 registers it directly, and its
// Publish hook sends each digest accepted locally (from the Tier-1 feed) to
// the other Tier-2 instances.
//
// It is safe for concurrent use; LocalState and Merge never block on
// anything but its own short lock.
type DigestStore struct {
	maxAge atomic.Int64 // ns; changed by Fleet.Update
	now    func() time.Time

	mu      sync.Mutex
	entries map[Key]*storeEntry

	// publish and onChange are set before use and never changed.
	publish  func(key string, payload []byte) error
	onChange func()

	rejected    atomic.Uint64
	implausible atomic.Uint64
	publishes   atomic.Uint64
	pubErrors   atomic.Uint64
}

type storeEntry struct {
	d        Digest
	encoded  []byte    // d's encoding, reused for gossip
	received time.Time // by this store's clock
}

// MaxClockSkew is how far a producer's clock may be from this store's and
// its digests still be heard. Freshness is judged by when a digest arrived
// here, not by its producer's timestamp, so skew below this bound changes
// nothing; a digest whose timestamp is further off than DigestMaxAge plus
// this bound is refused as coming from a broken clock (or a replay).
const MaxClockSkew = time.Minute

// NewDigestStore returns an empty store that uses a digest for maxAge
// (zero means 5 s) after it arrived, by the clock now (nil means
// time.Now). A digest relayed late is used for at most maxAge after it
// reached this store, and never once its producer's timestamp is more than
// maxAge + MaxClockSkew away from now.
func NewDigestStore(maxAge time.Duration, now func() time.Time) *DigestStore {
	if maxAge <= 0 {
		maxAge = 5 * time.Second
	}
	if now == nil {
		now = time.Now
	}
	s := &DigestStore{now: now, entries: make(map[Key]*storeEntry)}
	s.maxAge.Store(int64(maxAge))
	return s
}

// SetPublish installs the hook that spreads a digest accepted through Put
// to the other Tier-2 instances, typically
//
//	store.SetPublish(func(key string, p []byte) error {
//		return node.BroadcastLatest(gossip.ChannelRegions, key, p)
//	})
//
// key is unique per pool and payload a one-digest list that Merge accepts.
// The hook is called with no lock held, from Put's goroutine; it must not
// block. Call it before the first Put.
func (s *DigestStore) SetPublish(f func(key string, payload []byte) error) { s.publish = f }

// Put stores d if it is valid, fresh and newer than the digest held for
// its pool, and then publishes it. It reports whether d was stored; an
// invalid digest is an error, a stale or superseded one is not.
func (s *DigestStore) Put(d Digest) (bool, error) {
	if err := d.Validate(); err != nil {
		s.rejected.Add(1)
		return false, err
	}
	e := &storeEntry{d: d, encoded: d.appendBinary(nil)}
	if !s.accept(e) {
		return false, nil
	}
	s.changed()
	if s.publish != nil {
		s.publishes.Add(1)
		if err := s.publish(d.Key().String(), appendList(nil, [][]byte{e.encoded})); err != nil {
			s.pubErrors.Add(1) // push/pull still carries it
		}
	}
	return true, nil
}

// accept stores e if it supersedes what is held.
func (s *DigestStore) accept(e *storeEntry) bool {
	now := s.now()
	if !s.plausible(&e.d, now) {
		s.implausible.Add(1)
		return false
	}
	e.received = now
	k := e.d.Key()
	s.mu.Lock()
	old, ok := s.entries[k]
	// A held digest that has gone stale is replaced by any fresh one, so a
	// producer that restarted with a lower Version is heard again.
	if ok && s.fresh(old, now) && !e.d.newer(&old.d) {
		s.mu.Unlock()
		return false
	}
	// Digests share nothing mutable with callers.
	e.d.Adapters = append([]string(nil), e.d.Adapters...)
	e.d.HotAdapters = append([]string(nil), e.d.HotAdapters...)
	s.entries[k] = e
	s.mu.Unlock()
	return true
}

// changed tells the owner (a Fleet) that the fresh digests changed.
func (s *DigestStore) changed() {
	if s.onChange != nil {
		s.onChange()
	}
}

// fresh reports whether a held digest may be used at now: it arrived at
// most the age bound ago. The producer's clock plays no part, so instances
// whose clocks disagree by seconds still route on each other's digests.
func (s *DigestStore) fresh(e *storeEntry, now time.Time) bool {
	return now.Sub(e.received) <= time.Duration(s.maxAge.Load())
}

// plausible reports whether an arriving digest's timestamp is within the
// age bound plus MaxClockSkew of now, in either direction.
func (s *DigestStore) plausible(d *Digest, now time.Time) bool {
	age, bound := now.Sub(d.Produced), time.Duration(s.maxAge.Load())+MaxClockSkew
	return age <= bound && age >= -bound
}

// Get returns the fresh digest held for k.
func (s *DigestStore) Get(k Key) (Digest, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[k]
	if !ok || !s.fresh(e, s.now()) {
		return Digest{}, false
	}
	return e.d, true
}

// Digests returns every fresh digest, ordered by key.
func (s *DigestStore) Digests() []Digest {
	now := s.now()
	s.mu.Lock()
	out := make([]Digest, 0, len(s.entries))
	for _, e := range s.entries {
		if s.fresh(e, now) {
			out = append(out, e.d)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Digest) int { return compareKeys(&a, &b) })
	return out
}

// compareKeys orders digests by Region, cluster and pool.
func compareKeys(a, b *Digest) int {
	return cmp.Or(cmp.Compare(a.Region, b.Region), cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Pool, b.Pool))
}

// eachFresh calls f with every fresh digest and the time it goes stale,
// in no order, under the store's lock: f must not call back into the store
// or keep d.
func (s *DigestStore) eachFresh(f func(d *Digest, expires time.Time)) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.entries {
		if s.fresh(e, now) {
			f(&e.d, e.received.Add(time.Duration(s.maxAge.Load())))
		}
	}
}

// Len returns how many digests are held, stale ones included until Sweep.
func (s *DigestStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

// Sweep drops stale digests and returns how many. Selection already ignores
// them; Sweep frees their memory. Call it every DigestMaxAge or so.
func (s *DigestStore) Sweep() int {
	now := s.now()
	s.mu.Lock()
	n := 0
	for k, e := range s.entries {
		if !s.fresh(e, now) {
			delete(s.entries, k)
			n++
		}
	}
	s.mu.Unlock()
	if n > 0 {
		s.changed()
	}
	return n
}

// LocalState returns every fresh digest, encoded, for a gossip push/pull.
func (s *DigestStore) LocalState() []byte {
	now := s.now()
	s.mu.Lock()
	encoded := make([][]byte, 0, len(s.entries))
	for _, e := range s.entries {
		if s.fresh(e, now) {
			encoded = append(encoded, e.encoded)
		}
	}
	s.mu.Unlock()
	return appendList(nil, encoded)
}

// Merge applies digests from a peer (a broadcast or its full state); each
// is kept if it is newer than what is held. Invalid input is counted and
// dropped. Merged digests are not published again: the gossip layer
// relays broadcasts itself.
func (s *DigestStore) Merge(from string, payload []byte) {
	parts, err := splitList(payload)
	if err != nil {
		s.rejected.Add(1)
		return
	}
	changed := false
	for _, p := range parts {
		var d Digest
		if err := d.UnmarshalBinary(p); err != nil {
			s.rejected.Add(1)
			continue
		}
		if s.accept(&storeEntry{d: d, encoded: bytes.Clone(p)}) { // p aliases the whole state
			changed = true
		}
	}
	if changed {
		s.changed() // once per payload: a full state may hold hundreds
	}
}

// StoreStats counts what a DigestStore refused and sent.
type StoreStats struct {
	Rejected uint64 // invalid digests from Put or peers
	// Implausible counts digests refused because their producer's
	// timestamp is further from this store's clock than DigestMaxAge plus
	// MaxClockSkew (a broken clock, or a replay).
	Implausible   uint64
	Published     uint64
	PublishErrors uint64
}

// Stats returns the store's counters.
func (s *DigestStore) Stats() StoreStats {
	return StoreStats{s.rejected.Load(), s.implausible.Load(), s.publishes.Load(), s.pubErrors.Load()}
}
