package plan

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/meridian-router/meridian/replay"
	"github.com/meridian-router/meridian/sim"
)

// ErrBadInput is wrapped by every error about the caller's input (flags,
// fleet, SLO), as opposed to a failure while replaying.
var ErrBadInput = errors.New("bad input")

// ErrInfeasible is wrapped when no mix within the bounds meets the SLO.
var ErrInfeasible = errors.New("no plan meets the SLO")

// Capacity is a capacity question: which pods, of which GPUs, serve a
// workload at its peak within a TTFT SLO for the least money.
type Capacity struct {
	// Fleet gives the pool of each GPU (name, model, labels, overrides,
	// adapters; its count is what the search replaces) and the price
	// table. A GPU of GPUs that no pool uses gets a pool named after it.
	Fleet *sim.Fleet
	// GPUs are the profiles the plan may use; nil means the profiles of
	// the fleet's pools. With more than one, Fleet.Prices must price each.
	GPUs []string
	// SLO is the P99 TTFT objective: at least 99% of requests get their
	// first token within it, failed requests counting as misses (as in
	// `meridian replay --goodput-slo`). Must be positive.
	SLO time.Duration
	// Scale is the rate scale at which the workload is the peak to plan
	// for: 2 plans for twice the trace's rate. Must be positive.
	Scale float64
	// MaxPods bounds each pool. Default 64.
	MaxPods int
	// Policy is the scheduler the plan replays; the zero value means
	// Meridian's shipped defaults.
	Policy replay.Policy
	// Seed seeds the replays. Equal seeds give equal plans.
	Seed uint64
	// Progress, if set, is called after every replay, possibly from
	// several goroutines at once.
	Progress func(Trial)

	// noMargin skips the margin search (the LoRA planner sizes pools only).
	noMargin bool
}

// Trial is one replay of a candidate mix.
type Trial struct {
	// Pools are the candidate's pods per pool, in the plan's pool order.
	Pools []PoolCount `json:"pools"`
	// Cost is the mix's price per hour (its pod count without prices).
	Cost float64 `json:"cost_per_hour"`
	// P99TTFTMS is the replay's P99 TTFT over completed requests, in ms.
	P99TTFTMS float64 `json:"p99_ttft_ms"`
	// Attainment is the fraction of all requests whose first token came
	// within the SLO, failures counting as misses.
	Attainment float64 `json:"slo_attainment"`
	// Failed counts requests refused or cut by a pod.
	Failed int `json:"failed"`
	// Met reports whether the replay meets the SLO.
	Met bool `json:"meets_slo"`
	// Abandoned reports that the replay stopped once more than 1% of
	// requests had missed the SLO; P99TTFTMS is then 0 (unknown, above
	// the SLO) and Attainment and Failed count only what had finished.
	Abandoned bool `json:"abandoned,omitempty"`

	result *replay.Result
}

// PoolCount is how many pods a pool of the plan has.
type PoolCount struct {
	Pool  string `json:"pool"`
	GPU   string `json:"gpu"`
	Count int    `json:"count"`
}

// Label writes the mix as "2×h100+1×a10g", pools without pods left out.
func (t *Trial) Label() string {
	var parts []string
	for _, p := range t.Pools {
		if p.Count > 0 {
			parts = append(parts, fmt.Sprintf("%d×%s", p.Count, p.GPU))
		}
	}
	if len(parts) == 0 {
		return "no pods"
	}
	return strings.Join(parts, "+")
}

// Pods is the mix's total pod count.
func (t *Trial) Pods() int {
	n := 0
	for _, p := range t.Pools {
		n += p.Count
	}
	return n
}

// CapacityPlan is the answer to a Capacity question.
type CapacityPlan struct {
	// Plan is the cheapest mix found that meets the SLO, and its replay.
	Plan Trial `json:"plan"`
	// OneFewer are the replays of the plan with one pod fewer in each of
	// its pools: every one misses the SLO, which is what makes the plan
	// minimal.
	OneFewer []Trial `json:"one_fewer"`
	// Margin is how far the plan's rate can rise before it misses.
	Margin Margin `json:"margin"`
	// Priced reports whether Cost is money (a price table) or pods.
	Priced bool `json:"priced"`
	// SLOMS and Scale restate the question; PeakRPS is the workload's
	// offered rate at Scale.
	SLOMS   float64 `json:"slo_ttft_p99_ms"`
	Scale   float64 `json:"peak_scale"`
	PeakRPS float64 `json:"peak_rps"`
	// Replays counts the replays the search ran (each distinct mix once),
	// Wall how long the whole plan took.
	Replays int           `json:"replays"`
	Wall    time.Duration `json:"-"`
	// Fleet is the plan as a fleet file: the planned pools with their
	// counts, and the price table.
	Fleet *sim.Fleet `json:"-"`
}

// Margin is the highest rate the plan meets the SLO at, found by
// replay's goodput search from the peak upwards.
type Margin struct {
	// Scale is the highest rate scale found to meet the SLO (within 3%:
	// the next step up missed); RPS the offered rate there.
	Scale float64 `json:"rate_scale"`
	RPS   float64 `json:"rps"`
	// OverPeak is RPS over the peak rate: 1.25 means 25% headroom.
	OverPeak float64 `json:"over_peak"`
}

// defaults fills in what zero means and rejects bad input.
func (c *Capacity) defaults() error {
	if c.Fleet == nil || len(c.Fleet.Pools) == 0 {
		return fmt.Errorf("plan: %w: a fleet with at least one pool is required", ErrBadInput)
	}
	if c.SLO <= 0 {
		return fmt.Errorf("plan: %w: the TTFT SLO must be positive, got %v", ErrBadInput, c.SLO)
	}
	if !(c.Scale > 0) || math.IsInf(c.Scale, 0) {
		return fmt.Errorf("plan: %w: the peak rate scale must be a positive number, got %v", ErrBadInput, c.Scale)
	}
	if c.MaxPods < 0 {
		return fmt.Errorf("plan: %w: max pods per pool must not be negative, got %d", ErrBadInput, c.MaxPods)
	}
	if c.MaxPods == 0 {
		c.MaxPods = 64
	}
	if c.Policy.Kind == "" {
		p, err := replay.ParsePolicy(replay.Meridian, nil)
		if err != nil {
			return err
		}
		c.Policy = p
	}
	return nil
}

// gpuPool is one GPU the plan may use: the pool its pods go in and their
// price.
type gpuPool struct {
	gpu   string
	pool  sim.FleetPool
	price float64
}

// pools resolves the GPUs into pool templates, most expensive first.
func (c *Capacity) pools() ([]gpuPool, bool, error) {
	gpus := c.GPUs
	if len(gpus) == 0 {
		for _, p := range c.Fleet.Pools {
			gpus = append(gpus, p.Profile)
		}
	}
	prices := map[string]float64{}
	for name, v := range c.Fleet.Prices {
		prices[strings.ToLower(name)] = v
	}
	var out []gpuPool
	seen := map[string]bool{}
	for _, g := range gpus {
		g = strings.ToLower(strings.TrimSpace(g))
		if g == "" {
			continue
		}
		if _, err := sim.LookupProfile(g); err != nil {
			return nil, false, fmt.Errorf("plan: %w: --gpus: %w", ErrBadInput, err)
		}
		if seen[g] {
			continue
		}
		seen[g] = true
		gp := gpuPool{gpu: g, pool: sim.FleetPool{Name: g, Profile: g}}
		for _, p := range c.Fleet.Pools {
			if strings.EqualFold(p.Profile, g) {
				gp.pool = p
				gp.pool.Profile = g
				break
			}
		}
		out = append(out, gp)
	}
	if len(out) == 0 {
		return nil, false, fmt.Errorf("plan: %w: no GPU to plan with (--gpus is empty)", ErrBadInput)
	}
	priced := len(prices) > 0
	if len(out) > 1 || priced {
		var missing []string
		for i := range out {
			p, ok := prices[out[i].gpu]
			if !ok {
				missing = append(missing, out[i].gpu)
			}
			out[i].price = p
		}
		if len(missing) > 0 {
			why := "choosing between GPUs needs"
			if len(out) == 1 {
				why = "the fleet has a price table but it lacks"
			}
			return nil, false, fmt.Errorf("plan: %w: %s a price per pod-hour for %s: add them under prices: in the fleet file (e.g. prices: {%s: 6.88})",
				ErrBadInput, why, strings.Join(missing, ", "), missing[0])
		}
		priced = true
	} else {
		out[0].price = 1
	}
	// Pool names must stay distinct once GPUs without a pool of their own
	// are named after themselves.
	names := map[string]bool{}
	for _, g := range out {
		if names[g.pool.Name] {
			return nil, false, fmt.Errorf("plan: %w: two GPUs would share the pool name %q", ErrBadInput, g.pool.Name)
		}
		names[g.pool.Name] = true
	}
	slices.SortStableFunc(out, func(a, b gpuPool) int { return cmp.Compare(b.price, a.price) })
	return out, priced, nil
}

// search holds one plan's replays, each distinct mix run once.
type search struct {
	w      *replay.Workload
	c      *Capacity
	gpus   []gpuPool
	slo    replay.SLO
	mu     sync.Mutex
	trials map[string]*memo
	best   []int // the best plan so far; nil before one is found
}

type memo struct {
	once sync.Once
	t    *Trial
	err  error
}

func (s *search) key(counts []int) string {
	b := make([]byte, 0, 4*len(counts))
	for _, n := range counts {
		b = strconv.AppendInt(b, int64(n), 10)
		b = append(b, ',')
	}
	return string(b)
}

// fleet is the mix as a fleet: pools with pods, then the price table.
func (s *search) fleet(counts []int) *sim.Fleet {
	f := &sim.Fleet{Prices: s.c.Fleet.Prices}
	for i, g := range s.gpus {
		if counts[i] > 0 {
			p := g.pool
			p.Count = counts[i]
			f.Pools = append(f.Pools, p)
		}
	}
	return f
}

func (s *search) cost(counts []int) float64 {
	c := 0.0
	for i, n := range counts {
		c += float64(n) * s.gpus[i].price
	}
	return c
}

// try replays the mix once (later calls return the same trial). A mix
// without pods misses the SLO without a replay.
func (s *search) try(counts []int) (*Trial, error) {
	k := s.key(counts)
	s.mu.Lock()
	m := s.trials[k]
	if m == nil {
		m = &memo{}
		s.trials[k] = m
	}
	s.mu.Unlock()
	m.once.Do(func() { m.t, m.err = s.run(slices.Clone(counts)) })
	return m.t, m.err
}

func (s *search) run(counts []int) (*Trial, error) {
	t := &Trial{Cost: round(s.cost(counts), 4)}
	for i, g := range s.gpus {
		t.Pools = append(t.Pools, PoolCount{Pool: g.pool.Name, GPU: g.gpu, Count: counts[i]})
	}
	if t.Pods() == 0 {
		// Every request fails; there is no TTFT to report.
		t.Failed = len(s.w.Records)
		return t, nil
	}
	// A run that has missed the SLO stops there: the rest of an
	// overloaded replay is its slowest part and changes nothing.
	budget := int(math.Floor((1 - sloAttainment) * float64(len(s.w.Records)) * (1 + 1e-9)))
	r, err := replay.Run(s.w, s.c.Policy, replay.Options{Fleet: s.fleet(counts), RateScale: s.c.Scale, Seed: s.c.Seed,
		Deadline: s.c.SLO, MissBudget: budget})
	if err != nil {
		return nil, fmt.Errorf("plan: replay of %s: %w", t.Label(), err)
	}
	t.result = r
	t.Met, t.Attainment = s.slo.Met(r)
	t.Attainment = round(t.Attainment, 4)
	t.Failed = r.Failed
	if t.Abandoned = r.Abandoned; !t.Abandoned {
		t.P99TTFTMS = r.TTFT.P99
	}
	if s.c.Progress != nil {
		s.c.Progress(*t)
	}
	return t, nil
}

// replays counts the replays run so far.
func (s *search) replays() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range s.trials {
		if m.t != nil && m.t.result != nil {
			n++
		}
	}
	return n
}

// PlanCapacity finds the cheapest mix of the GPUs that meets the SLO on w
// at the peak scale, checks that one pod fewer in any of its pools misses
// it, and measures how far above the peak it still holds.
//
// The search: each GPU alone is sized by doubling then bisecting its pod
// count; those sizes bound a walk over mixes, the dearer GPUs' counts
// enumerated (pruned once a partial mix costs as much as the best plan
// so far) and the cheapest GPU's count bisected for each, bounded by its
// count at the previous step (more of a faster GPU never needs more of
// the others). With two GPUs this is the staircase walk along the
// boundary between meeting and missing the SLO. When no GPU alone meets
// the SLO within MaxPods, no mix is searched and the plan is infeasible.
func PlanCapacity(w *replay.Workload, c Capacity) (*CapacityPlan, error) {
	start := time.Now()
	if err := c.defaults(); err != nil {
		return nil, err
	}
	if w == nil || len(w.Records) == 0 {
		return nil, fmt.Errorf("plan: %w: the workload has no requests", ErrBadInput)
	}
	gpus, priced, err := c.pools()
	if err != nil {
		return nil, err
	}
	s := &search{w: w, c: &c, gpus: gpus, slo: replay.SLO{TTFT: c.SLO}, trials: map[string]*memo{}}
	k := len(gpus)

	// Each GPU alone, dearest first: its size caps how many of the
	// cheaper ones are worth trying.
	alone := make([]int, k) // fewest pods of GPU i alone that meet the SLO; 0 if none within the cap
	for i := range k {
		zero := make([]int, k)
		n, err := s.fewest(i, zero, s.room(i, zero))
		if err != nil {
			return nil, err
		}
		alone[i] = n
		if n > 0 {
			zero[i] = n
			s.consider(zero)
		}
	}
	// Mixes only when some GPU alone can meet the SLO: if MaxPods of each
	// cannot, mixes of them are not searched (a bound, not a proof).
	if k > 1 && s.best != nil {
		if err := s.walk(0, make([]int, k), alone); err != nil {
			return nil, err
		}
	}
	best := s.best
	if best == nil {
		t := s.closest()
		if t == nil {
			return nil, fmt.Errorf("plan: %w within %d pods per pool", ErrInfeasible, c.MaxPods)
		}
		if t.Abandoned {
			return nil, fmt.Errorf("plan: %w within %d pods per pool: every mix tried, up to %s, had over 1%% of requests past %v or failed",
				ErrInfeasible, c.MaxPods, t.Label(), c.SLO)
		}
		return nil, fmt.Errorf("plan: %w within %d pods per pool: the closest, %s, had %.1f%% of requests within %v (%d failed)",
			ErrInfeasible, c.MaxPods, t.Label(), 100*t.Attainment, c.SLO, t.Failed)
	}

	// Minimal: one pod fewer anywhere must miss. If the replays are not
	// monotone somewhere, take the smaller mix and check again.
	var fewer []Trial
	for {
		var less [][]int
		for i := range best {
			if best[i] > 0 {
				l := slices.Clone(best)
				l[i]--
				less = append(less, l)
			}
		}
		ts := make([]*Trial, len(less))
		if err := parallel(len(less), func(j int) (err error) {
			ts[j], err = s.try(less[j])
			return err
		}); err != nil {
			return nil, err
		}
		fewer = fewer[:0]
		var cheaper []int
		for j, t := range ts {
			fewer = append(fewer, *t)
			if t.Met && cheaper == nil {
				cheaper = less[j]
			}
		}
		if cheaper == nil {
			break
		}
		best = cheaper
	}
	planned, err := s.try(best)
	if err != nil {
		return nil, err
	}
	peak := w.OfferedRate(c.Scale)
	out := &CapacityPlan{
		Plan:     *planned,
		OneFewer: slices.Clone(fewer),
		Priced:   priced,
		SLOMS:    float64(c.SLO) / float64(time.Millisecond),
		Scale:    c.Scale,
		PeakRPS:  round(peak, 3),
		Fleet:    s.fleet(best),
		Replays:  s.replays(),
	}
	if !c.noMargin {
		gp, err := replay.Goodput(w, c.Policy, replay.Options{Fleet: out.Fleet, RateScale: c.Scale, Seed: c.Seed},
			s.slo, replay.GoodputSearch{MaxScale: 64 * c.Scale})
		if err != nil {
			return nil, fmt.Errorf("plan: margin: %w", err)
		}
		if gp.GoodputRPS != nil && *gp.GoodputRPS > 0 {
			out.Margin = Margin{Scale: round(gp.RateScale, 4), RPS: *gp.GoodputRPS}
			if peak > 0 {
				out.Margin.OverPeak = round(*gp.GoodputRPS/peak, 3)
			}
		}
	}
	out.Wall = time.Since(start)
	return out, nil
}

// fewest is the fewest pods of GPU i, the others as in base, that meet
// the SLO, searched in [1, hi] by doubling then bisecting; 0 if even hi
// misses.
func (s *search) fewest(i int, base []int, hi int) (int, error) {
	if hi <= 0 {
		return 0, nil
	}
	at := func(n int) (bool, error) {
		counts := slices.Clone(base)
		counts[i] = n
		t, err := s.try(counts)
		if err != nil {
			return false, err
		}
		return t.Met, nil
	}
	lo := 0 // largest count known to miss
	n := 1
	for {
		ok, err := at(n)
		if err != nil {
			return 0, err
		}
		if ok {
			hi = n
			break
		}
		lo = n
		if n >= hi {
			return 0, nil
		}
		n = min(2*n, hi)
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		ok, err := at(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}

// walk enumerates the count of GPU i (0 up to its count alone, while the
// partial mix costs less than the best plan), recursing over the cheaper
// GPUs; the last, cheapest GPU's count is the fewest that meets the SLO,
// at most its count at the previous step and what the best plan leaves.
func (s *search) walk(i int, counts, alone []int) error {
	last := len(counts) - 1
	if i == last {
		return nil
	}
	limit := alone[i]
	if limit == 0 {
		limit = s.c.MaxPods
	}
	prevLast := s.c.MaxPods
	if alone[last] > 0 {
		prevLast = alone[last]
	}
	for n := 0; n <= limit; n++ {
		counts[i] = n
		clear(counts[i+1:])
		if s.best != nil && n > 0 && s.cost(counts) >= s.cost(s.best) {
			break
		}
		if i+1 < last {
			if err := s.walk(i+1, counts, alone); err != nil {
				return err
			}
			continue
		}
		base := slices.Clone(counts)
		if sum(base) > 0 {
			// None of the cheapest GPU may already do.
			t, err := s.try(base)
			if err != nil {
				return err
			}
			if t.Met {
				s.consider(base)
				break
			}
		}
		m, err := s.fewest(last, base, min(prevLast, s.room(last, base)))
		if err != nil {
			return err
		}
		if m == 0 {
			continue
		}
		prevLast = m
		base[last] = m
		s.consider(base)
	}
	clear(counts[i:])
	return nil
}

// room is the most pods of GPU i that, added to base, cost no more than
// the best plan so far (MaxPods without one).
func (s *search) room(i int, base []int) int {
	if s.best == nil {
		return s.c.MaxPods
	}
	left := s.cost(s.best) - s.cost(base)
	return min(s.c.MaxPods, int(math.Floor(left/s.gpus[i].price+1e-9)))
}

// consider keeps counts if they are a better plan than the best so far.
// Only the search's goroutine calls it.
func (s *search) consider(counts []int) {
	if s.best == nil || better(s.cost(counts), sum(counts), s.cost(s.best), sum(s.best)) {
		s.best = slices.Clone(counts)
	}
}

// closest is the replayed mix with the highest attainment, for the
// error when none meets the SLO.
func (s *search) closest() *Trial {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out *Trial
	for _, m := range s.trials {
		t := m.t
		if t == nil || t.result == nil {
			continue
		}
		// A replay that ran to the end says more than a stopped one, and
		// among stopped ones the largest mix is the closest.
		if out == nil || (out.Abandoned && !t.Abandoned) ||
			(out.Abandoned == t.Abandoned && (t.Abandoned && t.Cost > out.Cost || !t.Abandoned && t.Attainment > out.Attainment)) {
			out = t
		}
	}
	return out
}

// better orders plans: cheaper, then fewer pods.
func better(costA float64, podsA int, costB float64, podsB int) bool {
	if math.Abs(costA-costB) > 1e-9 {
		return costA < costB
	}
	return podsA < podsB
}

// sloAttainment is the share of requests that must meet the TTFT SLO
// (replay.SLO's default: P99).
const sloAttainment = 0.99

// parallel runs f(0..n-1) on up to GOMAXPROCS goroutines and returns the
// first error.
func parallel(n int, f func(i int) error) error {
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i := range n {
		g.Go(func() error { return f(i) })
	}
	return g.Wait()
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

func full(k, n int) []int {
	out := make([]int, k)
	for i := range out {
		out[i] = n
	}
	return out
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// fmtMS writes milliseconds for people: "830 ms", "2.41 s", "2m52s".
func fmtMS(v float64) string {
	if math.IsInf(v, 0) {
		return "∞"
	}
	d := time.Duration(v * float64(time.Millisecond))
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f ms", v)
}
