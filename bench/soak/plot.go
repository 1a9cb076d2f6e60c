package main

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// writePlot draws P99 TTFT, RSS and goroutines over the soak, one panel
// each, with every fault's window shaded.
func writePlot(path string, r *Report) error {
	panels := []struct {
		label string
		value func(snapshot) float64
	}{
		{"P99 TTFT (s)", func(s snapshot) float64 { return s.P99TTFT.Seconds() }},
		{"RSS (MiB)", func(s snapshot) float64 { return float64(s.RSSBytes) / (1 << 20) }},
		{"goroutines", func(s snapshot) float64 { return float64(s.Goroutines) }},
	}
	plots := make([][]*plot.Plot, len(panels))
	for i, pn := range panels {
		p := plot.New()
		if i == 0 {
			p.Title.Text = fmt.Sprintf("meridian up soak: %d requests, %d faults", r.Requests, len(r.Faults))
		}
		p.Y.Label.Text = pn.label
		p.Y.Min = 0
		if i == len(panels)-1 {
			p.X.Label.Text = "time since start (min)"
		}
		p.Add(plotter.NewGrid())
		var top float64
		pts := make(plotter.XYs, 0, len(r.Samples))
		for _, s := range r.Samples {
			v := pn.value(s)
			top = max(top, v)
			pts = append(pts, plotter.XY{X: s.At.Minutes(), Y: v})
		}
		for _, f := range r.Faults {
			band, err := plotter.NewPolygon(plotter.XYs{
				{X: f.At.Minutes(), Y: 0}, {X: f.Until.Minutes(), Y: 0},
				{X: f.Until.Minutes(), Y: top * 1.05}, {X: f.At.Minutes(), Y: top * 1.05},
			})
			if err != nil {
				return err
			}
			band.Color = faultShade
			band.LineStyle.Width = 0
			p.Add(band)
		}
		if len(pts) > 0 {
			line, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			line.Width = vg.Points(1.5)
			p.Add(line)
		}
		plots[i] = []*plot.Plot{p}
	}
	const w, h = 8 * vg.Inch, 7 * vg.Inch
	c := vgsvg.New(w, h)
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadY: vg.Points(6)}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// faultShade marks a fault's window.
var faultShade = color.NRGBA{R: 230, G: 90, B: 60, A: 40}
