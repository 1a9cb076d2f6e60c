package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/ratelimit"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/tier2/gossip"
	"github.com/meridian-router/meridian/tier2/gossip/faultnet"
)

// Result is one run's figures. Traffic is per instance over the steady
// windows; "the largest" is the busiest instance's.
type Result struct {
	Options          options `json:"options"`
	ActiveLimitsReal int     `json:"active_limits_real"`
	ActiveTenants    int     `json:"active_tenants"`

	BytesInPerS      float64 `json:"bytes_in_per_s"`  // largest instance
	BytesOutPerS     float64 `json:"bytes_out_per_s"` // largest instance
	BytesInMeanPerS  float64 `json:"bytes_in_mean_per_s"`
	BytesOutMeanPerS float64 `json:"bytes_out_mean_per_s"`
	PacketsInPerS    float64 `json:"packets_in_per_s"`
	PacketsOutPerS   float64 `json:"packets_out_per_s"`

	// ReportBytes is one instance's rate-limit report per sync (all its
	// parts), ReportParts how many broadcasts it takes.
	ReportBytes float64 `json:"report_bytes"`
	ReportParts float64 `json:"report_parts"`
	// QueuedMax is the longest gossip broadcast queue seen on any instance.
	QueuedMax int `json:"gossip_queued_max"`
	// PeersFresh is the fraction of (instance, peer) pairs in which the
	// peer's rate-limit report is younger than StaleAfter (1 s), sampled
	// over the steady windows: below 1, shares are held, not following
	// demand.
	PeersFresh float64 `json:"ratelimit_peers_fresh"`

	SyncP50Ms          float64 `json:"sync_p50_ms"`
	SyncP99Ms          float64 `json:"sync_p99_ms"`
	CPUPerSyncMs       float64 `json:"cpu_per_sync_ms"` // process CPU ÷ syncs: everything an instance does per interval
	CPUBusy            float64 `json:"cpu_busy"`        // process CPU seconds per wall second (2 cores: at most 2)
	HeapPerInstanceMiB float64 `json:"heap_per_instance_mib"`

	DigestConvergenceP50 float64 `json:"digest_convergence_p50_s"`
	DigestConvergenceP99 float64 `json:"digest_convergence_p99_s"`
	DigestSamples        int     `json:"digest_samples"`
	DigestUnconverged    int     `json:"digest_unconverged"`

	// Ratios are admitted ÷ (limit × window) per active tenant, offered
	// 1.5× its limit, over each steady window.
	RatelimitWorstRatio float64 `json:"ratelimit_worst_ratio"` // furthest from 1
	RatelimitMinRatio   float64 `json:"ratelimit_min_ratio"`
	RatelimitMaxRatio   float64 `json:"ratelimit_max_ratio"`
	// CutMaxRatio is the largest ratio over the window that holds the cut.
	CutMaxRatio float64 `json:"ratelimit_cut_max_ratio"`

	// ReconvergenceS is how long after the cut Region rejoins until every
	// instance counts every member again, holds a digest produced after
	// the heal for every sampled pool, and has a fresh report of every
	// peer. -1: not within -reconverge-max.
	ReconvergenceS float64 `json:"reconvergence_s"`
	// MembersBackS is how long after the heal every instance counts
	// every member again; PeersFreshS until, besides, every instance
	// has a fresh report of every peer. -1: not within -reconverge-max.
	MembersBackS float64 `json:"reconvergence_members_s"`
	PeersFreshS  float64 `json:"reconvergence_peers_fresh_s"`

	Model model `json:"model"`
}

// instance is one simulated Tier-2.
type instance struct {
	name, region string
	node         *gossip.Node
	lim          *ratelimit.Limiter
	store        *regions.DigestStore
	meter        *meter

	mu          sync.Mutex
	syncs       []time.Duration
	reportBytes int
	reportParts int
}

// tenantLoad is one active tenant's limit and offered traffic.
type tenantLoad struct {
	name     string
	limit    float64 // requests per second
	models   []string
	home     int // Region index with 80% of the traffic
	admitted atomic.Int64
}

func run(ctx context.Context, o options, logw io.Writer) (*Result, error) {
	logf := func(format string, args ...any) {
		fmt.Fprintf(logw, "scale: "+format+"\n", args...)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	regionName := func(i int) string { return fmt.Sprintf("r%02d", i) }

	tenants, loads, activeLimits := buildTenants(o)
	res := &Result{Options: o, ActiveLimitsReal: activeLimits, ActiveTenants: len(loads)}
	res.Model = costModel(o, activeLimits)

	net := faultnet.NewNetwork()
	for r := range o.Regions {
		if o.Latency > 0 {
			net.Delay(faultnet.Region(regionName(r)), faultnet.Not(faultnet.Region(regionName(r))), o.Latency)
		}
	}
	if o.Loss > 0 {
		net.Drop(faultnet.Not(faultnet.Region("")), faultnet.Not(faultnet.Region("")), o.Loss)
	}
	ms := &meters{byAddr: map[string]*meter{}}
	insts := make([]*instance, o.Instances)
	var wg sync.WaitGroup
	defer func() {
		// Stop everything at once; a starved fleet may take long to
		// wind down, and the figures are taken: give it 10 s.
		cancel()
		done := make(chan struct{})
		go func() {
			wg.Wait()
			var cwg sync.WaitGroup
			for _, in := range insts {
				if in != nil && in.node != nil {
					cwg.Go(func() { _ = in.node.Close() })
				}
			}
			cwg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	}()

	start := func(i int, join []string) error {
		in := &instance{name: fmt.Sprintf("t2-%03d", i), region: regionName(i % o.Regions), meter: &meter{}}
		ft, err := net.Transport(in.name, in.region)
		if err != nil {
			return err
		}
		tr := &meteredTransport{Transport: ft, self: in.meter, all: ms}
		in.store = regions.NewDigestStore(0, nil)
		cfg := gossip.Config{Name: in.name, Region: in.region, Profile: o.Profile, Transport: tr, Join: join}
		// Node.New joins at once: register the meter first so the join's
		// push/pull is counted.
		ip, port, err := ft.FinalAdvertiseAddr("", 0)
		if err != nil {
			return err
		}
		ms.add(fmt.Sprintf("%s:%d", ip, port), in.meter)
		if in.node, err = gossip.New(cfg); err != nil {
			_ = tr.Shutdown()
			return err
		}
		// As tier2.Instance: the limiter's MaxPayload from the node, both
		// channels registered after New, digests published by key.
		rlcfg := ratelimit.DefaultConfig(in.name)
		rlcfg.SyncInterval = o.Sync
		rlcfg.MaxPayload = in.node.MaxPayload("rl/" + in.name + "/000")
		if in.lim, err = ratelimit.New(rlcfg); err != nil {
			return err
		}
		if err := in.lim.Update(tenants); err != nil {
			return err
		}
		in.node.Register(gossip.ChannelRegions, in.store)
		in.node.Register(gossip.ChannelRateLimit, in.lim)
		node := in.node
		in.store.SetPublish(func(key string, p []byte) error {
			return node.BroadcastLatest(gossip.ChannelRegions, key, p)
		})
		insts[i] = in
		return nil
	}
	t0 := time.Now()
	if err := start(0, nil); err != nil {
		return nil, err
	}
	seed := []string{insts[0].node.Addr()}
	sem := make(chan struct{}, 8)
	errs := make(chan error, o.Instances)
	var jwg sync.WaitGroup
	for i := 1; i < o.Instances; i++ {
		sem <- struct{}{}
		jwg.Go(func() {
			defer func() { <-sem }()
			// A join's dial is lost like a packet (-loss): retry as a
			// restarting Tier-2 would.
			var err error
			for range 5 {
				if err = start(i, seed); err == nil {
					return
				}
			}
			errs <- fmt.Errorf("instance %d: %w", i, err)
		})
	}
	jwg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	logf("%d instances in %d Regions joined in %v; %d tenants, %d active with %d limits under demand",
		o.Instances, o.Regions, time.Since(t0).Round(time.Millisecond), o.Tenants, len(loads), activeLimits)

	// The limiter loop of tier2.Instance.Run (tick, Sync, publish each
	// part by key), with each Sync timed.
	for _, in := range insts {
		wg.Go(func() {
			tick := time.NewTicker(o.Sync)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				t := time.Now()
				parts := in.lim.Sync()
				d := time.Since(t)
				n := 0
				for k, p := range parts {
					n += len(p)
					_ = in.node.BroadcastLatest(gossip.ChannelRateLimit, "rl/"+in.name+"/"+strconv.Itoa(k), p)
				}
				in.mu.Lock()
				in.syncs = append(in.syncs, d)
				in.reportBytes, in.reportParts = n, len(parts)
				in.mu.Unlock()
			}
		})
	}
	for i, in := range insts {
		wg.Go(func() { drive(ctx, o, i, in, loads) })
	}
	tracker := newDigestTracker(o, insts, regionName)
	wg.Go(func() { tracker.produce(ctx) })
	wg.Go(func() { tracker.sample(ctx) })

	sleep := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	logf("warming up for %v", o.Warmup)
	sleep(o.Warmup)

	// Steady windows.
	snapshot := func() []int64 {
		s := make([]int64, len(loads))
		for i, l := range loads {
			s[i] = l.admitted.Load()
		}
		return s
	}
	type traffic struct{ in, out, pin, pout uint64 }
	readMeters := func() []traffic {
		t := make([]traffic, len(insts))
		for i, in := range insts {
			t[i] = traffic{in.meter.bytesIn.Load(), in.meter.bytesOut.Load(), in.meter.pktsIn.Load(), in.meter.pktsOut.Load()}
		}
		return t
	}
	for _, in := range insts {
		in.mu.Lock()
		in.syncs = in.syncs[:0]
		in.mu.Unlock()
	}
	tracker.record(true)
	cpu0, wall0 := cpuTime(), time.Now()
	m0 := readMeters()
	res.RatelimitMinRatio, res.RatelimitMaxRatio = math.Inf(1), math.Inf(-1)
	var fresh, pairs int
	for w := range o.Windows {
		before := snapshot()
		ws := time.Now()
		for range 4 {
			if !sleep(o.Window / 4) {
				return nil, ctx.Err()
			}
			f, p := peersFresh(insts)
			fresh, pairs = fresh+f, pairs+p
			for _, in := range insts {
				res.QueuedMax = max(res.QueuedMax, in.node.Queued())
			}
		}
		secs := time.Since(ws).Seconds()
		after := snapshot()
		lo, hi := ratios(loads, before, after, secs)
		res.RatelimitMinRatio, res.RatelimitMaxRatio = min(res.RatelimitMinRatio, lo), max(res.RatelimitMaxRatio, hi)
		logf("window %d: admitted ÷ allowed per tenant %.3f … %.3f", w+1, lo, hi)
	}
	wall := time.Since(wall0).Seconds()
	m1 := readMeters()
	res.CPUBusy = (cpuTime() - cpu0).Seconds() / wall
	tracker.record(false)
	var syncs []time.Duration
	var nsyncs int
	for i, in := range insts {
		d := traffic{m1[i].in - m0[i].in, m1[i].out - m0[i].out, m1[i].pin - m0[i].pin, m1[i].pout - m0[i].pout}
		res.BytesInPerS = max(res.BytesInPerS, float64(d.in)/wall)
		res.BytesOutPerS = max(res.BytesOutPerS, float64(d.out)/wall)
		res.PacketsInPerS = max(res.PacketsInPerS, float64(d.pin)/wall)
		res.PacketsOutPerS = max(res.PacketsOutPerS, float64(d.pout)/wall)
		res.BytesInMeanPerS += float64(d.in) / wall / float64(len(insts))
		res.BytesOutMeanPerS += float64(d.out) / wall / float64(len(insts))
		in.mu.Lock()
		syncs = append(syncs, in.syncs...)
		nsyncs += len(in.syncs)
		res.ReportBytes += float64(in.reportBytes) / float64(len(insts))
		res.ReportParts += float64(in.reportParts) / float64(len(insts))
		in.mu.Unlock()
	}
	slices.Sort(syncs)
	if len(syncs) > 0 {
		res.SyncP50Ms = float64(syncs[len(syncs)/2]) / 1e6
		res.SyncP99Ms = float64(syncs[len(syncs)*99/100]) / 1e6
		res.CPUPerSyncMs = res.CPUBusy * wall * 1e3 / float64(nsyncs)
	}
	if pairs > 0 {
		res.PeersFresh = float64(fresh) / float64(pairs)
	}
	runtime.GC()
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	res.HeapPerInstanceMiB = float64(mem.HeapAlloc) / float64(len(insts)) / (1 << 20)
	res.DigestConvergenceP50, res.DigestConvergenceP99, res.DigestSamples, res.DigestUnconverged = tracker.quantiles()
	res.ReconvergenceS, res.MembersBackS, res.PeersFreshS = -1, -1, -1
	res.RatelimitWorstRatio = 1
	for _, v := range []float64{res.RatelimitMinRatio, res.RatelimitMaxRatio} {
		if math.Abs(v-1) > math.Abs(res.RatelimitWorstRatio-1) {
			res.RatelimitWorstRatio = v
		}
	}
	logf("steady: out %.1f kB/s, in %.1f kB/s (largest instance), digest P99 %.2f s, worst ratio %.3f",
		res.BytesOutPerS/1e3, res.BytesInPerS/1e3, res.DigestConvergenceP99, res.RatelimitWorstRatio)

	if o.CutFor <= 0 || o.Regions < 2 {
		return res, nil
	}
	cut := regionName(o.Regions - 1)
	logf("cutting Region %s off for %v", cut, o.CutFor)
	before := snapshot()
	cs := time.Now()
	net.Partition(faultnet.Region(cut), faultnet.Not(faultnet.Region(cut)))
	sleep(o.CutFor)
	net.Heal()
	if o.Loss > 0 {
		net.Drop(faultnet.Not(faultnet.Region("")), faultnet.Not(faultnet.Region("")), o.Loss)
	}
	healed := time.Now()
	_, res.CutMaxRatio = ratios(loads, before, snapshot(), time.Since(cs).Seconds())
	tracker.healedAt(healed)
	res.MembersBackS, res.PeersFreshS = -1, -1
	for time.Since(healed) < o.ReconvergeMax && res.ReconvergenceS < 0 {
		if !sleep(250 * time.Millisecond) {
			return nil, ctx.Err()
		}
		since := time.Since(healed).Seconds()
		if res.MembersBackS < 0 && allMembers(insts) {
			res.MembersBackS = since
		}
		if res.MembersBackS >= 0 && res.PeersFreshS < 0 {
			if f, p := peersFresh(insts); f == p {
				res.PeersFreshS = since
			}
		}
		if res.PeersFreshS >= 0 && tracker.caughtUp() {
			res.ReconvergenceS = since
		}
	}
	logf("after the heal: members back %.1f s, peer reports fresh %.1f s, digests too %.1f s (-1: not within %v)",
		res.MembersBackS, res.PeersFreshS, res.ReconvergenceS, o.ReconvergeMax)
	return res, nil
}

// buildTenants makes o.Tenants tenants, tenant i with a request limit of
// max(10, 2000/(i+1)) per second (a Zipf law over tenants), a token limit
// that never binds, and one or two models with their own request and token
// limits (twice the tenant's: they never bind either). The first tenants
// are active until their limits add up to o.ActiveLimits.
func buildTenants(o options) (map[string]*config.Tenant, []*tenantLoad, int) {
	tenants := make(map[string]*config.Tenant, o.Tenants)
	var loads []*tenantLoad
	active := 0
	sec := config.Duration(time.Second)
	for i := range o.Tenants {
		name := fmt.Sprintf("tenant-%05d", i)
		limit := max(10, 2000/int64(i+1))
		models := []string{"llama-70b"}
		if i%2 == 1 {
			models = append(models, "mistral-7b")
		}
		tl := config.TenantLimit{
			Requests: &config.Rate{Limit: limit, Per: sec},
			Tokens:   &config.Rate{Limit: limit * 1000, Per: sec},
		}
		for _, m := range models {
			tl.PerModel = append(tl.PerModel, config.ModelRate{Model: m,
				Requests: &config.Rate{Limit: 2 * limit, Per: sec}, Tokens: &config.Rate{Limit: 2000 * limit, Per: sec}})
		}
		tenants[name] = &config.Tenant{Spec: config.TenantSpec{Limits: tl}}
		if active < o.ActiveLimits {
			active += 2 + 2*len(models)
			loads = append(loads, &tenantLoad{name: name, limit: float64(limit), models: models, home: i % o.Regions})
		}
	}
	return tenants, loads, active
}

// drive offers instance i its part of every active tenant's traffic,
// 1.5× the tenant's limit in all: 80% spread over the home Region's
// instances, 20% over the others. Arrivals are evenly spaced.
func drive(ctx context.Context, o options, i int, in *instance, loads []*tenantLoad) {
	region := i % o.Regions
	perRegion := func(r int) int { // instances in Region r
		n := o.Instances / o.Regions
		if r < o.Instances%o.Regions {
			n++
		}
		return n
	}
	rates := make([]float64, len(loads))
	for k, l := range loads {
		offered := 1.5 * l.limit
		home := perRegion(l.home)
		switch {
		case o.Regions == 1:
			rates[k] = offered / float64(o.Instances)
		case l.home == region:
			rates[k] = 0.8 * offered / float64(home)
		default:
			rates[k] = 0.2 * offered / float64(o.Instances-home)
		}
	}
	acc := make([]float64, len(loads))
	var turn int
	const step = 20 * time.Millisecond
	tick := time.NewTicker(step)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			dt := now.Sub(last).Seconds()
			last = now
			for k, l := range loads {
				acc[k] += rates[k] * dt
				for ; acc[k] >= 1; acc[k]-- {
					turn++
					d := in.lim.Allow(ratelimit.Request{Tenant: l.name, Model: l.models[turn%len(l.models)], Tokens: 100})
					if d.Allowed {
						l.admitted.Add(1)
					}
				}
			}
		}
	}
}

// ratios returns the lowest and highest admitted ÷ allowed over one window.
func ratios(loads []*tenantLoad, before, after []int64, secs float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for k, l := range loads {
		r := float64(after[k]-before[k]) / (l.limit * secs)
		lo, hi = min(lo, r), max(hi, r)
	}
	return lo, hi
}

// peersFresh counts (instance, peer) pairs whose report is fresh (not held).
// An instance whose view stays locked for more than a second (a sync or a
// push/pull under way on a starved machine) counts as holding none fresh.
func peersFresh(insts []*instance) (fresh, pairs int) {
	counts := make(chan int, len(insts))
	for _, in := range insts {
		go func() {
			n := 0
			for _, p := range in.lim.Peers() {
				if p.Live && !p.Held {
					n++
				}
			}
			counts <- n
		}()
	}
	deadline := time.After(time.Second)
	for range insts {
		select {
		case n := <-counts:
			fresh += n
		case <-deadline:
			return fresh, len(insts) * (len(insts) - 1)
		}
	}
	return fresh, len(insts) * (len(insts) - 1)
}

func allMembers(insts []*instance) bool {
	for _, in := range insts {
		if in.node.NumMembers() != len(insts) {
			return false
		}
	}
	return true
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
