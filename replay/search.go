package replay

import (
	"cmp"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Compare replays w through each policy under the same options, running up
// to GOMAXPROCS replays at once, and returns the results in policy order.
func Compare(w *Workload, policies []Policy, o Options) ([]*Result, error) {
	out := make([]*Result, len(policies))
	err := parallel(len(policies), func(i int) error {
		r, err := Run(w, policies[i], o)
		out[i] = r
		return err
	})
	return out, err
}

// Sweep parses "name=v1,v2,..." and returns one Meridian policy per value,
// base's weights with that one weight changed.
func Sweep(base Policy, spec string) ([]Policy, error) {
	name, list, ok := strings.Cut(spec, "=")
	if !ok || list == "" {
		return nil, fmt.Errorf("replay: sweep %q: want weight=v1,v2,...", spec)
	}
	if base.Kind != Meridian {
		return nil, fmt.Errorf("replay: sweep varies Meridian's weights; policy %s has none", base.Name)
	}
	name = strings.TrimSpace(name)
	var out []Policy
	for _, s := range strings.Split(list, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("replay: sweep %s: want numbers ≥ 0, got %q", name, s)
		}
		p := base
		f, err := weightField(&p.Scheduler.Weights, name)
		if err != nil {
			return nil, err
		}
		*f = v
		p.Name = fmt.Sprintf("%s %s=%s", base.Name, name, strconv.FormatFloat(v, 'g', -1, 64))
		out = append(out, p)
	}
	return out, nil
}

// SortByP99 orders results by P99 TTFT, fewer failures first on a tie.
func SortByP99(rs []*Result) {
	slices.SortStableFunc(rs, func(a, b *Result) int {
		if c := cmp.Compare(a.TTFT.P99, b.TTFT.P99); c != 0 {
			return c
		}
		return cmp.Compare(a.Failed, b.Failed)
	})
}

// SLO is a TTFT objective: at least Attainment of the requests get their
// first token within TTFT, failed requests counting as misses. Attainment
// 0 means 0.99, which makes "meets the SLO" the same as "P99 TTFT ≤ TTFT
// with failures counted as infinitely slow".
type SLO struct {
	TTFT       time.Duration
	Attainment float64
}

// Met reports whether r meets the SLO, and the attainment.
func (s SLO) Met(r *Result) (bool, float64) {
	att := s.Attainment
	if att == 0 {
		att = 0.99
	}
	n, _ := slices.BinarySearch(r.TTFTs, s.TTFT+1)
	got := 0.0
	if r.Requests > 0 {
		got = float64(n) / float64(r.Requests)
	}
	return got >= att, got
}

// GoodputSearch bounds the goodput search.
type GoodputSearch struct {
	// MinScale and MaxScale bound the rate scales tried. Defaults 1/64 and
	// 64.
	MinScale, MaxScale float64
	// Precision is the ratio between the highest passing and the lowest
	// failing scale at which the search stops. Default 1.03 (3%).
	Precision float64
}

// Goodput finds, for policy p, the highest rate scale at which the replay
// meets slo, starting from o.RateScale and doubling or halving to bracket
// it, then bisecting (geometrically). It assumes that a policy meeting the
// SLO at some rate meets it at every lower rate, which holds for queueing
// but is not checked. It returns the result of the run at that scale with
// GoodputRPS set to the workload's offered rate there; when even MinScale
// misses, the result at MinScale with GoodputRPS 0.
func Goodput(w *Workload, p Policy, o Options, slo SLO, g GoodputSearch) (*Result, error) {
	o = o.withDefaults()
	if g.MinScale <= 0 {
		g.MinScale = 1.0 / 64
	}
	if g.MaxScale <= 0 {
		g.MaxScale = 64
	}
	if g.Precision <= 1 {
		g.Precision = 1.03
	}
	run := func(scale float64) (*Result, bool, error) {
		oo := o
		oo.RateScale = scale
		r, err := Run(w, p, oo)
		if err != nil {
			return nil, false, err
		}
		ok, att := slo.Met(r)
		r.SLOAttainment = att
		return r, ok, nil
	}
	var pass, fail *Result
	r, ok, err := run(o.RateScale)
	if err != nil {
		return nil, err
	}
	if ok {
		pass = r
		for pass.RateScale < g.MaxScale {
			r, ok, err := run(min(pass.RateScale*2, g.MaxScale))
			if err != nil {
				return nil, err
			}
			if !ok {
				fail = r
				break
			}
			pass = r
		}
	} else {
		fail = r
		for fail.RateScale > g.MinScale {
			r, ok, err := run(max(fail.RateScale/2, g.MinScale))
			if err != nil {
				return nil, err
			}
			if ok {
				pass = r
				break
			}
			fail = r
		}
	}
	if pass == nil {
		zero := 0.0
		fail.GoodputRPS = &zero
		return fail, nil
	}
	for fail != nil && fail.RateScale/pass.RateScale > g.Precision {
		mid := math.Sqrt(pass.RateScale * fail.RateScale)
		r, ok, err := run(mid)
		if err != nil {
			return nil, err
		}
		if ok {
			pass = r
		} else {
			fail = r
		}
	}
	gp := round(w.OfferedRate(pass.RateScale), 3)
	pass.GoodputRPS = &gp
	return pass, nil
}

// GoodputAll runs Goodput for every policy, in parallel.
func GoodputAll(w *Workload, policies []Policy, o Options, slo SLO, g GoodputSearch) ([]*Result, error) {
	out := make([]*Result, len(policies))
	err := parallel(len(policies), func(i int) error {
		r, err := Goodput(w, policies[i], o, slo, g)
		out[i] = r
		return err
	})
	return out, err
}

// parallel runs f(0..n-1) on up to GOMAXPROCS goroutines and returns the
// first error in index order.
func parallel(n int, f func(i int) error) error {
	errs := make([]error, n)
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
