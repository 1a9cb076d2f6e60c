package plan

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/meridian-router/meridian/replay"
	"github.com/meridian-router/meridian/sim"
)

// Curve is P99 TTFT against the pod count of one pool, the plan's other
// pools held at their planned counts.
type Curve struct {
	Pool   string  `json:"pool"`
	GPU    string  `json:"gpu"`
	Points []Point `json:"points"`
}

// Point is one replay of a Curve.
type Point struct {
	Pods int `json:"pods"`
	// P99TTFTMS is the P99 TTFT, or Clip when the replay was stopped
	// because more than 1% of requests had passed Clip.
	P99TTFTMS float64 `json:"p99_ttft_ms"`
	Clipped   bool    `json:"clipped,omitempty"`
}

// clipFactor × the SLO is where sweep replays stop: above it only "far
// too slow" matters, and the rest of an overloaded replay is slow to run.
const clipFactor = 10

// Sweep replays the plan with each pool's count from span below to span
// above its planned count (at least one pod in the fleet), for a plot.
func Sweep(w *replay.Workload, c Capacity, p *CapacityPlan, span int) ([]Curve, error) {
	if err := c.defaults(); err != nil {
		return nil, err
	}
	clip := clipFactor * c.SLO
	budget := int((1 - sloAttainment) * float64(len(w.Records)))
	var curves []Curve
	for _, pc := range p.Plan.Pools {
		if pc.Count == 0 {
			continue
		}
		cv := Curve{Pool: pc.Pool, GPU: pc.GPU}
		var counts []int
		for n := max(0, pc.Count-span); n <= pc.Count+span; n++ {
			if p.Plan.Pods()-pc.Count+n > 0 {
				counts = append(counts, n)
			}
		}
		cv.Points = make([]Point, len(counts))
		err := parallel(len(counts), func(j int) error {
			f := *p.Fleet
			f.Pools = nil
			for k, q := range p.Fleet.Pools {
				if k == indexOfPool(p.Fleet.Pools, pc.Pool) {
					q.Count = counts[j]
				}
				if q.Count > 0 {
					f.Pools = append(f.Pools, q)
				}
			}
			r, err := replay.Run(w, c.Policy, replay.Options{Fleet: &f, RateScale: c.Scale, Seed: c.Seed, Deadline: clip, MissBudget: budget})
			if err != nil {
				return fmt.Errorf("plan: sweep %s: %w", pc.Pool, err)
			}
			pt := Point{Pods: counts[j], P99TTFTMS: r.TTFT.P99}
			if r.Abandoned {
				pt.P99TTFTMS, pt.Clipped = float64(clip)/float64(time.Millisecond), true
			}
			cv.Points[j] = pt
			return nil
		})
		if err != nil {
			return nil, err
		}
		curves = append(curves, cv)
	}
	return curves, nil
}

func indexOfPool(pools []sim.FleetPool, name string) int {
	return slices.IndexFunc(pools, func(p sim.FleetPool) bool { return p.Name == name })
}

// WritePlot writes an SVG of P99 TTFT (log axis) against pods per pool,
// with the SLO as a horizontal line, in the style of replay's plots.
func WritePlot(w io.Writer, curves []Curve, slo time.Duration, title string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "pods in the pool (the plan's other pools as planned)"
	p.Y.Label.Text = fmt.Sprintf("P99 TTFT (s, log scale; replays stopped at %d× the SLO)", clipFactor)
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	xmin, xmax := 1e9, 0.0
	for i, cv := range curves {
		var pts plotter.XYs
		for _, pt := range cv.Points {
			pts = append(pts, plotter.XY{X: float64(pt.Pods), Y: max(pt.P99TTFTMS/1000, 1e-3)})
			xmin, xmax = min(xmin, float64(pt.Pods)), max(xmax, float64(pt.Pods))
		}
		sort.Slice(pts, func(a, b int) bool { return pts[a].X < pts[b].X })
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return fmt.Errorf("plan: plot %s: %w", cv.Pool, err)
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		points.Color = plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(fmt.Sprintf("pool %s (%s)", cv.Pool, cv.GPU), line, points)
	}
	if len(curves) > 0 {
		sloLine, err := plotter.NewLine(plotter.XYs{{X: xmin, Y: slo.Seconds()}, {X: xmax, Y: slo.Seconds()}})
		if err != nil {
			return fmt.Errorf("plan: plot: %w", err)
		}
		sloLine.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		sloLine.Width = vg.Points(1)
		p.Add(sloLine)
		p.Legend.Add(fmt.Sprintf("SLO %v", slo), sloLine)
	}
	wt, err := p.WriterTo(8*vg.Inch, 5*vg.Inch, "svg")
	if err != nil {
		return fmt.Errorf("plan: plot: %w", err)
	}
	if _, err := wt.WriteTo(w); err != nil {
		return fmt.Errorf("plan: plot: %w", err)
	}
	return nil
}

// AssignAdapters gives each request of w an adapter drawn with the given
// shares ("" for the base model), seeded: Prometheus knows how popular
// each adapter was, not which request named which.
func AssignAdapters(w *replay.Workload, shares map[string]float64, seed uint64) {
	names := make([]string, 0, len(shares))
	for n := range shares {
		names = append(names, n)
	}
	sort.Slice(names, func(a, b int) bool {
		if shares[names[a]] != shares[names[b]] {
			return shares[names[a]] > shares[names[b]]
		}
		return names[a] < names[b]
	})
	cdf := make([]float64, len(names))
	total := 0.0
	for i, n := range names {
		total += shares[n]
		cdf[i] = total
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	w.Adapters = make([]string, len(w.Records))
	for i := range w.Adapters {
		k := sort.SearchFloat64s(cdf, rng.Float64()*total)
		w.Adapters[i] = names[min(k, len(names)-1)]
	}
	w.AdapterNames = nil
	for _, n := range names {
		if n != "" {
			w.AdapterNames = append(w.AdapterNames, n)
		}
	}
	w.AdapterNote = fmt.Sprintf("adapters drawn per request with the %d adapters' observed shares", len(w.AdapterNames))
}
