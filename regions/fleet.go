// Package regions decides which cluster, in which Region, a Tier-2 request
// goes to. It keeps the pool-health Digests every Tier-1 reports (and that
// Tier-2 instances gossip to each other), the round trips to every Region,
// and per-cluster outlier state, and from those it orders the clusters that
// can serve a request: a primary and fallbacks for failover.
//
// It decides: which clusters are candidates (a fresh digest with ready pods
// for the model, not ejected), how they score (the operator's kvHeadroom,
// queueDepth, regionProximity and errorRate weights), which near-best
// cluster is a prompt prefix's home (consistent hashing with bounded
// loads), when a failing cluster is ejected and how it is readmitted, and
// whether a retry fits the retry budget. It does not do I/O: Tier-2 feeds
// it digests, round trips and request outcomes, and sends the requests.
//
// Everything time-dependent reads the clock given in Config.Now.
package regions

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Request is what cluster choice needs to know about one request.
type Request struct {
	// Model is the target model (after rewrites): a pool's model or one of
	// its adapters.
	Model string
	// PrefixHash identifies the prompt's leading prefix blocks (for example
	// the chained block hash after the first few blocks); requests with
	// equal PrefixHash share a home cluster. Zero means no prefix affinity.
	PrefixHash uint64
	// Clusters, when not empty, restricts the choice to clusters with these
	// names (a rewrite target pinned to some clusters).
	Clusters []string
	// Tokens is the request's length as a model server counts it against
	// its max_model_len (prompt plus the output tokens asked for); 0 when
	// unknown. A cluster whose ready pods all accept less is passed over,
	// unless no cluster accepts that much (then the pods give the answer).
	Tokens int
}

// Target is one cluster chosen for a request.
type Target struct {
	Region  string
	Cluster string
	Tier1   string  // base URL of the cluster's Tier-1
	Score   float64 // weighted score in [0, 1], before prefix affinity

	c *cluster
}

// Result is the outcome of sending a request to a Target, as outlier
// detection counts it.
type Result uint8

const (
	// Success is any response that started (the first byte arrived),
	// 4xx other than 429 included: the cluster answered.
	Success Result = iota
	// Failure is a connect error, a timeout before the first byte, or a
	// 5xx.
	Failure
	// Overloaded is a 429: the cluster is healthy but shedding. It counts
	// neither way for ejection.
	Overloaded
)

// rank sorts candidates before score.
type rank uint8

const (
	rankReady     rank = iota
	rankProbation      // readmitted, not given this request
	rankEjected        // used only when nothing else is left
	rankStale          // not a candidate: digest expired, or excluded by the request
)

// maxCandidates bounds the clusters considered for one model; it keeps
// Select's bookkeeping on the stack.
const maxCandidates = 256

// Fleet is every cluster as this Tier-2 sees it. It is safe for concurrent
// use. Select, Begin and End do not allocate; Select and Begin take no
// lock, End takes its cluster's own for a few counters.
type Fleet struct {
	now    func() time.Time
	store  *DigestStore
	budget *RetryBudget

	mu       sync.Mutex // serialises rebuilds and Update
	cfg      Config
	prox     *Proximity
	clusters map[[2]string]*cluster
	view     atomic.Pointer[view]
}

// cluster is the lasting state of one cluster: it survives view rebuilds
// and config updates.
type cluster struct {
	Cluster
	inflight     atomic.Int64
	ejectedUntil atomic.Int64 // Unix ns; 0 means never ejected
	probes       atomic.Uint64
	ejectedTotal atomic.Uint64

	mu          sync.Mutex
	consecutive int
	windowStart time.Time
	windowReqs  int
	windowFails int
	ejections   int // recent, for backoff
	lastEjected time.Time
}

// view is an immutable snapshot of everything Select reads besides the
// per-cluster atomics.
type view struct {
	byModel    map[string]*modelView
	digests    map[string][]heldDigest // by model and adapter name, ordered by key (EachDigest)
	maxTargets int
	loadFactor float64
	loadFloor  float64
	spread     float64 // score a cluster may give up for prefix affinity
	affinity   bool
	outlier    OutlierConfig
	proxScore  map[string]float64 // Region → proximity score used
}

type modelView struct {
	cands []candidate
	order []uint16 // cands by score (best first), then Region and name
	ring  []ringPoint
	// members is the cluster sequence the ring was built for.
	members []*cluster
}

// heldDigest is a fresh digest as the view saw it, until it expires.
type heldDigest struct {
	d       Digest
	expires int64 // Unix ns: when the store stops holding it fresh
}

type candidate struct {
	c        *cluster
	score    float64
	capacity float64 // ready pods
	expires  int64   // Unix ns when the digest goes stale
	// maxLen is the longest request some ready pod accepts
	// (Digest.MaxModelLen); 0 when unknown.
	maxLen int
}

type ringPoint struct {
	hash uint64
	cand uint16
}

// NewFleet builds a Fleet with an empty DigestStore.
func NewFleet(cfg Config) (*Fleet, error) {
	full, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	f := &Fleet{
		now:      full.Now,
		store:    NewDigestStore(full.DigestMaxAge, full.Now),
		budget:   newRetryBudget(full.Retry, full.Now),
		clusters: make(map[[2]string]*cluster),
	}
	f.store.onChange = f.rebuild
	f.apply(full, nil)
	return f, nil
}

// Update applies a new configuration live. Cluster state (in-flight counts,
// ejections) carries over for clusters still listed, and so do measured
// round trips and held digests (judged by the new DigestMaxAge); Now is not
// changed.
func (f *Fleet) Update(cfg Config) error {
	cfg.Now = f.now
	full, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	f.budget.setConfig(full.Retry)
	f.store.maxAge.Store(int64(full.DigestMaxAge))
	f.mu.Lock()
	old := f.prox
	f.mu.Unlock()
	f.apply(full, old)
	return nil
}

func (f *Fleet) apply(cfg Config, oldProx *Proximity) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cfg = cfg
	f.prox = newProximity(&cfg)
	if oldProx != nil {
		oldProx.mu.Lock()
		for r, m := range oldProx.measured {
			f.prox.measured[r] = m
		}
		oldProx.mu.Unlock()
	}
	next := make(map[[2]string]*cluster, len(cfg.Clusters))
	for _, c := range cfg.Clusters {
		k := [2]string{c.Region, c.Name}
		cl := f.clusters[k]
		if cl == nil || cl.Cluster != c {
			// A changed address starts afresh: Select reads these fields
			// without a lock, so they are never rewritten.
			cl = &cluster{Cluster: c}
		}
		next[k] = cl
	}
	f.clusters = next
	f.rebuildLocked()
}

// EachDigest calls fn with every fresh digest of a pool serving model (as
// its base model or one of its adapters), ordered by key as
// DigestStore.Digests orders them. It reads the view the last change of
// the store built, not the store: no copy, no sort, no lock, and only
// model's pools, which is what the request path can afford (Digests
// copies and sorts every pool of every model). fn must not keep d.
func (f *Fleet) EachDigest(model string, fn func(d *Digest)) {
	v := f.view.Load()
	if v == nil {
		return
	}
	ds := v.digests[model]
	if len(ds) == 0 {
		return
	}
	now := f.now().UnixNano()
	for i := range ds {
		if now <= ds[i].expires {
			fn(&ds[i].d)
		}
	}
}

// Digests returns the store Tier-2 feeds and registers as a gossip
// channel.
func (f *Fleet) Digests() *DigestStore { return f.store }

// Retries returns the retry budget.
func (f *Fleet) Retries() *RetryBudget { return f.budget }

// ObserveRTT records a measured round trip from this Tier-2 to a member in
// region (tier2/gossip's Member.RTT).
func (f *Fleet) ObserveRTT(region string, rtt time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.prox.Observe(region, rtt)
	v := f.view.Load()
	used, ok := v.proxScore[region]
	if !ok || math.Abs(used-f.proximityScore(region)) > 0.005 {
		f.rebuildLocked()
	}
}

// RTT returns the round trip cluster choice uses for region.
func (f *Fleet) RTT(region string) (time.Duration, RTTSource) {
	f.mu.Lock()
	p := f.prox
	f.mu.Unlock()
	return p.RTT(region)
}

func (f *Fleet) proximityScore(region string) float64 {
	rtt, _ := f.prox.RTT(region)
	return 1 / (1 + float64(rtt)/float64(f.cfg.ProximityScale))
}

// score is a digest's weighted score in [0, 1].
// The error rate is the worse of Tier-1's and this Tier-2's own (which also
// sees failures between the Regions that Tier-1 cannot).
func (f *Fleet) score(d *Digest, c *cluster, prox float64) float64 {
	w := f.cfg.Weights
	sum := w.sum()
	if sum == 0 {
		return 0
	}
	kv := 1 - d.KVMean
	perPod := float64(d.QueueTotal) / float64(max(1, d.ReadyPods))
	queue := 1 / (1 + perPod/f.cfg.QueueScale)
	if d.ReadyPods == 0 { // blind: no credit for KV or queue headroom
		kv, queue = 0, 0
	}
	errRate := max(d.ErrorRate, c.errorRate(f.now(), &f.cfg.Outlier))
	errs := max(0, 1-errRate/f.cfg.ErrorRateCeiling)
	return (w.KVHeadroom*kv + w.QueueDepth*queue + w.RegionProximity*prox + w.ErrorRate*errs) / sum
}

func (f *Fleet) rebuild() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rebuildLocked()
}

// rebuildLocked derives a new view from the store's fresh digests.
func (f *Fleet) rebuildLocked() {
	old := f.view.Load()
	sum := f.cfg.Weights.sum()
	v := &view{
		byModel:    make(map[string]*modelView),
		maxTargets: f.cfg.MaxTargets,
		loadFactor: f.cfg.LoadFactor,
		loadFloor:  max(0, f.cfg.LoadFloor),
		affinity:   f.cfg.Weights.PrefixAffinity > 0,
		outlier:    f.cfg.Outlier,
		proxScore:  make(map[string]float64),
	}
	if sum > 0 {
		v.spread = f.cfg.Weights.PrefixAffinity / sum
	} else {
		v.spread = math.Inf(1)
	}
	perModel := make(map[string]*modelView)
	v.digests = make(map[string][]heldDigest)
	f.store.eachFresh(func(d *Digest, expires time.Time) {
		hd := heldDigest{d: *d, expires: expires.UnixNano()}
		for i := -1; i < len(d.Adapters); i++ {
			name := d.Model
			if i >= 0 {
				name = d.Adapters[i]
			}
			v.digests[name] = append(v.digests[name], hd)
		}
		c := f.clusters[[2]string{d.Region, d.Cluster}]
		// A cluster whose ready pods all have stale metrics (StalePods,
		// ReadyPods 0) is blind, not down: a missed scrape is missing
		// evidence (priority.Thresholds.Pool), and Tier-1 fails open on it.
		// It stays a candidate, scored without credit for load it cannot
		// see. Every process of a host starved for a couple of seconds
		// misses its scrapes at once; excluding blind clusters answered
		// 503 no_cluster after each such stall.
		if c == nil || d.ReadyPods+d.StalePods == 0 {
			return
		}
		prox, ok := v.proxScore[d.Region]
		if !ok {
			prox = f.proximityScore(d.Region)
			v.proxScore[d.Region] = prox
		}
		cd := candidate{c: c, score: f.score(d, c, prox), capacity: float64(max(d.ReadyPods, d.StalePods)),
			expires: expires.UnixNano(), maxLen: d.MaxModelLen}
		for i := -1; i < len(d.Adapters); i++ {
			name := d.Model
			if i >= 0 {
				name = d.Adapters[i]
				// An adapter the pods are known not to have registered is
				// not served here, whatever the configuration says.
				if d.MaxModelLen > 0 && !slices.Contains(d.ServedAdapters, name) {
					continue
				}
			}
			mv := perModel[name]
			if mv == nil {
				mv = &modelView{}
				perModel[name] = mv
			}
			// Two pools of one cluster serving the same name: the cluster
			// scores as its better pool and offers both pools' pods. Such
			// pairs are rare, so a scan beats an index.
			merged := false
			for j := range mv.cands {
				if prev := &mv.cands[j]; prev.c == c {
					capacity := prev.capacity + cd.capacity
					maxLen := max(prev.maxLen, cd.maxLen)
					if prev.maxLen == 0 || cd.maxLen == 0 {
						maxLen = 0 // one pool's limit is unknown
					}
					if cd.score > prev.score {
						*prev = cd
					}
					prev.capacity, prev.maxLen = capacity, maxLen
					merged = true
					break
				}
			}
			if !merged {
				mv.cands = append(mv.cands, cd)
			}
		}
	})
	for _, ds := range v.digests {
		slices.SortFunc(ds, func(a, b heldDigest) int { return compareKeys(&a.d, &b.d) })
	}
	for name, mv := range perModel {
		// A stable order (by Region, then name) lets the ring be reused.
		sortCandidates(mv.cands)
		if len(mv.cands) > maxCandidates {
			mv.cands = mv.cands[:maxCandidates]
		}
		mv.members = make([]*cluster, 0, len(mv.cands))
		mv.order = make([]uint16, 0, len(mv.cands))
		for i, cd := range mv.cands {
			mv.members = append(mv.members, cd.c)
			mv.order = append(mv.order, uint16(i))
		}
		slices.SortStableFunc(mv.order, func(a, b uint16) int {
			return cmp.Compare(mv.cands[b].score, mv.cands[a].score)
		})
		if prev := old.modelView(name); prev != nil && sameClusters(prev.members, mv.members) {
			mv.ring = prev.ring
		} else {
			mv.ring = buildRing(mv.cands, f.cfg.VirtualNodes)
		}
		v.byModel[name] = mv
	}
	f.view.Store(v)
}

func (v *view) modelView(name string) *modelView {
	if v == nil {
		return nil
	}
	return v.byModel[name]
}

func sortCandidates(cs []candidate) {
	slices.SortFunc(cs, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.c.Region, b.c.Region), cmp.Compare(a.c.Name, b.c.Name))
	})
}

func sameClusters(a, b []*cluster) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// buildRing places vnodes points per cluster. Points hash the cluster's
// Region and name only, so every Tier-2 builds the same ring and agrees on
// each prefix's home.
func buildRing(cands []candidate, vnodes int) []ringPoint {
	ring := make([]ringPoint, 0, len(cands)*vnodes)
	var buf []byte
	for i, cd := range cands {
		for v := range vnodes {
			buf = append(buf[:0], cd.c.Region...)
			buf = append(buf, '/')
			buf = append(buf, cd.c.Name...)
			buf = append(buf, '#')
			buf = strconv.AppendInt(buf, int64(v), 10)
			ring = append(ring, ringPoint{hash: xxhash.Sum64(buf), cand: uint16(i)})
		}
	}
	sortRing(ring)
	return ring
}

func sortRing(r []ringPoint) {
	slices.SortFunc(r, func(a, b ringPoint) int {
		if c := cmp.Compare(a.hash, b.hash); c != 0 {
			return c
		}
		return cmp.Compare(a.cand, b.cand)
	})
}

// Select appends to dst[:0] the clusters for req, best first: the primary,
// then fallbacks in order, at most Config.MaxTargets. It returns nil-length
// when no cluster serves req.Model with a fresh digest.
//
// Ordering: candidates are the clusters with a fresh digest showing ready
// pods for the model; ejected clusters are left out (unless every
// candidate is ejected: then they are returned as a last resort), and a
// readmitted cluster still on its ramp takes its current share of requests
// and sits behind the others for the rest. The primary is chosen among the
// near-best (within the prefix-affinity spread) by consistent hashing with
// bounded loads on req.PrefixHash, or as the least loaded relative to ready
// pods when there is no prefix. The first fallback is the best cluster of
// another Region; the rest follow by score.
//
// dst's capacity is reused: with room for MaxTargets targets (a per-request
// array, say) Select does not allocate.
func (f *Fleet) Select(dst []Target, req Request) []Target {
	dst = dst[:0]
	v := f.view.Load()
	mv := v.byModel[req.Model]
	if mv == nil || v.maxTargets == 0 {
		return dst
	}
	now := f.now().UnixNano()
	var ranks [maxCandidates]rank
	var counts [rankEjected + 1]int
	tooShort := 0 // candidates passed over for their context length
	for i := range mv.cands {
		cd := &mv.cands[i]
		if now >= cd.expires || (len(req.Clusters) > 0 && !slices.Contains(req.Clusters, cd.c.Name)) {
			ranks[i] = rankStale
			continue
		}
		if req.Tokens > 0 && cd.maxLen > 0 && req.Tokens > cd.maxLen {
			ranks[i] = rankStale
			tooShort++
			continue
		}
		r := cd.c.admission(now, &v.outlier)
		ranks[i] = r
		counts[r]++
	}
	if tooShort > 0 && counts == [rankEjected + 1]int{} {
		// No cluster takes a request this long: the pods say so themselves.
		return f.Select(dst, Request{Model: req.Model, PrefixHash: req.PrefixHash, Clusters: req.Clusters})
	}
	top := rankReady
	for top <= rankEjected && counts[top] == 0 {
		top++
	}
	if top > rankEjected {
		return dst
	}

	// The home set: the best-scoring candidates of the top rank, within
	// the spread of the best (mv.order is by score, best first).
	var set candSet
	var load, capacity float64
	home, members := -1, 0
	best := 0.0
	for _, i := range mv.order {
		if ranks[i] != top {
			continue
		}
		cd := &mv.cands[i]
		if home < 0 {
			home, best = int(i), cd.score
		} else if cd.score < best-v.spread-1e-12 {
			break
		}
		set.add(i)
		members++
		load += float64(cd.c.inflight.Load())
		capacity += cd.capacity
	}
	if members > 1 {
		home = homeOf(mv, v, &set, load, capacity, req.PrefixHash)
	}

	// The primary, then fallbacks in score order, rank by rank; ejected
	// clusters only when nothing else is left.
	last := rankProbation
	if top == rankEjected {
		last = rankEjected
	}
	// The first fallback is the best cluster of another Region, if there is
	// one: failures within a Region are correlated (a Region outage, a
	// network partition), so a second attempt there is the likeliest to
	// fail too, and every wasted attempt costs a timeout and retry budget.
	dst = append(dst, mv.target(uint16(home)))
	homeRegion := mv.cands[home].c.Region
	other := -1
	for r := top; r <= last && other < 0; r++ {
		for _, i := range mv.order {
			if ranks[i] == r && mv.cands[i].c.Region != homeRegion {
				other = int(i)
				break
			}
		}
	}
	if other >= 0 && len(dst) < v.maxTargets {
		dst = append(dst, mv.target(uint16(other)))
	}
	for r := top; r <= last && len(dst) < v.maxTargets; r++ {
		for _, i := range mv.order {
			if len(dst) >= v.maxTargets {
				break
			}
			if ranks[i] == r && int(i) != home && int(i) != other {
				dst = append(dst, mv.target(i))
			}
		}
	}
	return dst
}

func (mv *modelView) target(i uint16) Target {
	cd := &mv.cands[i]
	return Target{Region: cd.c.Region, Cluster: cd.c.Name, Tier1: cd.c.Tier1, Score: cd.score, c: cd.c}
}

// candSet is a set of candidate indices.
type candSet [maxCandidates / 64]uint64

func (s *candSet) add(i uint16)      { s[i/64] |= 1 << (i % 64) }
func (s *candSet) has(i uint16) bool { return s[i/64]&(1<<(i%64)) != 0 }

// homeOf picks the primary among the interchangeable candidates in set,
// which hold load requests in flight over capacity ready pods.
func homeOf(mv *modelView, v *view, set *candSet, load, capacity float64, prefix uint64) int {
	// Bounded loads: after this assignment no member may hold more than
	// LoadFactor × its share (by capacity) of the set's requests, or the
	// floor of LoadFloor per ready pod when that is more.
	fits := func(i uint16) bool {
		cd := &mv.cands[i]
		limit := max(math.Ceil(v.loadFactor*(load+1)*cd.capacity/capacity), v.loadFloor*cd.capacity)
		return float64(cd.c.inflight.Load())+1 <= limit
	}
	if v.affinity && prefix != 0 && len(mv.ring) > 0 {
		ring := mv.ring
		lo, hi := 0, len(ring)
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if ring[mid].hash < prefix {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		var tried candSet
		for n := 0; n < len(ring); n++ {
			p := ring[(lo+n)%len(ring)].cand
			if !set.has(p) || tried.has(p) {
				continue
			}
			tried.add(p)
			if fits(p) {
				return int(p)
			}
		}
	}
	// No prefix (or, impossibly, every member full): the least loaded
	// relative to capacity; ties keep score order.
	bestI, bestLoad := -1, math.Inf(1)
	for _, i := range mv.order {
		if !set.has(i) {
			continue
		}
		cd := &mv.cands[i]
		if l := (float64(cd.c.inflight.Load()) + 1) / cd.capacity; l < bestLoad {
			bestI, bestLoad = int(i), l
		}
	}
	return bestI
}

// Begin counts a request as in flight to t, for bounded loads. Pair every
// Begin with one End.
func (f *Fleet) Begin(t Target) {
	if t.c != nil {
		t.c.inflight.Add(1)
	}
}

// End records the outcome of a request begun on t and ends its in-flight
// count. A Failure may eject the cluster.
func (f *Fleet) End(t Target, r Result) {
	if t.c == nil {
		return
	}
	t.c.inflight.Add(-1)
	t.c.record(f.now(), r, &f.view.Load().outlier)
}

// ClusterStatus is one cluster's state, for metrics and debugging.
type ClusterStatus struct {
	Region, Cluster string
	InFlight        int64
	Ejected         bool
	// ReadmitShare is the share of requests a cluster on its readmission
	// ramp gets; 1 when not ramping.
	ReadmitShare float64
	EjectedUntil time.Time // zero if never ejected
	Ejections    uint64    // total so far
}

// Status reports every configured cluster, ordered by Region and name.
func (f *Fleet) Status() []ClusterStatus {
	f.mu.Lock()
	cs := make([]*cluster, 0, len(f.clusters))
	for _, c := range f.clusters {
		cs = append(cs, c)
	}
	f.mu.Unlock()
	slices.SortFunc(cs, func(a, b *cluster) int {
		if c := cmp.Compare(a.Region, b.Region); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	now := f.now().UnixNano()
	o := &f.view.Load().outlier
	out := make([]ClusterStatus, 0, len(cs))
	for _, c := range cs {
		st := ClusterStatus{Region: c.Region, Cluster: c.Name, InFlight: c.inflight.Load(),
			Ejections: c.ejectedTotal.Load(), ReadmitShare: 1}
		if until := c.ejectedUntil.Load(); until != 0 {
			st.EjectedUntil = time.Unix(0, until)
			st.Ejected = now < until
			if st.Ejected {
				st.ReadmitShare = 0
			} else {
				st.ReadmitShare = readmitShare(now-until, o)
			}
		}
		out = append(out, st)
	}
	return out
}
