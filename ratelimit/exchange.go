package ratelimit

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The exchange. Every SyncInterval each instance folds the units it would
// admit against each limit (were it alone with the whole limit) into a
// demand estimate (units per second), sets its share of each limit to its
// demand over the sum of every live instance's demand (each counted at
// least MinShare of the limit), and gossips the estimates, the shares it
// took, its buckets' levels and how many units it has released. Local
// buckets refill at share × rate and hold share × burst. When all
// instances see the same estimates the shares sum to exactly 1. A peer
// that falls silent keeps the share it last reported.
//
// The burst moves with the shares: an instance whose slice shrinks below
// its level releases the excess (a cumulative counter in its report), and
// every other instance takes up its part of the increase, in proportion to
// its share (a full bucket drops its part). An instance that uses less than
// its refill while a peer has run dry releases its surplus the same way. Released units are never spent by the
// releaser, so they are spent at most once as long as the receivers agree
// on the shares; a report that is lost only delays them.
//
// The Limiter speaks the shape of a gossip channel: LocalState for
// push/pull (every entry this instance knows, so state spreads through any
// peer), Merge for whatever a peer sent, and Run to broadcast this
// instance's own entry each interval. It imports no transport.

// peer is what this instance knows of another.
type peer struct {
	seq     uint64    // newest report seen
	heard   time.Time // when the origin produced it, on our clock
	leaving bool
	limits  map[uint64]report // limit hash → the peer's demand and share
	// taken is, per limit, the peer's released counter as of the last
	// time this instance took up its part of it.
	taken map[uint64]float64
}

// report is one instance's state for one limit.
type report struct {
	demand   float64 // units per second, smoothed
	share    float64 // the fraction of the limit the instance holds
	level    float64 // units in its bucket at the sync; negative is debt
	released float64 // units released to the pool over the limit's life
	recent   float64 // of which released over the origin's last releaseWindow syncs
	seq      uint64  // the origin's sync that produced it
}

// entry is one origin's report on the wire. An instance's report may be
// split into parts so that each fits one gossip packet: part k of n
// carries the limits whose hash is k modulo n and is authoritative for
// them (a limit of that class missing from it has no demand any more).
// Entries relayed in LocalState have n = 0: they update, never delete.
type entry struct {
	origin      string
	seq         uint64
	age         time.Duration // how long ago the sender heard it; 0 from the origin
	leaving     bool
	part, parts uint64
	limits      map[uint64]report
}

const (
	wireVersion = 3
	reportSize  = 32 // hash u64, demand f32, share f32, level f32, released f64, recent f32
)

var errPayload = errors.New("ratelimit: malformed exchange payload")

// appendEntry encodes one entry:
//
//	origin (uvarint length, bytes) · seq (uvarint) · age in ms (uvarint) ·
//	flags (byte; 1 = leaving) · part (uvarint) · parts (uvarint) ·
//	count (uvarint) · count × (hash u64le, demand f32le, share f32le,
//	level f32le, released f64le, released at this sync f32le)
func appendEntry(b []byte, e *entry) []byte {
	b = binary.AppendUvarint(b, uint64(len(e.origin)))
	b = append(b, e.origin...)
	b = binary.AppendUvarint(b, e.seq)
	b = binary.AppendUvarint(b, uint64(e.age/time.Millisecond))
	var flags byte
	if e.leaving {
		flags = 1
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, e.part)
	b = binary.AppendUvarint(b, e.parts)
	b = binary.AppendUvarint(b, uint64(len(e.limits)))
	for h, r := range e.limits {
		b = binary.LittleEndian.AppendUint64(b, h)
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(r.demand)))
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(r.share)))
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(r.level)))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(r.released))
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(r.recent)))
	}
	return b
}

// decode parses a payload: version byte, entry count, entries.
func decode(p []byte) ([]entry, error) {
	if len(p) < 2 || p[0] != wireVersion {
		return nil, fmt.Errorf("%w: bad version or too short (%d bytes)", errPayload, len(p))
	}
	p = p[1:]
	uv := func() (uint64, error) {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			return 0, fmt.Errorf("%w: truncated varint", errPayload)
		}
		p = p[n:]
		return v, nil
	}
	count, err := uv()
	if err != nil {
		return nil, err
	}
	if count > uint64(len(p)) {
		return nil, fmt.Errorf("%w: %d entries in %d bytes", errPayload, count, len(p))
	}
	out := make([]entry, 0, count)
	for range count {
		var e entry
		ln, err := uv()
		if err != nil {
			return nil, err
		}
		if ln == 0 || ln > uint64(len(p)) {
			return nil, fmt.Errorf("%w: origin length %d", errPayload, ln)
		}
		e.origin = string(p[:ln])
		p = p[ln:]
		if e.seq, err = uv(); err != nil {
			return nil, err
		}
		age, err := uv()
		if err != nil {
			return nil, err
		}
		e.age = time.Duration(min(age, uint64(math.MaxInt64/int64(time.Millisecond)))) * time.Millisecond
		if len(p) < 1 {
			return nil, fmt.Errorf("%w: truncated flags", errPayload)
		}
		e.leaving = p[0]&1 != 0
		p = p[1:]
		if e.part, err = uv(); err != nil {
			return nil, err
		}
		if e.parts, err = uv(); err != nil {
			return nil, err
		}
		if e.parts > 0 && e.part >= e.parts {
			return nil, fmt.Errorf("%w: part %d of %d", errPayload, e.part, e.parts)
		}
		n, err := uv()
		if err != nil {
			return nil, err
		}
		if n > uint64(len(p))/reportSize {
			return nil, fmt.Errorf("%w: %d limits in %d bytes", errPayload, n, len(p))
		}
		e.limits = make(map[uint64]report, n)
		for range n {
			h := binary.LittleEndian.Uint64(p)
			d := float64(math.Float32frombits(binary.LittleEndian.Uint32(p[8:])))
			sh := float64(math.Float32frombits(binary.LittleEndian.Uint32(p[12:])))
			lv := float64(math.Float32frombits(binary.LittleEndian.Uint32(p[16:])))
			rel := math.Float64frombits(binary.LittleEndian.Uint64(p[20:]))
			fr := float64(math.Float32frombits(binary.LittleEndian.Uint32(p[28:])))
			p = p[reportSize:]
			if math.IsNaN(d) || math.IsInf(d, 0) || d < 0 {
				return nil, fmt.Errorf("%w: demand %v", errPayload, d)
			}
			if math.IsNaN(sh) || sh < 0 || sh > 1 {
				return nil, fmt.Errorf("%w: share %v", errPayload, sh)
			}
			if math.IsNaN(lv) || math.IsInf(lv, 0) {
				return nil, fmt.Errorf("%w: level %v", errPayload, lv)
			}
			if math.IsNaN(rel) || math.IsInf(rel, 0) || rel < 0 || math.IsNaN(fr) || fr < 0 || fr > rel*(1+1e-6) {
				return nil, fmt.Errorf("%w: released %v, %v of it now", errPayload, rel, fr)
			}
			e.limits[h] = report{demand: d, share: sh, level: lv, released: rel, recent: fr, seq: e.seq}
		}
		out = append(out, e)
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errPayload, len(p))
	}
	return out, nil
}

// LocalState returns every entry this instance holds that is still live:
// its own and its peers', with their ages. It is the push/pull payload.
func (l *Limiter) LocalState() []byte {
	now := l.cfg.Now()
	l.viewMu.Lock()
	defer l.viewMu.Unlock()
	b := []byte{wireVersion}
	var count uint64
	var body []byte
	for _, part := range l.own {
		body = append(body, part...)
		count++
	}
	for origin, p := range l.peers {
		age := now.Sub(p.heard)
		if age > l.cfg.PeerTimeout {
			continue
		}
		// One relay entry per sync the peer's reports came from.
		bySeq := map[uint64]map[uint64]report{}
		for h, r := range p.limits {
			if bySeq[r.seq] == nil {
				bySeq[r.seq] = map[uint64]report{}
			}
			bySeq[r.seq][h] = r
		}
		if len(bySeq) == 0 {
			bySeq[p.seq] = nil
		}
		for seq, limits := range bySeq {
			body = appendEntry(body, &entry{origin: origin, seq: seq, age: max(age, 0), leaving: p.leaving && seq == p.seq, limits: limits})
			count++
		}
	}
	b = binary.AppendUvarint(b, count)
	return append(b, body...)
}

// Merge folds a peer's payload (a broadcast or a LocalState) into this
// instance's view. from is the gossip sender and is informational: each
// entry names its origin. Malformed payloads are counted and ignored.
func (l *Limiter) Merge(from string, payload []byte) {
	entries, err := decode(payload)
	now := l.cfg.Now()
	l.viewMu.Lock()
	defer l.viewMu.Unlock()
	if err != nil {
		l.mergeErr = fmt.Errorf("from %s: %w", from, err)
		l.metrics.exchangeErrors.Inc()
		return
	}
	for i := range entries {
		e := &entries[i]
		if e.origin == l.cfg.Instance {
			continue
		}
		heard := now.Add(-e.age)
		if now.Sub(heard) > l.cfg.PeerTimeout {
			continue
		}
		p := l.peers[e.origin]
		if p == nil {
			p = &peer{limits: map[uint64]report{}, taken: map[uint64]float64{}}
			l.peers[e.origin] = p
		}
		if e.seq > p.seq {
			p.seq, p.heard, p.leaving = e.seq, heard, e.leaving
		}
		if e.parts > 0 {
			for h, r := range p.limits {
				if _, ok := e.limits[h]; !ok && h%e.parts == e.part && r.seq < e.seq {
					// p.taken[h] stays: when the peer reports the limit
					// again (it idled full and now releases), what it
					// released since is its counter minus this, even if
					// the report of the release itself was superseded.
					delete(p.limits, h)
				}
			}
		}
		for h, r := range e.limits {
			if old, ok := p.limits[h]; !ok || old.seq <= e.seq {
				p.limits[h] = r
			}
		}
		if !p.leaving {
			l.heard = true
		}
	}
}

// initialShare is the share a limit starts with. Caller holds updateMu.
func (l *Limiter) initialShare(now time.Time) float64 {
	l.viewMu.Lock()
	defer l.viewMu.Unlock()
	live := 0
	for _, p := range l.peers {
		if !p.leaving && now.Sub(p.heard) <= l.cfg.PeerTimeout {
			live++
		}
	}
	switch {
	case live > 0:
		return 1 / float64(live+1)
	case !l.heard && now.Sub(l.started) < l.cfg.Warmup:
		return l.cfg.InitialShare
	}
	return 1
}

// Sync folds the demand measured since the last call into each limit's
// estimate, recomputes every share from the current view, resizes the
// local buckets and returns this instance's report as broadcast payloads:
// one, or several of at most Config.MaxPayload bytes each. Run calls it
// every SyncInterval; tests with a fake clock call it directly.
func (l *Limiter) Sync() [][]byte {
	return l.SyncAt(l.cfg.Now())
}

// SyncAt is Sync at a given time.
func (l *Limiter) SyncAt(now time.Time) [][]byte {
	// updateMu keeps every tenant's set of limits fixed between the fold
	// and the resize; Update is rare and neither is on the request path.
	l.updateMu.Lock()
	defer l.updateMu.Unlock()
	ns := now.UnixNano()
	tbl := *l.tenants.Load()
	ts := make([]*tenant, 0, len(tbl))
	for _, t := range tbl {
		ts = append(ts, t)
	}

	dt := l.cfg.SyncInterval.Seconds()
	if !l.lastSync.IsZero() && now.After(l.lastSync) {
		dt = now.Sub(l.lastSync).Seconds()
	}
	l.lastSync = now
	tau := l.cfg.DemandTimeConstant.Seconds()

	// Fold the demand measured since the last sync, under each tenant's
	// lock. Only Sync writes lim.demand, and updateMu serialises Syncs.
	var lims []*limit
	for _, t := range ts {
		t.mu.Lock()
		for _, lim := range t.all {
			sample := lim.pending / dt
			lim.sample, lim.pending, lim.prevDemand = sample, 0, lim.demand
			// The average spans at least demandArrivals arrivals at the
			// limit's rate: a tenant allowed one request a second would
			// otherwise see its shares swing with every arrival.
			alpha := 1 - math.Exp(-dt/math.Max(tau, demandArrivals/lim.perSec))
			lim.demand = math.Max(0, lim.demand+alpha*(sample-lim.demand))
			lims = append(lims, lim)
		}
		t.mu.Unlock()
	}

	// Fresh peers' shares follow their demand. A peer silent for longer
	// than StaleAfter (cut off, or its reports lost) keeps the share it
	// last reported, so a partition leaves every side with what it held and
	// demand growing on one side cannot squeeze the other; after
	// PeerTimeout it holds nothing.
	l.viewMu.Lock()
	var fresh, held, gone []*peer
	for origin, p := range l.peers {
		switch age := now.Sub(p.heard); {
		case age > 2*l.cfg.PeerTimeout:
			delete(l.peers, origin)
		case age > l.cfg.PeerTimeout:
		case p.leaving:
			gone = append(gone, p) // its last release is still to take up
		case age > l.cfg.StaleAfter:
			held = append(held, p)
		default:
			fresh = append(fresh, p)
		}
	}
	// Forget what was taken from peers of limits that no longer exist
	// here, so the counters do not outlive tenant churn.
	live := make(map[uint64]struct{}, len(lims))
	for _, lim := range lims {
		live[lim.hash] = struct{}{}
	}
	for _, p := range l.peers {
		for h := range p.taken {
			if _, ok := live[h]; !ok {
				delete(p.taken, h)
			}
		}
	}
	warming := len(fresh)+len(held) == 0 && !l.heard && now.Sub(l.started) < l.cfg.Warmup
	shares := make([]float64, len(lims))
	others := make([]float64, len(lims)) // the peers' levels, for the headers
	takeUp := make([]float64, len(lims)) // units released by peers that are ours
	dry := make([]bool, len(lims))       // a fresh peer has run dry and wants more
	for i, lim := range lims {
		if warming {
			shares[i] = l.cfg.InitialShare
			others[i] = (1 - l.cfg.InitialShare) * lim.burst
			continue
		}
		floor := l.cfg.MinShare * lim.perSec
		self := math.Max(lim.demand, floor)
		weights := self
		for _, p := range fresh {
			weights += math.Max(p.limits[lim.hash].demand, floor)
		}
		// A held peer without a report for this limit had no demand on it
		// when it went quiet: it holds the floor's share.
		floorShare := floor / (weights + floor)
		var heldShare float64
		for _, p := range held {
			r, ok := p.limits[lim.hash]
			if !ok {
				r.share, r.level = floorShare, floorShare*lim.burst
			}
			heldShare += r.share
			others[i] += r.level
		}
		heldShare = math.Min(heldShare, 1-l.cfg.MinShare)
		shares[i] = (1 - heldShare) * self / weights
		// A peer that does not report the limit is idle and full at the
		// floor's share of the view it had: this instance's demand as
		// last reported, not as just folded.
		idleShare := (1 - heldShare) * floor / (weights - self + math.Max(lim.prevDemand, floor))
		for _, p := range fresh {
			r, ok := p.limits[lim.hash]
			if !ok {
				others[i] += idleShare * lim.burst
				continue
			}
			age := math.Max(now.Sub(p.heard).Seconds(), 0)
			others[i] += math.Min(r.level+r.share*lim.perSec*age, r.share*lim.burst)
			dry[i] = dry[i] || (r.level < 0.1*r.share*lim.burst && r.demand > r.share*lim.perSec)
		}
		// Parts of a release are weighed by the shares as last reported,
		// this instance's too: the vector every taker holds, so the parts
		// add to one even while the shares move. (Only Sync and Update
		// write lim.share, and updateMu serialises them.)
		takeUp[i] = l.takeUp(lim, lim.share, fresh, held, gone)
	}
	l.viewMu.Unlock()

	// Resize every local bucket to its new share; what no longer fits is
	// released to the pool, and what peers released is taken up.
	own := &entry{origin: l.cfg.Instance, limits: map[uint64]report{}}
	i := 0
	for _, t := range ts {
		t.mu.Lock()
		for _, lim := range t.all {
			share := shares[i]
			size := lim.burst * share
			lim.share = share
			lim.b.advance(ns)
			if lim.fresh {
				// Until its share is known from the peers, a new limit's
				// slice is a guess: it keeps what it spent (its deficit
				// from full) and otherwise starts full at the new size.
				lim.b.level = size - (lim.b.burst - lim.b.level)
				lim.fresh = warming
			}
			lim.b.rate, lim.b.burst = lim.perSec*share, size
			// Units taken up may lift the level above the size: they are
			// spent first, and what is left at the next sync is released
			// again. A full bucket takes nothing (one global bucket would
			// be full too).
			if lim.b.level < size {
				lim.b.level += takeUp[i]
			}
			keep := size
			switch {
			case l.leaving:
				keep = 0 // hand everything back
			case dry[i] && lim.sample < lim.b.rate:
				// A peer has run dry while this instance used less than
				// its refill over the last interval (its demand fell, or
				// it is idle): keep what two intervals at that pace need,
				// and at least its last request's worth, and release the
				// rest, as one global bucket would have served the peer's
				// requests from it.
				keep = math.Min(size, math.Max(2*lim.sample*dt, lim.lastUnits))
			}
			var freed float64
			if lim.b.level > keep {
				freed = lim.b.level - keep
				lim.released += freed
				lim.b.level = keep
			}
			lim.others = others[i]
			lim.shareG.Set(share)
			// What was released over the last releaseWindow syncs: a peer
			// that first hears of the limit takes up that much. A keyed
			// broadcast supersedes one still queued, so the report of the
			// sync that released may never arrive; the next ones say it
			// again (and keep the limit in the report until they have).
			lim.relAt = (lim.relAt + 1) % releaseWindow
			lim.relWindow[lim.relAt] = freed
			var recent float64
			for _, f := range lim.relWindow {
				recent += f
			}
			recent = math.Min(recent, lim.released)
			if lim.demand > 1e-9 || lim.b.level < lim.b.burst || lim.released != lim.reportedRel || recent > 0 || l.leaving {
				own.limits[lim.hash] = report{demand: lim.demand, share: share, level: lim.b.level, released: lim.released, recent: recent}
				lim.reportedRel = lim.released
			}
			i++
		}
		t.mu.Unlock()
	}

	l.viewMu.Lock()
	defer l.viewMu.Unlock()
	l.seq = max(l.seq+1, uint64(ns))
	own.seq, own.leaving = l.seq, l.leaving
	l.own = l.split(own)
	payloads := make([][]byte, len(l.own))
	for k, part := range l.own {
		payloads[k] = append([]byte{wireVersion, 1}, part...)
	}
	return payloads
}

// takeUp returns the units of lim that peers released since this instance
// last looked and that are this instance's to take: each release is
// divided among every other live instance in proportion to their shares
// as reported, this instance's share being share. Caller holds viewMu.
func (l *Limiter) takeUp(lim *limit, share float64, fresh, held, gone []*peer) float64 {
	var got float64
	from := func(src *peer) {
		r, ok := src.limits[lim.hash]
		if !ok {
			return
		}
		taken, seen := src.taken[lim.hash]
		src.taken[lim.hash] = r.released
		d := r.released - taken
		switch {
		case !seen: // the first report of it ever heard here: what it just released
			d = r.recent
		case d < 0: // the peer restarted
			return
		}
		if d <= 0 {
			return
		}
		// Every instance but the source counts, full or not, so that the
		// parts add to at most one when the views agree (a full bucket
		// drops its part: one global bucket would be full too).
		weights := share
		for _, group := range [][]*peer{fresh, held} {
			for _, p := range group {
				if p != src {
					weights += p.limits[lim.hash].share
				}
			}
		}
		if weights > 0 {
			got += d * share / weights
		}
	}
	for _, group := range [][]*peer{fresh, held, gone} {
		for _, p := range group {
			from(p)
		}
	}
	return got
}

// releaseWindow is how many syncs a report keeps saying what was released
// (report.recent): several gossip rounds at the default SyncInterval and
// the LAN profile's 200ms gossip interval.
const releaseWindow = 5

// demandArrivals is the fewest arrivals, at a limit's rate, that its
// demand average spans: the time constant is at least this many times the
// interval between two units at the limit's rate.
const demandArrivals = 5

// split encodes e in as few parts as fit MaxPayload each (as payloads of
// one entry). With no MaxPayload, or when everything fits, it is one part.
//
// The part count is found by counting the limits of each hash class, not
// by encoding: a report has a fixed size per limit, and encoding every
// candidate split cost a sync time in parts × limits (at 5,000 reported
// limits, seconds of CPU per sync; bench/scale).
func (l *Limiter) split(e *entry) [][]byte {
	n := uint64(1)
	if l.cfg.MaxPayload > 0 {
		// A first guess from the sizes, then more parts until all fit
		// (hashes spread limits over the parts unevenly).
		room := max(l.cfg.MaxPayload-2-len(appendEntry(nil, &entry{origin: e.origin, seq: e.seq, parts: 1})), reportSize)
		n = max(1, uint64((len(e.limits)*reportSize+room-1)/room))
		hashes := make([]uint64, 0, len(e.limits))
		for h := range e.limits {
			hashes = append(hashes, h)
		}
		var counts []int
		for ; n < uint64(len(hashes)); n++ {
			counts = append(counts[:0], make([]int, n)...)
			for _, h := range hashes {
				counts[h%n]++
			}
			fits := true
			for k, c := range counts {
				if partSize(e, uint64(k), n, c)+2 > l.cfg.MaxPayload {
					fits = false
					break
				}
			}
			if fits {
				break
			}
		}
	}
	parts := make([]entry, n)
	for k := range parts {
		parts[k] = entry{origin: e.origin, seq: e.seq, leaving: e.leaving, part: uint64(k), parts: n, limits: map[uint64]report{}}
	}
	for h, r := range e.limits {
		parts[h%n].limits[h] = r
	}
	out := make([][]byte, n)
	for k := range parts {
		out[k] = appendEntry(nil, &parts[k])
	}
	return out
}

// partSize is the length appendEntry gives part k of n of e's report
// holding count limits (an origin's entry: age 0).
func partSize(e *entry, k, n uint64, count int) int {
	uv := func(v uint64) int { return (bits.Len64(v|1) + 6) / 7 }
	return uv(uint64(len(e.origin))) + len(e.origin) + uv(e.seq) + uv(0) + 1 + uv(k) + uv(n) + uv(uint64(count)) + count*reportSize
}

// Leave marks this instance as leaving and returns payloads that tell
// peers to release its shares at once. Broadcast them before shutting down.
func (l *Limiter) Leave() [][]byte {
	l.viewMu.Lock()
	l.leaving = true
	l.viewMu.Unlock()
	return l.Sync()
}

// Run calls Sync every SyncInterval and hands each payload to publish
// until ctx is done; it then publishes the leaving tombstone and returns
// ctx's error. key names the part ("0", "1", ...): a newer payload with the
// same key supersedes an older one, which is what a gossip node's
// BroadcastLatest(channel, key, payload) wants. publish is called from
// Run's goroutine only and should not block for long: a slow publish
// delays the next sync.
func (l *Limiter) Run(ctx context.Context, publish func(key string, payload []byte)) error {
	tick := time.NewTicker(l.cfg.SyncInterval)
	defer tick.Stop()
	send := func(payloads [][]byte) {
		for k, p := range payloads {
			publish(strconv.Itoa(k), p)
		}
	}
	for {
		select {
		case <-ctx.Done():
			send(l.Leave())
			return ctx.Err()
		case <-tick.C:
			send(l.Sync())
		}
	}
}

// Peer is what this instance knows of another, for status pages and tests.
type Peer struct {
	Instance string
	// Seq orders the peer's reports; it is the peer's clock in Unix
	// nanoseconds at its last sync (or one more than its previous Seq).
	Seq uint64
	// Heard is when the peer produced its last report, on this clock.
	Heard   time.Time
	Leaving bool
	// Held is true while the peer is silent for longer than StaleAfter:
	// it keeps the share it had instead of one that follows its demand.
	Held bool
	// Live is false once Heard is older than PeerTimeout or the peer left:
	// it no longer holds a share.
	Live bool
}

// Peers returns the peers this instance has heard from, sorted by name.
func (l *Limiter) Peers() []Peer {
	now := l.cfg.Now()
	l.viewMu.Lock()
	defer l.viewMu.Unlock()
	out := make([]Peer, 0, len(l.peers))
	for name, p := range l.peers {
		out = append(out, Peer{
			Instance: name, Seq: p.seq, Heard: p.heard, Leaving: p.leaving,
			Held: !p.leaving && now.Sub(p.heard) > l.cfg.StaleAfter && now.Sub(p.heard) <= l.cfg.PeerTimeout,
			Live: !p.leaving && now.Sub(p.heard) <= l.cfg.PeerTimeout,
		})
	}
	slices.SortFunc(out, func(a, b Peer) int { return strings.Compare(a.Instance, b.Instance) })
	return out
}
