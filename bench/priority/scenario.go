// Command priority measures admission by priority band at overload with
// the simulator: a pool of simulated vLLM pods on virtual time, Tier-1's
// real scheduler and saturation code, and either Meridian's priority.Gate
// or the GIE baseline (priority.GIEGate) in front, on the same arrivals in
// the same run. See docs/BENCHMARKS.md for the scenario and the results.
package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/gateway"
)

// epoch is virtual time zero on the scheduler's and the Gate's clock.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Policy names an admission policy.
type Policy string

const (
	Meridian Policy = "meridian" // priority.Gate
	GIE      Policy = "gie"      // priority.GIEGate
	None     Policy = "none"     // no admission (calibration)
)

// Tenant is one source of traffic.
type Tenant struct {
	Name string
	Band priority.Band
	// Share is the tenant's offered rate as a fraction of the pool's
	// capacity.
	Share float64
}

// Scenario is one run's inputs.
type Scenario struct {
	Policy Policy
	// Pods and Profile: the pool (all pods alike).
	Pods    int
	Profile string
	// Capacity is the pool's throughput in requests per second (measured
	// by Calibrate); the tenants' shares are fractions of it.
	Capacity float64
	Tenants  []Tenant
	// Warmup, Measure: arrivals run for Warmup+Measure; completions and
	// TTFTs count from Warmup on.
	Warmup, Measure time.Duration
	// ClientTimeout: a client gives up after this long without its
	// response (cancelling the request wherever it is).
	ClientTimeout time.Duration
	// Thresholds and Gate configure Meridian's Gate (zero: priority's
	// defaults).
	Thresholds priority.Thresholds
	Gate       priority.Config
	// Scrape is the metrics period (zero: 50 ms).
	Scrape time.Duration
	Seed   uint64
	// OnScrape, when set, sees every scrape: the pods' metrics and the
	// saturation handed to the Gate.
	OnScrape func(now time.Duration, pods []sim.Metrics, s priority.Saturation)
}

// BandResult is what happened to one band's requests that arrived in the
// measured window.
type BandResult struct {
	Offered, Served  int
	Shed             map[string]int // by reason
	ClientTimeouts   int
	TTFTP50, TTFTP99 time.Duration
	RejectWallP99    time.Duration // wall-clock time of a rejection decision, P99
	RejectVirtualMax time.Duration // arrival to 429 on the virtual clock, max
	// Samples are the served requests' arrivals and TTFTs, in completion
	// order.
	Samples             []Sample
	ttfts, rejectWall   []time.Duration
	rejectVirtualMaxRaw time.Duration
}

// Sample is one served request.
type Sample struct{ Arrival, TTFT time.Duration }

// Result is one run's outcome.
type Result struct {
	Scenario Scenario
	Bands    map[priority.Band]*BandResult
	// Served per tenant (completions in the window).
	Served map[string]int
	// Throughput is completions per second in the window.
	Throughput float64
	Wall       time.Duration
}

// Jain is Jain's fairness index of the served counts of the named tenants.
func (r *Result) Jain(tenants []string) float64 {
	var sum, sq float64
	for _, t := range tenants {
		x := float64(r.Served[t])
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 1
	}
	return sum * sum / (float64(len(tenants)) * sq)
}

// engineClock runs a Gate's timers on the simulator's virtual clock.
type engineClock struct{ e *sim.Engine }

func (c engineClock) Now() time.Time { return epoch.Add(c.e.Now()) }

func (c engineClock) AfterFunc(d time.Duration, f func()) priority.Timer {
	t := &vtimer{}
	c.e.After(d, func() {
		if !t.stopped {
			t.fired = true
			f()
		}
	})
	return t
}

type vtimer struct{ stopped, fired bool }

func (t *vtimer) Stop() bool {
	if t.stopped || t.fired {
		return false
	}
	t.stopped = true
	return true
}

// Run simulates s.
func Run(s Scenario) (*Result, error) {
	start := time.Now()
	if s.Scrape <= 0 {
		s.Scrape = 50 * time.Millisecond
	}
	prof, err := sim.LookupProfile(s.Profile)
	if err != nil {
		return nil, err
	}
	e := sim.NewEngine(s.Seed)
	pool := tier1.NewPool()
	pods := make([]*sim.Pod, s.Pods)
	eps := make([]*tier1.Endpoint, s.Pods)
	slot := map[*tier1.Endpoint]int{}
	for i := range pods {
		if pods[i], err = e.AddPod(sim.PodConfig{Name: fmt.Sprint("pod-", i), Profile: prof}); err != nil {
			return nil, err
		}
		eps[i] = pool.Add(pods[i].Name(), pods[i].Name())
		slot[eps[i]] = i
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x5eed))
	sched, err := tier1.NewScheduler(pool, config.Scheduler{Name: "bench", ModelName: pods[0].Model()}, config.DefaultPolicy(),
		tier1.Options{Rand: rng.Uint64, Fallbacks: -1})
	if err != nil {
		return nil, err
	}

	var (
		gate  *priority.Gate
		gie   *priority.GIEGate
		view  = gateway.PoolView{Pool: pool}
		thMer = s.Thresholds
		thGIE = priority.GIEThresholds()
	)
	switch s.Policy {
	case Meridian:
		gate = &priority.Gate{Pool: "bench", Clock: engineClock{e}}
		gate.SetConfig(s.Gate)
	case GIE:
		gie = &priority.GIEGate{Pool: "bench"}
	case None:
	default:
		return nil, fmt.Errorf("unknown policy %q", s.Policy)
	}
	scrape := func() {
		at := epoch.Add(e.Now())
		ms := make([]sim.Metrics, len(pods))
		for i, p := range pods {
			m := p.Metrics()
			ms[i] = m
			eps[i].SetMetrics(&tier1.Metrics{Waiting: m.Waiting, Running: m.Running, KVCacheUsage: m.KVCacheUsage,
				BlockSize: m.BlockSize, GPUBlocks: m.NumGPUBlocks, MaxLoRA: m.MaxLoRA, ScrapedAt: at})
		}
		var sat priority.Saturation
		switch {
		case gate != nil:
			sat = view.Saturation(at, thMer)
			gate.Observe(sat)
		case gie != nil:
			sat = view.Saturation(at, thGIE)
			gie.Observe(sat)
		}
		if s.OnScrape != nil {
			s.OnScrape(e.Now(), ms, sat)
		}
	}
	e.At(0, func() { scrape(); e.Every(s.Scrape, scrape) })

	res := &Result{Scenario: s, Bands: map[priority.Band]*BandResult{}, Served: map[string]int{}}
	for b := priority.Sheddable; b <= priority.Critical; b++ {
		res.Bands[b] = &BandResult{Shed: map[string]int{}}
	}
	end := s.Warmup + s.Measure
	inWindow := func(t time.Duration) bool { return t >= s.Warmup && t < end }
	completed := 0

	// dispatch picks a pod now (late binding) and sends the request.
	dispatch := func(tn *Tenant, r *sim.Request, arrival time.Duration, tk *priority.Ticket, cancelled *bool, onPod func(*sim.Pod)) {
		at := epoch.Add(e.Now())
		req := &tier1.Request{Model: pods[0].Model(), PromptTokens: r.PromptTokens}
		dst, err := sched.Schedule(req, at, nil)
		if err != nil {
			tk.Done()
			return
		}
		ep := dst[0]
		t1 := sched.Dispatch(ep, req, at)
		pod := pods[slot[ep]]
		onPod(pod)
		sent := e.Now()
		// The scheduler learns each first token when it happens, as a live
		// Tier-1 does (its prefill backlog clears then, not at the end).
		e.SubmitFirst(pod, r, func() { t1.FirstToken(e.Now() - sent) }, func(o sim.Outcome) {
			t1.Done()
			tk.Done()
			if o.Err != nil || *cancelled {
				return
			}
			br := res.Bands[tn.Band]
			if inWindow(arrival) {
				br.Served++
				br.ttfts = append(br.ttfts, o.FirstToken-arrival)
				br.Samples = append(br.Samples, Sample{arrival, o.FirstToken - arrival})
			}
			if inWindow(o.Finish) {
				res.Served[tn.Name]++
				completed++
			}
		})
	}

	for ti := range s.Tenants {
		tn := &s.Tenants[ti]
		if tn.Share <= 0 {
			continue
		}
		// Each tenant draws from its own source, so a tenant's arrivals
		// do not depend on the other tenants' rates.
		trng := rand.New(rand.NewPCG(s.Seed^uint64(ti+1)*0x9e3779b97f4a7c15, uint64(ti)))
		mean := float64(time.Second) / (tn.Share * s.Capacity)
		var arrive func()
		n := 0
		arrive = func() {
			now := e.Now()
			if now >= end {
				return
			}
			e.After(time.Duration(trng.ExpFloat64()*mean), arrive)
			n++
			r := &sim.Request{ID: fmt.Sprint(tn.Name, "-", n), PromptTokens: 256 + trng.IntN(513), OutputTokens: 64 + trng.IntN(129)}
			br := res.Bands[tn.Band]
			counted := inWindow(now)
			if counted {
				br.Offered++
			}
			var (
				cancelled bool
				pod       *sim.Pod
				cancelQ   func() bool
				finished  bool
			)
			release := func(tk *priority.Ticket, err error) {
				if err != nil {
					finished = true
					if rej, ok := err.(*priority.Rejection); ok && counted {
						br.Shed[rej.Reason.String()]++
						br.rejectVirtualMaxRaw = max(br.rejectVirtualMaxRaw, e.Now()-now)
					}
					return
				}
				dispatch(tn, r, now, tk, &cancelled, func(p *sim.Pod) { pod = p })
			}
			t0 := time.Now()
			switch {
			case gate != nil:
				cancelQ = gate.Submit(priority.Request{Tenant: tn.Name, Band: tn.Band, Bytes: int64(r.PromptTokens * sim.CharsPerToken)}, release)
			case gie != nil:
				tk, err := gie.Admit(context.Background(), priority.Request{Tenant: tn.Name, Band: tn.Band})
				release(tk, err)
			default:
				release(nil, nil)
			}
			if finished && counted {
				br.rejectWall = append(br.rejectWall, time.Since(t0))
			}
			if s.ClientTimeout > 0 && !finished {
				e.After(s.ClientTimeout, func() {
					switch {
					case cancelQ != nil && cancelQ():
					case pod != nil && e.Cancel(pod, r):
					default:
						return // answered, or rejected, in time
					}
					cancelled = true
					if counted {
						br.ClientTimeouts++
					}
				})
			}
		}
		e.At(time.Duration(trng.ExpFloat64()*mean), arrive)
	}
	e.Run()

	for _, br := range res.Bands {
		slices.Sort(br.ttfts)
		br.TTFTP50, br.TTFTP99 = quantile(br.ttfts, 0.5), quantile(br.ttfts, 0.99)
		slices.Sort(br.rejectWall)
		br.RejectWallP99 = quantile(br.rejectWall, 0.99)
		br.RejectVirtualMax = br.rejectVirtualMaxRaw
	}
	res.Throughput = float64(completed) / s.Measure.Seconds()
	res.Wall = time.Since(start)
	return res, nil
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Calibrate measures the pool's capacity in requests per second: the
// completion rate with every pod kept busy (a closed loop of 2× what the
// pods can batch), with the scenario's request sizes.
func Calibrate(pods int, profile string, seed uint64) (float64, error) {
	prof, err := sim.LookupProfile(profile)
	if err != nil {
		return 0, err
	}
	e := sim.NewEngine(seed)
	rng := rand.New(rand.NewPCG(seed, 0xca1))
	const warm, measure = 20 * time.Second, 60 * time.Second
	done := 0
	for i := 0; i < pods; i++ {
		p, err := e.AddPod(sim.PodConfig{Name: fmt.Sprint("pod-", i), Profile: prof})
		if err != nil {
			return 0, err
		}
		var send func()
		send = func() {
			if e.Now() >= warm+measure {
				return
			}
			r := &sim.Request{PromptTokens: 256 + rng.IntN(513), OutputTokens: 64 + rng.IntN(129)}
			e.Submit(p, r, func(o sim.Outcome) {
				if o.Err == nil && o.Finish >= warm && o.Finish < warm+measure {
					done++
				}
				send()
			})
		}
		for range 2 * prof.MaxNumSeqs {
			e.At(0, send)
		}
	}
	e.Run()
	return float64(done) / measure.Seconds(), nil
}
