// Package health is Tier-1's pool-health feed: the PoolHealth gRPC
// service that publishes, per pool of the cluster, a compact digest of
// how loaded and how healthy it is, for Tier-2 to choose clusters by.
//
// A Publisher samples the gateway's pools every CheckInterval (50 ms by
// default, the scrape period) and publishes a digest every Interval
// (500 ms) and at once when something significant changed: the number
// of ready pods, a jump of the waiting queue, or a jump of the error
// rate. Each Watch stream gets the newest digest at once and then every
// publication; a slow subscriber skips digests rather than slowing the
// publisher (only the newest matters). Subscribe is the client Tier-2
// runs: it follows one Tier-1's feed, reconnecting with backoff.
//
// It decides nothing: headroom and saturation are computed here, once,
// so that every Tier-2 reads the same numbers, but what to do with them
// is Tier-2's business (regions, priority).
package health

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	tier1v1 "github.com/meridian-router/meridian/api/tier1/v1"
	"github.com/meridian-router/meridian/internal/loop"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/tier1/gateway"
)

// Source is what a Publisher reads: the gateway's pools.
// *gateway.Gateway is one. Pools is called from the publisher's
// goroutine and must be safe for concurrent use.
type Source interface {
	Pools() []gateway.PoolView
}

// Config configures a Publisher. Zero fields take the defaults in their
// comments.
type Config struct {
	// Region and Cluster name where the pools are; Replica names this
	// Tier-1 replica. Tier-2 keys digests by region, cluster and pool, so
	// Region and Cluster must be set.
	Region, Cluster, Replica string
	// Interval is the regular publication period. Zero means 500 ms.
	// Shorter spends Tier-2 CPU and bandwidth to react faster to slow
	// drifts; sudden changes are published at once anyway.
	Interval time.Duration
	// CheckInterval is how often the pools are sampled for a significant
	// change. Zero means 50 ms (the scrape period: sampling faster sees
	// nothing new). It is also the shortest gap between two publications.
	CheckInterval time.Duration
	// Window is the span over which TTFT quantiles and the error rate are
	// computed. Zero means 30 s.
	Window time.Duration
	// QueueJump is the change of a pool's waiting requests (summed over
	// ready pods), or of the requests waiting in its Gate, since the last
	// publication that triggers one at once.
	// Zero means 5, one pod's worth of queue at GIE's saturation
	// threshold (Thresholds.Queue).
	QueueJump int
	// ErrorJump is the change of the error rate (a fraction) that
	// triggers a publication at once. Zero means 0.05.
	ErrorJump float64
	// HotAdapters is how many adapters a digest lists as hot. Zero means
	// 5; at most 16 (Tier-2 rejects more).
	HotAdapters int
	// Thresholds turn pod load into saturation and headroom (see
	// Headroom). Zero fields take priority.DefaultThresholds: queue 5, KV
	// 0.8, metrics older than 2 s are stale.
	Thresholds priority.Thresholds
	// Registerer receives the feed's metrics (subscribers, digests
	// published by reason); nil means none.
	Registerer prometheus.Registerer
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = 500 * time.Millisecond
	}
	if c.CheckInterval <= 0 {
		c.CheckInterval = 50 * time.Millisecond
	}
	c.CheckInterval = min(c.CheckInterval, c.Interval)
	if c.Window <= 0 {
		c.Window = 30 * time.Second
	}
	if c.QueueJump <= 0 {
		c.QueueJump = 5
	}
	if c.ErrorJump <= 0 {
		c.ErrorJump = 0.05
	}
	if c.HotAdapters <= 0 {
		c.HotAdapters = 5
	}
	c.HotAdapters = min(c.HotAdapters, 16)
	d := priority.DefaultThresholds()
	if c.Thresholds.Queue <= 0 {
		c.Thresholds.Queue = d.Queue
	}
	if c.Thresholds.KVCache <= 0 {
		c.Thresholds.KVCache = d.KVCache
	}
	if c.Thresholds.StaleAfter <= 0 {
		c.Thresholds.StaleAfter = d.StaleAfter
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Publisher computes and publishes the cluster's digests, and serves them
// as the PoolHealth service.
type Publisher struct {
	src Source
	cfg Config

	mu       sync.Mutex
	latest   *tier1v1.ClusterDigest
	versions map[string]uint64 // by pool
	subs     map[chan *tier1v1.ClusterDigest]struct{}
	last     time.Time                  // of the last publication
	prefix   map[string][]prefixCounter // by pool: pod-reported counters at publications, oldest first

	subscribers prometheus.Gauge
	published   *prometheus.CounterVec

	tier1v1.UnimplementedPoolHealthServer
}

// NewPublisher returns a publisher of src's pools. Run starts it.
func NewPublisher(src Source, cfg Config) *Publisher {
	p := &Publisher{src: src, cfg: cfg.withDefaults(), versions: map[string]uint64{},
		subs: map[chan *tier1v1.ClusterDigest]struct{}{}, prefix: map[string][]prefixCounter{},
		subscribers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_tier1_health_subscribers",
			Help: "Subscribers to the pool-health feed (Tier-2 instances)."}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier1_health_digests_total",
			Help: "Cluster digests published, by reason: interval, or change (published early on a significant change)."}, []string{"reason"}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(p.subscribers, p.published)
	}
	return p
}

// Register adds the PoolHealth service to g.
func (p *Publisher) Register(g grpc.ServiceRegistrar) { tier1v1.RegisterPoolHealthServer(g, p) }

// Run publishes until ctx ends: at once, then every Interval and on
// significant changes.
func (p *Publisher) Run(ctx context.Context) {
	p.publish(time.Now())
	p.published.WithLabelValues("interval").Inc()
	loop.Every(ctx, p.cfg.CheckInterval, func() { p.Check(time.Now()) })
}

// Check samples the pools at now and publishes if the regular interval
// has passed or something changed significantly. It reports whether it
// published. Run calls it every CheckInterval.
func (p *Publisher) Check(now time.Time) bool {
	p.mu.Lock()
	due := now.Sub(p.last) >= p.cfg.Interval
	prev := p.latest
	p.mu.Unlock()
	reason := "interval"
	if !due {
		cur := p.digest(now, false)
		if !significant(prev, cur, p.cfg) {
			return false
		}
		reason = "change"
	}
	p.publish(now)
	p.published.WithLabelValues(reason).Inc()
	return true
}

// Latest returns the last published digest (nil before Run).
func (p *Publisher) Latest() *tier1v1.ClusterDigest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latest
}

func (p *Publisher) publish(now time.Time) {
	d := p.digest(now, true)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latest, p.last = d, now
	for ch := range p.subs {
		offer(ch, d)
	}
}

// offer puts d in a one-slot channel, replacing an unread older digest.
func offer(ch chan *tier1v1.ClusterDigest, d *tier1v1.ClusterDigest) {
	for {
		select {
		case ch <- d:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}

// subscribe returns a channel carrying the newest digest (the current one
// at once, if any) and a function to stop.
func (p *Publisher) subscribe() (<-chan *tier1v1.ClusterDigest, func()) {
	ch := make(chan *tier1v1.ClusterDigest, 1)
	p.mu.Lock()
	p.subs[ch] = struct{}{}
	if p.latest != nil {
		ch <- p.latest
	}
	p.mu.Unlock()
	return ch, func() {
		p.mu.Lock()
		delete(p.subs, ch)
		p.mu.Unlock()
	}
}

// Watch serves one subscriber: the newest digest at once, then each
// publication, until the subscriber leaves.
func (p *Publisher) Watch(req *tier1v1.WatchRequest, st grpc.ServerStreamingServer[tier1v1.ClusterDigest]) error {
	ch, stop := p.subscribe()
	defer stop()
	p.subscribers.Inc()
	defer p.subscribers.Dec()
	p.cfg.Logger.Debug("tier1: pool-health subscriber joined", "subscriber", req.GetSubscriber())
	for {
		select {
		case <-st.Context().Done():
			return nil
		case d := <-ch:
			if err := st.Send(d); err != nil {
				return err
			}
		}
	}
}

// digest computes the cluster's digest at now; published digests take a
// new version per pool.
func (p *Publisher) digest(now time.Time, publish bool) *tier1v1.ClusterDigest {
	cd := &tier1v1.ClusterDigest{Region: p.cfg.Region, Cluster: p.cfg.Cluster, Replica: p.cfg.Replica}
	for _, v := range p.src.Pools() {
		pd := PoolDigest(v, now, p.cfg)
		if publish {
			p.mu.Lock()
			p.versions[v.Name]++
			pd.Version = p.versions[v.Name]
			if pd.PrefixHitRatio == 0 {
				pd.PrefixHitRatio = p.podPrefixLocked(v, now)
			}
			p.mu.Unlock()
		}
		cd.Pools = append(cd.Pools, pd)
	}
	return cd
}

// prefixCounter is a pool's pod-reported prefix-cache counters at a time.
type prefixCounter struct {
	at            time.Time
	hits, queries uint64
}

// podPrefixLocked records the pool's pod-reported prefix-cache counters
// and returns their hit ratio since the oldest sample within Window (0
// without queries). Counters that went backwards (a pod restarted or left)
// restart the window.
func (p *Publisher) podPrefixLocked(v gateway.PoolView, now time.Time) float64 {
	hits, queries := v.PodPrefix()
	ring := p.prefix[v.Name]
	if n := len(ring); n > 0 && (hits < ring[n-1].hits || queries < ring[n-1].queries) {
		ring = ring[:0]
	}
	for len(ring) > 1 && now.Sub(ring[1].at) >= p.cfg.Window {
		ring = ring[1:]
	}
	ring = append(ring, prefixCounter{now, hits, queries})
	p.prefix[v.Name] = ring
	first := ring[0]
	if queries <= first.queries {
		return 0
	}
	return clamp01(float64(hits-first.hits) / float64(queries-first.queries))
}

// PoolDigest summarises one pool at now.
//
// Ready pods are endpoints marked ready with metrics no older than
// Thresholds.StaleAfter; queue, KV and running are over those. The
// prefix hit ratio is the gateway's index estimate (a Publisher falls
// back to the pods' own counters over Window when that is zero). A pod's
// queue is its scraped waiting requests plus the requests this replica
// has in flight to it beyond what the scrape showed (waiting + running),
// so a burst sent since the last scrape counts.
//
// Saturation is the gateway's (PoolView.Saturation, what Tier-1's
// admission uses): the mean over the ready pods with fresh metrics of
// max(queue/Queue, kv/KVCache), with the same queue. Headroom is the pool's spare capacity as a
// fraction of all its pods:
//
//	headroom = Σ over ready pods of (1 − min(1, max(queue/Queue, kv/KVCache))) / total pods
//
// so 1 is every pod idle, 0 every pod full, stale or unready: a pool with
// half its pods down has at most 0.5.
func PoolDigest(v gateway.PoolView, now time.Time, cfg Config) *tier1v1.PoolDigest {
	// The pool's configured thresholds (spec.schedulers[].admission) win,
	// so the digest ships the saturation the pool's Gate sees.
	pth := v.Thresholds()
	if pth.Queue > 0 {
		cfg.Thresholds.Queue = pth.Queue
	}
	if pth.KVCache > 0 {
		cfg.Thresholds.KVCache = pth.KVCache
	}
	if pth.StaleAfter > 0 {
		cfg.Thresholds.StaleAfter = pth.StaleAfter
	}
	cfg = cfg.withDefaults()
	th := cfg.Thresholds
	pd := &tier1v1.PoolDigest{Pool: v.Name, Model: v.Model, Adapters: v.Adapters, Definition: v.Definition, ProducedUnixNano: now.UnixNano()}
	served, models := map[string]bool{}, map[string]bool{}
	eps := v.Pool.Endpoints()
	pd.TotalPods = uint32(len(eps))
	var kvSum, spare float64
	hot := map[string]int{}
	first := true
	for _, ep := range eps {
		inFlight := ep.InFlight()
		pd.InFlight += uint32(max(0, inFlight))
		m := ep.Metrics()
		if !ep.Ready() || m == nil {
			continue
		}
		age := now.Sub(m.ScrapedAt)
		if age > th.StaleAfter {
			continue // counted in StalePods by Saturation
		}
		pd.ReadyPods++
		if c := ep.Capabilities(); c != nil && c.MaxModelLen > 0 {
			pd.MaxModelLen = max(pd.MaxModelLen, uint32(min(c.MaxModelLen, math.MaxUint32)))
			for _, a := range c.Adapters {
				served[a] = true
			}
			for i, m := range c.Models {
				if i < len(c.Roots) && c.Roots[i] != "" {
					m += "@" + c.Roots[i]
				}
				models[truncate(m, maxServedModelLen)] = true
			}
		}
		queue := m.Waiting + int(max(0, inFlight-int64(m.Waiting+m.Running)))
		kv := min(1, max(0, m.KVCacheUsage))
		pd.QueueTotal += uint32(queue)
		if first || uint32(queue) > pd.QueueMax {
			pd.QueueMax = uint32(queue)
		}
		if first || uint32(queue) < pd.QueueMin {
			pd.QueueMin = uint32(queue)
		}
		first = false
		kvSum += kv
		pd.KvMax = max(pd.KvMax, kv)
		pd.Running += uint32(m.Running)
		spare += 1 - min(1, max(float64(queue)/th.Queue, kv/th.KVCache))
		for _, a := range m.RunningAdapters {
			hot[a] += 2 // running weighs more than waiting: it holds a slot
		}
		for _, a := range m.WaitingAdapters {
			hot[a]++
		}
	}
	if pd.ReadyPods > 0 {
		pd.KvMean = kvSum / float64(pd.ReadyPods)
	}
	if pd.TotalPods > 0 {
		pd.Headroom = clamp01(spare / float64(pd.TotalPods))
	}
	sat := v.Saturation(now, th)
	pd.Saturation = sat.Value
	pd.FreshPods = uint32(sat.Fresh)
	pd.StalePods = uint32(sat.Stale)
	pd.GateWaiting = uint32(v.Waiting())
	pd.AdmitRate = min(v.AdmitRate(), 1e7) // a digest bounds it (regions)
	pd.GateMaxQueued = uint32(v.MaxQueued())
	p50, p99, errRate := v.TTFT(now, cfg.Window)
	pd.TtftP50Seconds, pd.TtftP99Seconds = p50.Seconds(), p99.Seconds()
	pd.ErrorRate = clamp01(errRate)
	pd.PrefixHitRatio = clamp01(v.IndexHitRatio())
	pd.HotAdapters = hottest(hot, cfg.HotAdapters)
	pd.ServedAdapters = servedAdapters(served, v.Adapters)
	pd.ServedModels = slices.Sorted(maps.Keys(models))
	pd.ServedModels = pd.ServedModels[:min(len(pd.ServedModels), maxServedAdapters)]
	return pd
}

// maxServedModelLen bounds one served model entry (regions' bound).
const maxServedModelLen = 256

// truncate cuts s to at most n bytes, at a character's start.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// maxServedAdapters bounds a digest's served adapters (regions' bound on
// a digest's adapter lists).
const maxServedAdapters = 64

// servedAdapters lists, sorted, the adapters some ready pod can serve;
// when they are more than a digest holds, those the pool is configured
// with (the ones routed to it by name).
func servedAdapters(served map[string]bool, configured []string) []string {
	out := make([]string, 0, len(served))
	for a := range served {
		if len(served) <= maxServedAdapters || slices.Contains(configured, a) {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out[:min(len(out), maxServedAdapters)]
}

func hottest(score map[string]int, n int) []string {
	names := make([]string, 0, len(score))
	for a := range score {
		names = append(names, a)
	}
	slices.SortFunc(names, func(a, b string) int {
		if c := cmp.Compare(score[b], score[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return names[:min(n, len(names))]
}

func clamp01(f float64) float64 {
	if math.IsNaN(f) {
		return 0
	}
	return min(1, max(0, f))
}

// significant reports whether cur differs from prev enough to publish
// before the regular interval: a pool appeared or went, its ready pods
// changed, its queue or the waiting in its Gate moved by QueueJump, or its
// error rate by ErrorJump.
func significant(prev, cur *tier1v1.ClusterDigest, cfg Config) bool {
	if prev == nil || len(prev.Pools) != len(cur.Pools) {
		return true
	}
	for i, c := range cur.Pools {
		o := prev.Pools[i]
		switch {
		case o.Pool != c.Pool, o.ReadyPods != c.ReadyPods, o.TotalPods != c.TotalPods,
			absDiff(o.QueueTotal, c.QueueTotal) >= cfg.QueueJump,
			absDiff(o.GateWaiting, c.GateWaiting) >= cfg.QueueJump,
			math.Abs(o.ErrorRate-c.ErrorRate) >= cfg.ErrorJump:
			return true
		}
	}
	return false
}

func absDiff(a, b uint32) int {
	if a > b {
		return int(a - b)
	}
	return int(b - a)
}
