package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Report is the JSON document `meridian replay --json` writes.
type Report struct {
	Results []*Result `json:"results"`
}

// WriteJSON writes results as {"results":[...]}, indented.
func WriteJSON(w io.Writer, rs []*Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(Report{Results: rs}); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}

// WriteTable writes results as an aligned text table.
func WriteTable(w io.Writer, rs []*Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	goodput := false
	for _, r := range rs {
		goodput = goodput || r.GoodputRPS != nil
	}
	head := "policy\t" + "rate×\t" + "requests\t" + "done\t" + "failed\t" + "TTFT p50\t" + "p90\t" + "p99\t" +
		"E2E p50\t" + "p99\t" + "req/s\t" + "out tok/s\t" + "prefix hit\t" + "queue spread\t" + "preempt\t"
	if goodput {
		head += "SLO met\t" + "goodput req/s\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%.4g\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t%.0f\t%.3f\t%d\t%d\t",
			r.Policy, r.RateScale, r.Requests, r.Completed, failed(r),
			ms(r.TTFT.P50), ms(r.TTFT.P90), ms(r.TTFT.P99), ms(r.E2E.P50), ms(r.E2E.P99),
			r.ThroughputRPS, r.OutputTokensPerS, r.PrefixHitRatio, r.QueueSpreadMax, r.Preemptions)
		if goodput {
			fmt.Fprintf(tw, "%.1f%%\t", 100*r.SLOAttainment)
			if r.GoodputRPS != nil {
				fmt.Fprintf(tw, "%.3f\t", *r.GoodputRPS)
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}

// failed is the failure count with its reasons.
func failed(r *Result) string {
	if r.Failed == 0 {
		return "0"
	}
	var parts []string
	for k, v := range r.FailedBy {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d (%s)", r.Failed, strings.Join(parts, ", "))
}

// ms formats milliseconds as a duration rounded for reading.
func ms(v float64) string {
	d := time.Duration(v * float64(time.Millisecond))
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(100 * time.Microsecond).String()
}

// WritePlot writes an SVG of each result's TTFT CDF (log time axis) to w.
func WritePlot(w io.Writer, rs []*Result, title string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "time to first token (s, log scale)"
	p.Y.Label.Text = "fraction of completed requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	p.Legend.Top = false
	p.Legend.Left = false
	for i, r := range rs {
		pts := cdf(r.TTFTs, 400)
		if len(pts) == 0 {
			continue
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("replay: plot %s: %w", r.Policy, err)
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i)
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(r.Policy, line)
	}
	wt, err := p.WriterTo(8*vg.Inch, 5*vg.Inch, "svg")
	if err != nil {
		return fmt.Errorf("replay: plot: %w", err)
	}
	if _, err := wt.WriteTo(w); err != nil {
		return fmt.Errorf("replay: plot: %w", err)
	}
	return nil
}

// cdf samples the empirical CDF of sorted durations at up to n points,
// in seconds (at least 1 ms, for the log axis).
func cdf(sorted []time.Duration, n int) plotter.XYs {
	if len(sorted) == 0 {
		return nil
	}
	step := max(1, len(sorted)/n)
	var pts plotter.XYs
	for i := 0; i < len(sorted); i += step {
		pts = append(pts, plotter.XY{X: max(sorted[i].Seconds(), 1e-3), Y: float64(i+1) / float64(len(sorted))})
	}
	if last := len(sorted) - 1; last%step != 0 {
		pts = append(pts, plotter.XY{X: max(sorted[last].Seconds(), 1e-3), Y: 1})
	}
	return pts
}
