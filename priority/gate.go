package priority

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meridian-router/meridian/internal/defaults"
)

// Config holds a Gate's knobs. Every field's zero value means its default,
// so the zero Config is a working one. Change it live with Gate.SetConfig.
type Config struct {
	// MaxQueued bounds the requests waiting in the Gate, all bands
	// together. Zero means 1000. When full, an arrival evicts a queued
	// request of a lower band (or a later one of the same band's heaviest
	// tenant) if there is one, and is rejected otherwise. Larger absorbs
	// longer bursts at the cost of longer waits before a 429.
	MaxQueued int
	// MaxQueuedBytes bounds the request bodies held while waiting
	// (Request.Bytes summed). Zero means 256 MiB. Prompts of agents run to
	// hundreds of kilobytes; this keeps a burst of them from exhausting
	// memory.
	MaxQueuedBytes int64
	// StandardMaxWait is how long a Standard request may wait before it is
	// rejected with 429. Zero means 10s. Longer lets more Standard work
	// through a burst; shorter fails faster so clients can back off or go
	// elsewhere.
	StandardMaxWait time.Duration
	// CriticalMaxWait is the same for Critical requests. Zero means 30s.
	CriticalMaxWait time.Duration
	// CriticalReserve is the part of the pool's saturation budget kept for
	// Critical requests: Standard and Sheddable requests are admitted only
	// while the estimated saturation is below 1 − CriticalReserve, Critical
	// ones while it is below 1. Zero means 0.65 (with the default
	// thresholds, about 3.25 waiting requests per pod kept for Critical);
	// negative means no reserve. A larger reserve lets Critical arrivals in
	// at once and onto pods with short queues and batches, at the cost of
	// shedding Sheddable and queueing Standard requests earlier.
	//
	// 0.65 is the smallest reserve of the sweep that meets the goal of
	// Critical P99 TTFT ≤ 1.2× its calm value at 3× overload in
	// bench/priority (4 A10G pods, 3 seeds: 1.05×; 5 seeds: 1.07×; 8 pods,
	// 300 s, 3 seeds: 1.05×), against 1.35× at the former 0.45 and 1.25–1.29×
	// at 0.5–0.6, once the bench's scheduler learned first tokens when they
	// happen. It costs throughput at overload (9.5 against 11.7 req/s at
	// 0.45 with 4 pods): the pods run shorter batches while Standard waits.
	// docs/BENCHMARKS.md has the sweep.
	CriticalReserve float64
	// RetryAfter is the delay a rejection asks the client to wait
	// (Retry-After, rounded up to whole seconds by the caller). Zero means
	// 1s.
	RetryAfter time.Duration
}

// DefaultConfig returns the defaults spelled out; the zero Config means the
// same.
func DefaultConfig() Config {
	return Config{
		MaxQueued:       1000,
		MaxQueuedBytes:  256 << 20,
		StandardMaxWait: 10 * time.Second,
		CriticalMaxWait: 30 * time.Second,
		CriticalReserve: 0.65,
		RetryAfter:      time.Second,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	c.MaxQueued = defaults.Positive(c.MaxQueued, d.MaxQueued)
	c.MaxQueuedBytes = defaults.Positive(c.MaxQueuedBytes, d.MaxQueuedBytes)
	c.StandardMaxWait = defaults.Positive(c.StandardMaxWait, d.StandardMaxWait)
	c.CriticalMaxWait = defaults.Positive(c.CriticalMaxWait, d.CriticalMaxWait)
	switch {
	case c.CriticalReserve == 0:
		c.CriticalReserve = d.CriticalReserve
	case c.CriticalReserve < 0:
		c.CriticalReserve = 0
	case c.CriticalReserve > 1:
		c.CriticalReserve = 1
	}
	c.RetryAfter = defaults.Positive(c.RetryAfter, d.RetryAfter)
	return c
}

// Request is what admission needs to know about one request.
type Request struct {
	// Tenant is the fairness key: the authenticated tenant (Tier-2) or
	// x-gateway-inference-fairness-id (Tier-1).
	Tenant string
	// Band is the request's band, already lowered to the tenant's MaxBand
	// (Tenants.Band).
	Band Band
	// Bytes is the size of the request body held while it waits.
	Bytes int64
	// MaySpill asks the Gate not to queue: when the pool is saturated a
	// Critical or Standard request gets ErrSpill at once so that the caller
	// can send it to a Region with headroom. Tier-2 sets it when it knows
	// such a Region; without one it admits again with MaySpill false, so
	// the request queues here rather than being rejected. Such a request
	// is judged without the observation's Backlog.
	MaySpill bool
}

// Reason says why a request was rejected.
type Reason int8

const (
	// ReasonSaturated: a Sheddable request arrived at a saturated pool.
	ReasonSaturated Reason = iota
	// ReasonNoMetrics: a Sheddable request arrived at a pool whose load is
	// unknown (no fresh metrics).
	ReasonNoMetrics
	// ReasonQueueFull: the queue was full of requests at least as
	// important.
	ReasonQueueFull
	// ReasonEvicted: a queued request made room for a more important one.
	ReasonEvicted
	// ReasonTimeout: the request waited its band's maximum.
	ReasonTimeout

	numReasons = 5
)

func (r Reason) String() string {
	switch r {
	case ReasonSaturated:
		return "saturated"
	case ReasonNoMetrics:
		return "no_metrics"
	case ReasonQueueFull:
		return "queue_full"
	case ReasonEvicted:
		return "evicted"
	case ReasonTimeout:
		return "timeout"
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// ErrShed matches every Rejection (errors.Is(err, ErrShed)).
var ErrShed = errors.New("priority: request shed")

// ErrSpill tells a caller that set Request.MaySpill to send the request
// elsewhere: the pool is saturated. It is not a rejection.
var ErrSpill = errors.New("priority: pool saturated; spill to another Region")

// Rejection is a 429: the request was not admitted and should be retried
// after RetryAfter. A Gate hands out shared Rejections (so that shedding
// does not allocate); read them, do not modify them.
type Rejection struct {
	Band       Band
	Reason     Reason
	RetryAfter time.Duration
}

func (r *Rejection) Error() string {
	return fmt.Sprintf("priority: %s request shed (%s); retry after %s", r.Band, r.Reason, r.RetryAfter)
}

// Code is the error code both tiers answer a rejection with (OpenAI's
// error shape, and their rejected-requests metrics): queue_full for a
// full queue or an eviction, queue_timeout for a request that waited its
// band's maximum, shed otherwise.
func (r *Rejection) Code() string {
	switch r.Reason {
	case ReasonQueueFull, ReasonEvicted:
		return "queue_full"
	case ReasonTimeout:
		return "queue_timeout"
	}
	return "shed"
}

// Is makes errors.Is(err, ErrShed) true for every Rejection.
func (r *Rejection) Is(target error) bool { return target == ErrShed }

// Clock is the time source of a Gate. AfterFunc runs f in its own
// goroutine after d, unless stopped first. The zero Gate uses the time
// package; tests use testing/synctest or a virtual clock.
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc; *time.Timer satisfies it.
type Timer interface{ Stop() bool }

type systemClock struct{}

func (systemClock) Now() time.Time                            { return time.Now() }
func (systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Ticket is an admitted request's hold on the pool's capacity. Call Done
// once the request has finished (its last byte streamed, or it failed), so
// the capacity goes to the next waiter. Done is idempotent.
type Ticket struct {
	// Band is the band the request was admitted in.
	Band Band
	// Waited is the time it spent queued (0 if admitted at once).
	Waited time.Duration

	g    *Gate
	once sync.Once
	seen atomic.Bool
}

// Done releases the ticket's capacity.
func (t *Ticket) Done() {
	if t == nil || t.g == nil {
		return
	}
	t.once.Do(func() { t.g.finish(t.seen.CompareAndSwap(false, true)) })
}

// Seen tells the Gate that the admitted request is now visible to the
// pool's observations (a caller counts it as pending or in flight where
// its saturation is computed), for ObserveSince. It is idempotent; Done
// implies it.
func (t *Ticket) Seen() {
	if t == nil || t.g == nil || !t.seen.CompareAndSwap(false, true) {
		return
	}
	t.g.mu.Lock()
	t.g.seen++
	t.g.mu.Unlock()
}

// Admitter is what the request path needs from admission; *Gate and
// *GIEGate implement it, so one benchmark can drive either.
type Admitter interface {
	Admit(ctx context.Context, r Request) (*Ticket, error)
	Observe(s Saturation)
}

// Gate admits requests into one pool. It is safe for concurrent use. Set
// its exported fields before first use; the zero Gate (with the zero
// Config) is ready.
//
// Capacity comes from two sources: Observe reports the pool's saturation
// from fresh metrics, and between two observations the Gate counts what
// it admitted (each raising the estimate by Saturation.PerRequest) and
// what finished (Ticket.Done, lowering it). The pool has headroom for a
// Critical request while the estimate is below 1, and for the others while
// it is below 1 − Config.CriticalReserve. Saturated, the Gate behaves as a
// concurrency limiter: each finished request lets the next waiter in.
//
// Waiters leave in this order: every Critical before any Standard; inside
// a band, by start-time fair queueing over tenants weighted by
// Tenants.Weight, so a tenant with a deep backlog gets its weighted share
// and no more while others wait; FIFO within a tenant.
type Gate struct {
	// Pool names the pool in metrics.
	Pool string
	// Tenants gives each tenant's fair-queueing weight. Nil means 1 each.
	Tenants *Tenants
	// Metrics records admission metrics. Nil records nothing.
	Metrics *Metrics
	// Clock is the time source. Nil means the time package.
	Clock Clock

	mu     sync.Mutex
	inited bool
	cfg    Config // with defaults
	clock  Clock
	m      *poolMetrics
	rej    [numBands][numReasons]*Rejection

	obs      Saturation
	inflight int // admitted minus finished since the last observation
	// granted counts tickets handed out and seen those of them declared
	// visible to observations (Ticket.Seen, or done): ObserveSince keeps
	// counting the ones an observation could not include.
	granted, seen uint64

	// rate is the admissions per second, smoothed over rateTau and
	// updated at each observation (AdmitRate); rateAt and rateGranted
	// are granted as of the last update.
	rate        float64
	rateAt      time.Time
	rateGranted uint64

	bands  [numBands]bandQueue // Sheddable's stays empty
	queued int
	bytes  int64
	seq    uint64
}

// bandQueue is one band's waiters, fairly ordered across tenants.
//
// Fairness is start-time fair queueing with tags kept per tenant, not per
// request: a tenant's head waiter carries the virtual time at which it is
// due (headTag); when it is served the band's virtual time moves to that
// tag and the tenant's next head is due 1/weight later. A tenant arriving
// at an idle flow starts at the band's current virtual time, so a backlog
// earns no credit and a newcomer is served within one round. Because tags
// are not handed out at arrival, a request that times out or is cancelled
// costs its tenant nothing.
type bandQueue struct {
	flows map[string]*flow // tenants with waiters
	heap  []*flow          // the same flows, by head tag
	vtime float64          // virtual time: head tag of the last served flow
	n     int
}

// flow is one tenant's FIFO of waiters in one band.
type flow struct {
	tenant     string
	label      string // metric label
	head, tail *waiter
	n          int
	headTag    float64 // virtual time at which the head is due
	cost       float64 // 1/weight
	hidx       int     // index in bandQueue.heap
}

// tagAt is the virtual time at which the flow's k-th waiter (0 = head) is
// due if nothing changes.
func (f *flow) tagAt(k int) float64 { return f.headTag + float64(k)*f.cost }

type waiter struct {
	req        Request
	seq        uint64
	enqueued   time.Time
	flow       *flow
	prev, next *waiter
	timer      Timer
	release    Releaser
	queued     bool
}

func (g *Gate) init() {
	if g.inited {
		return
	}
	g.inited = true
	g.clock = g.Clock
	if g.clock == nil {
		g.clock = systemClock{}
	}
	g.m = g.Metrics.pool(g.Pool)
	g.setConfig(Config{})
	for b := range g.bands {
		g.bands[b].flows = map[string]*flow{}
	}
}

// SetConfig changes the Gate's knobs. New limits apply at once: if the
// queue holds more than the new bounds, the least important waiters are
// evicted. New maximum waits apply to requests that arrive afterwards.
func (g *Gate) SetConfig(c Config) {
	g.mu.Lock()
	g.init()
	g.setConfig(c)
	var rel releases
	for g.queued > g.cfg.MaxQueued || g.bytes > g.cfg.MaxQueuedBytes {
		w := g.victim(numBands, math.Inf(1))
		if w == nil {
			break
		}
		g.reject(w, ReasonEvicted, &rel)
	}
	g.mu.Unlock()
	rel.run()
}

func (g *Gate) setConfig(c Config) {
	g.cfg = c.withDefaults()
	for b := Band(0); b < numBands; b++ {
		for r := Reason(0); r < numReasons; r++ {
			g.rej[b][r] = &Rejection{Band: b, Reason: r, RetryAfter: g.cfg.RetryAfter}
		}
	}
}

// Observe reports the pool's saturation from fresh metrics and lets
// waiters in if there is headroom. Call it on every metrics update
// (Tier-1: each scrape; Tier-2: each digest).
func (g *Gate) Observe(s Saturation) { g.observe(s, false, 0) }

// Mark returns how many admitted requests have been declared visible to
// observations so far (Ticket.Seen). Take it before computing the
// saturation handed to ObserveSince.
func (g *Gate) Mark() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen
}

// ObserveSince is Observe for a saturation computed after Mark returned
// mark, by an observer that counts every request whose ticket is Seen
// (Tier-1: as pending, then in flight on its pod). The requests admitted
// but not Seen by mark (between Admit and being counted, or admitted
// since) cannot be in s, and stay counted as admitted since the
// observation; Observe would forget them, and let that many more in until
// the pod's metrics showed them.
func (g *Gate) ObserveSince(s Saturation, mark uint64) { g.observe(s, true, mark) }

func (g *Gate) observe(s Saturation, since bool, mark uint64) {
	g.mu.Lock()
	g.init()
	g.obs = s
	g.updateRate()
	g.inflight = 0
	if since {
		g.inflight = int(g.granted - min(mark, g.granted))
	}
	g.m.observe(s)
	var rel releases
	g.dispatch(&rel)
	g.mu.Unlock()
	rel.run()
}

// rateTau is the time constant over which AdmitRate smooths.
const rateTau = 2 * time.Second

// updateRate folds the admissions since the last update into rate.
func (g *Gate) updateRate() {
	now := g.clock.Now()
	if dt := now.Sub(g.rateAt); !g.rateAt.IsZero() && dt > 0 {
		recent := float64(g.granted-g.rateGranted) / dt.Seconds()
		g.rate += (1 - math.Exp(-float64(dt)/float64(rateTau))) * (recent - g.rate)
	}
	g.rateAt, g.rateGranted = now, g.granted
}

// Config returns the Gate's configuration in force, defaults filled in.
func (g *Gate) Config() Config {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	return g.cfg
}

// AdmitRate is how many requests per second the Gate has let into the
// pool lately: an exponential average over about two seconds, updated at
// each observation (Tier-1: each 50 ms scrape). Tier-1 ships it in its
// health digest; Tier-2 sizes from it the backlog it leaves to the
// cluster's Gate (tier2.Admission).
func (g *Gate) AdmitRate() float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rate
}

func (g *Gate) done() { g.finish(false) }

// finish ends one admitted request; seen when its ticket had not been
// Seen, which Done implies.
func (g *Gate) finish(seen bool) {
	g.mu.Lock()
	if seen {
		g.seen++
	}
	g.inflight--
	var rel releases
	g.dispatch(&rel)
	g.mu.Unlock()
	rel.run()
}

// headroom reports whether one more request of band b may go to the pool
// now.
func (g *Gate) headroom(b Band) bool { return g.headroomFor(Request{Band: b}) }

// headroomFor is headroom for r, which may spill.
func (g *Gate) headroomFor(r Request) bool {
	if !g.obs.Known() {
		return true
	}
	obs := g.obs
	if r.MaySpill {
		obs.Backlog = 0 // a Region with headroom beats a wait behind this pool
	}
	return obs.Value+float64(g.inflight)*obs.PerRequest < g.cfg.limit(r.Band, obs)
}

// Limit is the saturation below which a pool observed at s has headroom
// for a request of band b under c: 1 for Critical, 1 − CriticalReserve
// for the others, plus s.Backlog for all but Sheddable.
func (c Config) Limit(b Band, s Saturation) float64 {
	return c.withDefaults().limit(b, s)
}

func (c Config) limit(b Band, s Saturation) float64 {
	limit := 1.0
	if b < Critical {
		limit -= c.CriticalReserve
	}
	if b > Sheddable && s.Backlog > 0 {
		limit += s.Backlog
	}
	return limit
}

// Len returns the number of waiting requests.
func (g *Gate) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.queued
}

// Admit decides on r: it returns a Ticket at once if the pool has headroom
// and nothing more important waits; a *Rejection at once for a Sheddable
// request when the pool is saturated or blind; ErrSpill at once when
// r.MaySpill and the pool is saturated; otherwise it waits until the
// request is released (Ticket), evicted or out of time (*Rejection), or ctx
// is done (ctx.Err(), and the request leaves the queue). Only after Admit
// returns does the caller pick a pod or cluster, so the choice reflects the
// moment of release, not of arrival.
func (g *Gate) Admit(ctx context.Context, r Request) (*Ticket, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	g.mu.Lock()
	if t, err, ok := g.now(r); ok {
		return t, err
	}
	// The request waits. ready is closed once res is set.
	ready := make(chan struct{})
	var res release
	w, err := g.enqueue(r, ReleaseFunc(func(t *Ticket, err error) {
		res.t, res.err = t, err
		close(ready)
	}))
	if err != nil {
		return nil, err
	}
	select {
	case <-ready:
		return res.t, res.err
	case <-ctx.Done():
		if g.cancel(w) {
			return nil, fmt.Errorf("priority: gave up waiting for admission: %w", ctx.Err())
		}
		// Released just now: hand the capacity back.
		<-ready
		res.t.Done()
		if res.err == nil {
			res.err = fmt.Errorf("priority: gave up waiting for admission: %w", ctx.Err())
		}
		return nil, res.err
	}
}

// Submit is Admit without blocking: release is called exactly once with
// the outcome, from Submit itself when the decision is immediate, or later
// from the goroutine that frees capacity, evicts or times the request out.
// It is never called with the Gate's lock held, but must not block.
// cancel removes a still-waiting request and reports whether it did
// (release is then not called).
func (g *Gate) Submit(r Request, release func(*Ticket, error)) (cancel func() bool) {
	return g.SubmitTo(r, ReleaseFunc(release))
}

// Releaser receives a request's outcome from SubmitTo.
type Releaser interface {
	Release(*Ticket, error)
}

// ReleaseFunc is a function as a Releaser.
type ReleaseFunc func(*Ticket, error)

// Release calls f.
func (f ReleaseFunc) Release(t *Ticket, err error) { f(t, err) }

// SubmitTo is Submit with the outcome delivered to rel: a caller that
// keeps its request's state in a struct of its own passes that, and a
// request decided at once allocates nothing for its delivery.
func (g *Gate) SubmitTo(r Request, rel Releaser) (cancel func() bool) {
	g.mu.Lock()
	if t, err, ok := g.now(r); ok {
		rel.Release(t, err)
		return noCancel
	}
	w, err := g.enqueue(r, rel)
	if err != nil {
		rel.Release(nil, err)
		return noCancel
	}
	return func() bool { return g.cancel(w) }
}

// noCancel is the cancel of a request no longer waiting.
func noCancel() bool { return false }

// now decides r if it can be decided at once: admitted with headroom and
// nothing at least as important waiting (waiters exist only while there is
// no headroom), or refused (Sheddable at a saturated or blind pool), or
// told to spill. It is called with g.mu held; when ok it unlocks.
func (g *Gate) now(r Request) (t *Ticket, err error, ok bool) {
	g.init()
	b := r.Band
	switch {
	case !b.valid():
		g.mu.Unlock()
		return nil, fmt.Errorf("priority: invalid band %d", r.Band), true
	case r.Bytes < 0:
		g.mu.Unlock()
		return nil, fmt.Errorf("priority: negative request size %d", r.Bytes), true
	case g.headroomFor(r) && g.waiting(b) == 0 && (b != Sheddable || g.obs.Known()):
		g.inflight++
		g.granted++
		g.mu.Unlock()
		g.m.admitted(b, g.Tenants.label(r.Tenant), 0)
		return &Ticket{Band: b, g: g}, nil, true
	case b == Sheddable:
		reason := ReasonSaturated
		if !g.obs.Known() {
			reason = ReasonNoMetrics
		}
		rej := g.rej[b][reason]
		g.mu.Unlock()
		g.m.rejected(b, reason)
		return nil, rej, true
	case r.MaySpill:
		g.mu.Unlock()
		g.m.spill(b)
		return nil, ErrSpill, true
	}
	return nil, nil, false
}

// cancel removes w if it still waits.
func (g *Gate) cancel(w *waiter) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !w.queued {
		return false
	}
	g.remove(w)
	return true
}

// waiting counts the waiters of band b and above.
func (g *Gate) waiting(b Band) int {
	n := 0
	for x := b; x < numBands; x++ {
		n += g.bands[x].n
	}
	return n
}

// enqueue queues r, evicting less important waiters to make room. It is
// called with g.mu held and unlocks it.
func (g *Gate) enqueue(r Request, release Releaser) (*waiter, error) {
	var rel releases
	defer func() {
		g.mu.Unlock()
		rel.run()
	}()
	b := r.Band
	q := &g.bands[b]
	cost := 1 / g.Tenants.Weight(r.Tenant)
	f := q.flows[r.Tenant]
	tag := q.vtime + cost // when r would be due
	if f != nil {
		f.cost = cost // a weight change applies from the next service on
		tag = f.tagAt(f.n)
	}

	if r.Bytes > g.cfg.MaxQueuedBytes || !g.roomFor(r, tag) {
		g.m.rejected(b, ReasonQueueFull)
		return nil, g.rej[b][ReasonQueueFull]
	}
	for g.queued+1 > g.cfg.MaxQueued || g.bytes+r.Bytes > g.cfg.MaxQueuedBytes {
		g.reject(g.victim(b, tag), ReasonEvicted, &rel)
	}

	g.seq++
	w := &waiter{req: r, seq: g.seq, enqueued: g.clock.Now(), release: release, queued: true}
	if f == nil {
		f = &flow{tenant: r.Tenant, label: g.Tenants.label(r.Tenant), cost: cost, headTag: tag, hidx: -1}
		q.flows[r.Tenant] = f
	}
	w.flow = f
	if f.tail == nil {
		f.head, f.tail = w, w
		q.push(f)
	} else {
		w.prev, f.tail.next, f.tail = f.tail, w, w
	}
	f.n++
	q.n++
	g.queued++
	g.bytes += r.Bytes
	g.m.queue(b, f.label, 1)

	wait := g.cfg.StandardMaxWait
	if b == Critical {
		wait = g.cfg.CriticalMaxWait
	}
	w.timer = g.clock.AfterFunc(wait, func() { g.expire(w) })
	return w, nil
}

// roomFor reports whether r fits once every waiter it may evict is gone:
// every waiter of a lower band, and waiters of its own band due later than
// tag (the tail of a heavier tenant's backlog).
func (g *Gate) roomFor(r Request, tag float64) bool {
	n, bytes := g.queued+1, g.bytes+r.Bytes
	if n <= g.cfg.MaxQueued && bytes <= g.cfg.MaxQueuedBytes {
		return true
	}
	for b := Band(0); b <= r.Band; b++ {
		for _, f := range g.bands[b].flows {
			k := f.n - 1
			for w := f.tail; w != nil && (b < r.Band || f.tagAt(k) > tag); w = w.prev {
				n--
				bytes -= w.req.Bytes
				if n <= g.cfg.MaxQueued && bytes <= g.cfg.MaxQueuedBytes {
					return true
				}
				k--
			}
		}
	}
	return false
}

// victim picks the waiter to evict for an arrival of band b due at tag: the
// last-due waiter of the lowest band below b, else the last-due waiter of
// band b if it is due later than tag. b == numBands means any band.
func (g *Gate) victim(b Band, tag float64) *waiter {
	for x := Band(0); x < numBands && x <= b; x++ {
		var v *flow
		for _, f := range g.bands[x].flows {
			if v == nil || f.tagAt(f.n-1) > v.tagAt(v.n-1) ||
				(f.tagAt(f.n-1) == v.tagAt(v.n-1) && f.tail.seq > v.tail.seq) {
				v = f
			}
		}
		if v != nil && (x < b || v.tagAt(v.n-1) > tag) {
			return v.tail
		}
	}
	return nil
}

// dispatch releases waiters while the pool has headroom.
func (g *Gate) dispatch(rel *releases) {
	for g.queued > 0 {
		var w *waiter
		for b := Critical; b >= Standard && w == nil; b-- {
			if q := &g.bands[b]; q.n > 0 && g.headroom(b) {
				f := q.heap[0]
				w = f.head
				q.vtime = f.headTag
				f.headTag += f.cost // the next head is due one share later
			}
		}
		if w == nil {
			return // no band that waits has headroom
		}
		g.remove(w)
		g.inflight++
		g.granted++
		waited := g.clock.Now().Sub(w.enqueued)
		t := &Ticket{Band: w.req.Band, Waited: waited, g: g}
		g.m.admitted(w.req.Band, w.flow.label, waited)
		rel.add(w.release, t, nil)
	}
}

func (g *Gate) expire(w *waiter) {
	g.mu.Lock()
	var rel releases
	if w.queued {
		g.reject(w, ReasonTimeout, &rel)
	}
	g.mu.Unlock()
	rel.run()
}

func (g *Gate) reject(w *waiter, r Reason, rel *releases) {
	g.remove(w)
	g.m.rejected(w.req.Band, r)
	rel.add(w.release, nil, g.rej[w.req.Band][r])
}

// remove takes a queued waiter out of its flow and band. The flow's head
// tag is left alone: a waiter that leaves unserved does not move its
// tenant's turn.
func (g *Gate) remove(w *waiter) {
	w.queued = false
	if w.timer != nil {
		w.timer.Stop()
	}
	f := w.flow
	q := &g.bands[w.req.Band]
	wasHead := f.head == w
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		f.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		f.tail = w.prev
	}
	w.prev, w.next = nil, nil
	f.n--
	q.n--
	g.queued--
	g.bytes -= w.req.Bytes
	g.m.queue(w.req.Band, f.label, -1)
	switch {
	case f.n == 0:
		q.pop(f)
		delete(q.flows, f.tenant)
	case wasHead:
		q.fix(f)
	}
}

// releases are outcomes to deliver once the Gate's lock is released.
type releases []release

type release struct {
	to  Releaser
	t   *Ticket
	err error
}

func (r *releases) add(to Releaser, t *Ticket, err error) {
	*r = append(*r, release{to, t, err})
}

func (r releases) run() {
	for _, x := range r {
		x.to.Release(x.t, x.err)
	}
}

// The band's heap of flows, ordered by head tag, then arrival.

func (q *bandQueue) less(i, j int) bool {
	a, b := q.heap[i], q.heap[j]
	if a.headTag != b.headTag {
		return a.headTag < b.headTag
	}
	return a.head.seq < b.head.seq
}

func (q *bandQueue) swap(i, j int) {
	q.heap[i], q.heap[j] = q.heap[j], q.heap[i]
	q.heap[i].hidx = i
	q.heap[j].hidx = j
}

func (q *bandQueue) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(i, p) {
			return
		}
		q.swap(i, p)
		i = p
	}
}

func (q *bandQueue) down(i int) bool {
	i0 := i
	for {
		l := 2*i + 1
		if l >= len(q.heap) {
			break
		}
		c := l
		if r := l + 1; r < len(q.heap) && q.less(r, l) {
			c = r
		}
		if !q.less(c, i) {
			break
		}
		q.swap(i, c)
		i = c
	}
	return i > i0
}

func (q *bandQueue) push(f *flow) {
	f.hidx = len(q.heap)
	q.heap = append(q.heap, f)
	q.up(f.hidx)
}

func (q *bandQueue) pop(f *flow) {
	i, last := f.hidx, len(q.heap)-1
	if i != last {
		q.swap(i, last)
	}
	q.heap[last] = nil
	q.heap = q.heap[:last]
	f.hidx = -1
	if i != last {
		if !q.down(i) {
			q.up(i)
		}
	}
}

func (q *bandQueue) fix(f *flow) {
	if !q.down(f.hidx) {
		q.up(f.hidx)
	}
}
