package main

import (
	"fmt"
	"image/color"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// writePlots draws the sweep's curves against the instance count: gossip
// bytes per instance measured and modelled, and digest convergence and
// rate-limit accuracy.
func writePlots(dir string, rs []*Result) error {
	traffic := plot.New()
	traffic.Title.Text = fmt.Sprintf("gossip per instance, %d active limits, %d pools", rs[0].ActiveLimitsReal, rs[0].Options.Clusters*rs[0].Options.PoolsPer)
	traffic.X.Label.Text = "Tier-2 instances"
	traffic.Y.Label.Text = "kB/s (log)"
	traffic.Y.Scale = plot.LogScale{}
	traffic.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	traffic.Add(plotter.NewGrid())
	series := []struct {
		name string
		v    func(*Result) float64
		c    color.RGBA
	}{
		{"measured out (largest)", func(r *Result) float64 { return r.BytesOutPerS / 1e3 }, color.RGBA{R: 200, A: 255}},
		{"measured in (largest)", func(r *Result) float64 { return r.BytesInPerS / 1e3 }, color.RGBA{B: 200, A: 255}},
		{"model: gossip cap + push/pull", func(r *Result) float64 {
			return (r.Model.GossipCapBytesPerS + r.Model.PushPullBytesPerS) / 1e3
		}, color.RGBA{G: 150, A: 255}},
		{"needed to hear every report", func(r *Result) float64 { return r.Model.NeededInBytesPerS / 1e3 }, color.RGBA{R: 120, G: 120, B: 120, A: 255}},
		{"goal: 1 Mbit/s", func(r *Result) float64 { return 125 }, color.RGBA{A: 255}},
	}
	for _, s := range series {
		if err := addLine(traffic, s.name, s.c, rs, s.v); err != nil {
			return err
		}
	}
	traffic.Legend.Top = true
	traffic.Legend.Left = true
	if err := traffic.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, "scale-traffic.png")); err != nil {
		return err
	}

	acc := plot.New()
	acc.Title.Text = "digest convergence and rate-limit accuracy"
	acc.X.Label.Text = "Tier-2 instances"
	acc.Y.Label.Text = "seconds / ratio"
	acc.Y.Min = 0
	acc.Add(plotter.NewGrid())
	for _, s := range []struct {
		name string
		v    func(*Result) float64
		c    color.RGBA
	}{
		{"digest convergence P99 (s)", func(r *Result) float64 { return r.DigestConvergenceP99 }, color.RGBA{R: 200, A: 255}},
		{"digest convergence P50 (s)", func(r *Result) float64 { return r.DigestConvergenceP50 }, color.RGBA{R: 240, G: 140, A: 255}},
		{"rate limit: worst admitted ÷ allowed", func(r *Result) float64 { return r.RatelimitWorstRatio }, color.RGBA{B: 200, A: 255}},
		{"peer reports fresh (fraction)", func(r *Result) float64 { return r.PeersFresh }, color.RGBA{G: 150, A: 255}},
	} {
		if err := addLine(acc, s.name, s.c, rs, s.v); err != nil {
			return err
		}
	}
	acc.Legend.Top = true
	return acc.Save(7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, "scale-accuracy.png"))
}

func addLine(p *plot.Plot, name string, c color.RGBA, rs []*Result, v func(*Result) float64) error {
	pts := make(plotter.XYs, len(rs))
	for i, r := range rs {
		pts[i].X, pts[i].Y = float64(r.Options.Instances), v(r)
	}
	l, s, err := plotter.NewLinePoints(pts)
	if err != nil {
		return err
	}
	l.Color, s.Color = c, c
	p.Add(l, s)
	p.Legend.Add(name, l, s)
	return nil
}
