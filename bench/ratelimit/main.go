// Command ratelimit-bench runs one workload against Meridian's global rate
// limiter and against Gubernator v2.13.0's GLOBAL behaviour, both as N
// in-process peers on loopback spread over three Regions with the same
// injected one-way latency between Regions, and prints over-admission,
// re-convergence after a demand shift and decision latency for each.
//
// Meridian's peers exchange demand over real memberlist nodes
// (tier2/gossip) whose transport delays packets between Regions
// (faultnet). Gubernator's peers talk gRPC; connections between Regions
// go through a TCP relay that delays every chunk by the same latency. Both
// decide on the caller's goroutine in the same process: Limiter.Allow and
// V1Instance.GetRateLimits.
//
// It lives in its own module so that Meridian does not depend on
// Gubernator; a replace directive points it at the main module in ../..,
// so after the main module's go.mod changes, run go mod tidy here. Run it
// from this directory: go run . -runs 5 (see -h). docs/BENCHMARKS.md has
// the figures.
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gubernator "github.com/gubernator-io/gubernator/v2"
)

// topology is who runs where and the workload they see.
type topology struct {
	regions   []string
	perRegion int
	oneWay    time.Duration // between Regions
	rate      int64         // the limit, requests per second
	demand    float64       // offered load, in units of rate
	before    []float64     // demand split over regions before the shift
	after     []float64     // and after
}

func (t topology) peers() int { return len(t.regions) * t.perRegion }

func (t topology) region(peer int) int { return peer / t.perRegion }

func (t topology) name(peer int) string {
	return fmt.Sprintf("%s-%d", t.regions[t.region(peer)], peer%t.perRegion)
}

// system is one rate limiter under test.
type system interface {
	// decide asks peer whether one request of the tenant is admitted.
	decide(peer int) bool
	close()
}

const window = 100 * time.Millisecond

// run drives the workload: warm, steady, then the shift and after.
type run struct {
	topo                 topology
	warm, steady, settle time.Duration

	start    time.Time
	shiftAt  time.Time
	shifted  atomic.Bool
	admitted [][]atomic.Int64 // [region][window]
	offered  []atomic.Int64   // [window], all Regions
	lat      [][]time.Duration
	trace    bool
	skipped  int // windows not judged for re-convergence (load generator off the workload)
}

type result struct {
	name           string
	firstOver      float64 // % over burst + rate × 1s in the first second from a fresh start
	worstWindow    float64 // % off the limit in the worst whole second, steady and from 1s after the shift
	secondsSkipped int     // seconds not judged for worstWindow (load generator off the workload)
	shiftSecond    float64 // % over the limit in the second right after the shift
	steadyOver     float64 // % over the limit in the steady phase
	afterOver      float64 // % over the limit in the phase after the shift
	reconvTotal    time.Duration
	reconvSplit    time.Duration
	p50, p99       time.Duration
	decisions      int
	steadyRegions  []int64
	offered        float64 // requests offered in the measured phases ÷ what the workload asks for
	note           string
}

func (r *run) exec(name string, sys system) result {
	t := r.topo
	total := r.warm + r.steady + r.settle
	nw := int(total/window) + 20
	r.offered = make([]atomic.Int64, nw)
	r.admitted = make([][]atomic.Int64, len(t.regions))
	for i := range r.admitted {
		r.admitted[i] = make([]atomic.Int64, nw)
	}
	r.lat = make([][]time.Duration, t.peers())
	r.shifted.Store(false)
	r.start = time.Now()
	r.shiftAt = r.start.Add(r.warm + r.steady)
	end := r.start.Add(total)

	var wg sync.WaitGroup
	for p := range t.peers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.load(sys, p, end)
		}()
	}
	wg.Wait()
	sys.close()

	res := result{name: name}
	if g, ok := sys.(*gubernatorSystem); ok {
		res.note = g.note
	}
	steadyFrom, steadyTo := r.warm, r.warm+r.steady
	res.steadyRegions = r.sum(steadyFrom, steadyTo)
	var offered int64
	for w := int(steadyFrom / window); w < int(total/window); w++ {
		offered += r.offered[w].Load()
	}
	res.offered = float64(offered) / (t.demand * float64(t.rate) * (total - steadyFrom).Seconds())
	res.steadyOver = over(res.steadyRegions, float64(t.rate)*r.steady.Seconds())
	// The tenant starts idle with its whole burst (one second's worth).
	res.firstOver = over(r.sum(0, time.Second), 2*float64(t.rate))
	res.shiftSecond = over(r.sum(steadyTo, steadyTo+time.Second), float64(t.rate))
	for from := steadyFrom; from+time.Second <= total; from += time.Second {
		if from >= steadyTo && from < steadyTo+time.Second {
			continue
		}
		// A second in which the load generator itself was more than 5%
		// off the workload (a stall of the shared machine) cannot judge
		// the limiter, as for re-convergence below.
		// So is the second after one: a stall lets the buckets fill,
		// and the catch-up rightly spends the burst.
		off := func(from time.Duration) bool {
			var offered int64
			for w := int(from / window); w < int((from+time.Second)/window); w++ {
				offered += r.offered[w].Load()
			}
			want := t.demand * float64(t.rate)
			return abs(float64(offered)-want) > 0.05*want
		}
		if off(from) || off(from-time.Second) {
			res.secondsSkipped++
			continue
		}
		if o := over(r.sum(from, from+time.Second), float64(t.rate)); abs(o) > abs(res.worstWindow) {
			res.worstWindow = o
		}
	}
	res.afterOver = over(r.sum(steadyTo, total), float64(t.rate)*r.settle.Seconds())
	res.reconvTotal, res.reconvSplit = r.reconvergence(steadyTo, total)
	if r.trace {
		fmt.Fprintf(os.Stderr, "%s: admitted per Region per 100ms from 1s before the shift\n", name)
		for w := int((steadyTo - time.Second) / window); w < int(total/window); w++ {
			fmt.Fprintf(os.Stderr, "%6.1fs", (time.Duration(w)*window - steadyTo).Seconds())
			for reg := range r.admitted {
				fmt.Fprintf(os.Stderr, " %4d", r.admitted[reg][w].Load())
			}
			fmt.Fprintf(os.Stderr, "  offered %4d\n", r.offered[w].Load())
		}
	}
	var all []time.Duration
	for _, l := range r.lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	res.decisions = len(all)
	if len(all) > 0 {
		res.p50 = all[len(all)/2]
		res.p99 = all[len(all)*99/100]
	}
	return res
}

// load offers peer its part of the demand until end, in 2ms slices.
func (r *run) load(sys system, peer int, end time.Time) {
	t := r.topo
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	var acc float64
	lat := make([]time.Duration, 0, 1<<16)
	for now := range tick.C {
		if now.After(end) {
			break
		}
		split := t.before
		if !now.Before(r.shiftAt) {
			split = t.after
		}
		perPeer := t.demand * float64(t.rate) * split[t.region(peer)] / float64(t.perRegion)
		acc += perPeer * now.Sub(last).Seconds()
		last = now
		for ; acc >= 1; acc-- {
			t0 := time.Now()
			ok := sys.decide(peer)
			d := time.Since(t0)
			lat = append(lat, d)
			w := int(t0.Sub(r.start) / window)
			if w >= len(r.offered) {
				break // a decision stalled past the end of the run
			}
			r.offered[w].Add(1)
			if ok {
				r.admitted[t.region(peer)][w].Add(1)
			}
		}
	}
	r.lat[peer] = lat
}

func (r *run) sum(from, to time.Duration) []int64 {
	out := make([]int64, len(r.admitted))
	for reg, ws := range r.admitted {
		for w := int(from / window); w < int(to/window); w++ {
			out[reg] += ws[w].Load()
		}
	}
	return out
}

func over(per []int64, want float64) float64 {
	var s int64
	for _, x := range per {
		s += x
	}
	return 100 * (float64(s) - want) / want
}

// reconvergence finds, after the shift, the first moment from which every
// sliding 500ms window up to the end admits the limit ±5% in total
// (reconvTotal), and also gives every Region its demand-proportional part
// of the limit ±5% of the limit (reconvSplit). -1 means never in this run.
// Windows where the offered load was more than 5% off are skipped.
func (r *run) reconvergence(from, to time.Duration) (total, split time.Duration) {
	t := r.topo
	const span = 5 // windows of 100ms
	want := float64(t.rate) * span * window.Seconds()
	okTotal := func(w int) bool {
		var s int64
		for reg := range r.admitted {
			for k := w - span + 1; k <= w; k++ {
				s += r.admitted[reg][k].Load()
			}
		}
		return abs(float64(s)-want) <= 0.05*want
	}
	okSplit := func(w int) bool {
		for reg := range r.admitted {
			var s int64
			for k := w - span + 1; k <= w; k++ {
				s += r.admitted[reg][k].Load()
			}
			if abs(float64(s)-want*t.after[reg]) > 0.05*want {
				return false
			}
		}
		return okTotal(w)
	}
	first := int(from/window) + span - 1 // first window that lies wholly after the shift
	last := int(to/window) - 1
	// A window in which the load generator itself fell more than 5% off
	// the workload (a stall of the shared machine, then a catch-up burst)
	// cannot judge the limiter: it neither breaks nor starts convergence.
	offered := t.demand * float64(t.rate) * span * window.Seconds()
	judged := func(w int) bool {
		var s int64
		for k := w - span + 1; k <= w; k++ {
			s += r.offered[k].Load()
		}
		return abs(float64(s)-offered) <= 0.05*offered
	}
	find := func(ok func(int) bool, count bool) time.Duration {
		at := -1
		for w := first; w <= last; w++ {
			switch {
			case !judged(w):
				if count {
					r.skipped++
				}
			case !ok(w):
				at = -1
			case at < 0:
				at = w
			}
		}
		if at < 0 {
			return -1
		}
		// The window ending at `at` is the first good one; its end is the
		// moment of convergence.
		return time.Duration(at+1)*window - from
	}
	return find(okTotal, true), find(okSplit, false)
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func parseSplit(s string) ([]float64, error) {
	var out []float64
	var sum float64
	for _, f := range strings.Split(s, "/") {
		var v float64
		if _, err := fmt.Sscan(f, &v); err != nil {
			return nil, fmt.Errorf("split %q: %w", s, err)
		}
		out = append(out, v/100)
		sum += v
	}
	if abs(sum-100) > 0.01 {
		return nil, fmt.Errorf("split %q: parts add to %v, want 100", s, sum)
	}
	return out, nil
}

func main() {
	var (
		rate      = flag.Int64("rate", 1000, "the tenant's limit, requests per second (burst: one second's worth)")
		demand    = flag.Float64("demand", 2, "offered load as a multiple of the limit")
		perRegion = flag.Int("per-region", 2, "peers per Region (three Regions: a, b, c)")
		oneWay    = flag.Duration("one-way", 40*time.Millisecond, "injected one-way latency between Regions (RTT is twice this)")
		before    = flag.String("before", "80/15/5", "demand split over Regions a/b/c before the shift, percent")
		after     = flag.String("after", "5/15/80", "demand split after the shift, percent")
		warm      = flag.Duration("warm", 5*time.Second, "warm-up before measuring")
		steady    = flag.Duration("steady", 10*time.Second, "steady phase, measured")
		settle    = flag.Duration("settle", 10*time.Second, "phase after the shift, measured")
		only      = flag.String("only", "", "run only this system: meridian or gubernator")
		gossipInt = flag.Duration("gossip-interval", 50*time.Millisecond, "Meridian: memberlist gossip interval")
		syncInt   = flag.Duration("sync", 100*time.Millisecond, "Meridian SyncInterval and Gubernator GlobalSyncWait")
		trace     = flag.Bool("trace", false, "print admissions per Region per 100ms around the shift")
		runs      = flag.Int("runs", 5, "runs per system; the table shows medians")
	)
	flag.Parse()
	b, err := parseSplit(*before)
	if err == nil {
		var a []float64
		a, err = parseSplit(*after)
		topo := topology{regions: []string{"a", "b", "c"}, perRegion: *perRegion, oneWay: *oneWay, rate: *rate, demand: *demand, before: b, after: a}
		if err == nil && (len(a) != 3 || len(b) != 3) {
			err = fmt.Errorf("splits need three parts (Regions a/b/c)")
		}
		if err == nil {
			err = benchmark(topo, *warm, *steady, *settle, *only, *gossipInt, *syncInt, *trace, max(*runs, 1))
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit-bench:", err)
		os.Exit(1)
	}
}

func benchmark(t topology, warm, steady, settle time.Duration, only string, gossipInt, syncInt time.Duration, trace bool, runs int) error {
	fmt.Printf("%d peers (%d per Region a/b/c), %v one-way between Regions, limit %d/s, demand %.1fx split %v then %v; warm %v, steady %v, after shift %v; median of %d runs, the systems taking turns\n\n",
		t.peers(), t.perRegion, t.oneWay, t.rate, t.demand, pct(t.before), pct(t.after), warm, steady, settle, runs)
	type contender struct {
		name  string
		start func() (system, error)
	}
	var cs []contender
	if only == "" || only == "meridian" {
		cs = append(cs, contender{"Meridian", func() (system, error) { return startMeridian(t, gossipInt, syncInt) }})
	}
	if only == "" || only == "gubernator" {
		for _, algo := range []gubernator.Algorithm{gubernator.Algorithm_LEAKY_BUCKET, gubernator.Algorithm_TOKEN_BUCKET} {
			cs = append(cs, contender{fmt.Sprintf("Gubernator v2.13.0 GLOBAL, %v", algo), func() (system, error) { return startGubernator(t, syncInt, algo) }})
		}
	}
	all := make([][]result, len(cs))
	for n := range runs {
		for i, c := range cs {
			sys, err := c.start()
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			r := &run{topo: t, warm: warm, steady: steady, settle: settle, trace: trace}
			res := r.exec(c.name, sys)
			fmt.Fprintf(os.Stderr, "run %d %s: offered %.3f of the workload, first second %+.1f%%, steady %+.1f%%, worst second %+.1f%% (%d seconds not judged), second after shift %+.1f%%, after %+.1f%%, re-converged %s/%s (%d windows not judged), p50 %v, p99 %v\n",
				n+1, c.name, res.offered, res.firstOver, res.steadyOver, res.worstWindow, res.secondsSkipped, res.shiftSecond, res.afterOver, conv(res.reconvTotal), conv(res.reconvSplit), r.skipped, res.p50, res.p99)
			all[i] = append(all[i], res)
		}
	}
	fmt.Printf("| system | first second (vs burst + rate) | steady | worst whole second | second after shift | %v after shift | re-converged (total ±5%%) | re-converged (split ±5%%) | decision p50 | decision p99 | admitted per Region a/b/c, steady (last run) | load offered |\n", settle)
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for i, rs := range all {
		last := rs[len(rs)-1]
		fmt.Printf("| %s | %+.1f%% | %+.1f%% %s | %+.1f%% | %+.1f%% | %+.1f%% | %s | %s | %v | %v | %v | %.3f |\n", cs[i].name,
			median(rs, func(r result) float64 { return r.firstOver }),
			median(rs, func(r result) float64 { return r.steadyOver }),
			spread(rs, func(r result) float64 { return r.steadyOver }),
			worstAbs(rs, func(r result) float64 { return r.worstWindow }),
			median(rs, func(r result) float64 { return r.shiftSecond }),
			median(rs, func(r result) float64 { return r.afterOver }),
			conv(medianDur(rs, func(r result) time.Duration { return r.reconvTotal })),
			conv(medianDur(rs, func(r result) time.Duration { return r.reconvSplit })),
			medianDur(rs, func(r result) time.Duration { return r.p50 }),
			medianDur(rs, func(r result) time.Duration { return r.p99 }),
			last.steadyRegions,
			median(rs, func(r result) float64 { return r.offered }))
	}
	for i, rs := range all {
		if note := rs[len(rs)-1].note; note != "" {
			fmt.Printf("\n%s: %s\n", cs[i].name, note)
		}
	}
	return nil
}

// spread is the range over the runs, "[lo, hi]".
func spread(rs []result, f func(result) float64) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rs {
		lo, hi = math.Min(lo, f(r)), math.Max(hi, f(r))
	}
	return fmt.Sprintf("[%+.1f, %+.1f]", lo, hi)
}

// worstAbs is the value farthest from zero over the runs.
func worstAbs(rs []result, f func(result) float64) float64 {
	var w float64
	for _, r := range rs {
		if abs(f(r)) > abs(w) {
			w = f(r)
		}
	}
	return w
}

func median(rs []result, f func(result) float64) float64 {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// medianDur is the median with "never" (negative) counted as the longest.
func medianDur(rs []result, f func(result) time.Duration) time.Duration {
	xs := make([]time.Duration, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
		if xs[i] < 0 {
			xs[i] = math.MaxInt64
		}
	}
	slices.Sort(xs)
	if m := xs[len(xs)/2]; m != math.MaxInt64 {
		return m
	}
	return -1
}

func conv(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(10 * time.Millisecond).String()
}

func pct(xs []float64) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, fmt.Sprintf("%.0f", 100*x))
	}
	return strings.Join(parts, "/")
}
