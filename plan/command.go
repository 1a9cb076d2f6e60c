package plan

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/meridian-router/meridian/replay"
	"github.com/meridian-router/meridian/sim"
)

// Source is where the peak traffic comes from: a trace file, or a
// Prometheus server. The commands fill it from flags.
type Source struct {
	// Trace is a trace file (Mooncake .jsonl or Azure .csv); Load says
	// how it is read.
	Trace string
	Load  replay.LoadOptions
	// PeakScale multiplies the trace's rate to reach the peak; PeakRPS
	// sets the peak's request rate instead. At most one; neither means
	// the trace as recorded is the peak.
	PeakScale, PeakRPS float64
	// Prometheus, when its URL is set, replaces the trace for capacity:
	// the peak rate and length distributions come from it.
	Prometheus Prometheus
	// Span and Limit bound the synthetic workload built from Prometheus
	// figures (defaults 10 minutes, 20,000 requests).
	Span  time.Duration
	Limit int
}

// workload loads the source and returns it with the rate scale of its
// peak and a one-line description.
func (s *Source) workload(ctx context.Context, seed uint64) (*replay.Workload, float64, string, error) {
	if s.PeakScale < 0 || math.IsNaN(s.PeakScale) || s.PeakRPS < 0 || math.IsNaN(s.PeakRPS) {
		return nil, 0, "", fmt.Errorf("plan: %w: --peak-scale and --peak-rps must be positive", ErrBadInput)
	}
	if s.PeakScale > 0 && s.PeakRPS > 0 {
		return nil, 0, "", fmt.Errorf("plan: %w: give the peak as --peak-scale X or --peak-rps R, not both", ErrBadInput)
	}
	if s.Prometheus.URL != "" {
		if s.Trace != "" {
			return nil, 0, "", fmt.Errorf("plan: %w: take the peak from --trace or --from-prometheus, not both", ErrBadInput)
		}
		peak, err := s.Prometheus.Peak(ctx)
		if err != nil {
			return nil, 0, "", err
		}
		w, err := PeakWorkload(peak, s.Span, s.Limit, seed)
		if err != nil {
			return nil, 0, "", err
		}
		scale := 1.0
		if s.PeakScale > 0 {
			scale = s.PeakScale
		}
		if s.PeakRPS > 0 {
			scale = s.PeakRPS / peak.RPS
		}
		desc := fmt.Sprintf("Prometheus %s: peak %.2f req/s over %v%s, mean prompt %.0f and output %.0f tokens; %d synthetic Poisson requests",
			s.Prometheus.URL, peak.RPS, s.Prometheus.Window, poolNote(s.Prometheus.Pool), peak.Prompt.Mean(), peak.Output.Mean(), len(w.Records))
		return w, scale, desc, nil
	}
	if s.Trace == "" {
		return nil, 0, "", fmt.Errorf("plan: %w: --trace FILE or --from-prometheus URL is required", ErrBadInput)
	}
	w, err := replay.LoadTrace(s.Trace, s.Load)
	if err != nil {
		return nil, 0, "", fmt.Errorf("plan: %w: %w", ErrBadInput, err)
	}
	scale := 1.0
	if s.PeakScale > 0 {
		scale = s.PeakScale
	}
	if s.PeakRPS > 0 {
		r := w.OfferedRate(1)
		if r <= 0 {
			return nil, 0, "", fmt.Errorf("plan: %w: %s spans no time, so it has no rate to scale to --peak-rps", ErrBadInput, s.Trace)
		}
		scale = s.PeakRPS / r
	}
	desc := fmt.Sprintf("%s: %d requests over %v", baseName(s.Trace), len(w.Records), w.Span().Round(time.Second))
	return w, scale, desc, nil
}

// Invocation is one `meridian plan capacity` or `meridian plan lora`
// command line, parsed into values; Capacity and LoRA do the work, so
// tests reach everything the commands do.
type Invocation struct {
	Source Source
	// Fleet is the fleet file: pool templates and the price table.
	Fleet string
	// GPUs ("h100,a10g") are the profiles a plan may use; "" means the
	// fleet's.
	GPUs string
	// SLO is the P99 TTFT objective.
	SLO     time.Duration
	MaxPods int
	Seed    uint64
	// AdaptersFrom (LoRA only) is "trace", "zipf:N,s" or a Prometheus
	// URL; HotShare the hot set's share of requests (default 0.9).
	AdaptersFrom string
	HotShare     float64
	// Out, if set, is where the capacity plan is written as a fleet file;
	// Plot where an SVG of P99 TTFT against pods per pool is written.
	Out, Plot string
	JSON      bool
	// Progress, if set, receives one line per replay (the command sets it
	// when stderr is a terminal).
	Progress func(line string)
}

func (inv *Invocation) capacity() (Capacity, error) {
	if inv.Fleet == "" {
		return Capacity{}, fmt.Errorf("plan: %w: --fleet FILE is required (see deploy/examples/fleets)", ErrBadInput)
	}
	if inv.SLO <= 0 {
		return Capacity{}, fmt.Errorf("plan: %w: --slo-ttft-p99 must be positive, got %v", ErrBadInput, inv.SLO)
	}
	f, err := sim.LoadFleet(inv.Fleet)
	if err != nil {
		return Capacity{}, fmt.Errorf("plan: %w: %w", ErrBadInput, err)
	}
	c := Capacity{Fleet: f, SLO: inv.SLO, MaxPods: inv.MaxPods, Seed: inv.Seed}
	for _, g := range strings.Split(inv.GPUs, ",") {
		if g = strings.TrimSpace(g); g != "" {
			if _, err := sim.LookupProfile(g); err != nil {
				return Capacity{}, fmt.Errorf("plan: %w: --gpus: %w", ErrBadInput, err)
			}
			c.GPUs = append(c.GPUs, g)
		}
	}
	if inv.Progress != nil {
		n := 0
		var mu = make(chan struct{}, 1)
		c.Progress = func(t Trial) {
			mu <- struct{}{}
			n++
			inv.Progress(fmt.Sprintf("replay %d: %s: %s", n, t.Label(), verdict(t, inv.SLO)))
			<-mu
		}
	}
	return c, nil
}

// Capacity runs `meridian plan capacity`: the plan on stdout (a table, or
// JSON), the fleet file and plot if asked for.
func (inv *Invocation) Capacity(ctx context.Context, stdout io.Writer) error {
	c, err := inv.capacity()
	if err != nil {
		return err
	}
	w, scale, desc, err := inv.Source.workload(ctx, inv.Seed)
	if err != nil {
		return err
	}
	c.Scale = scale
	p, err := PlanCapacity(w, c)
	if err != nil {
		return err
	}
	if inv.Out != "" {
		if err := WriteFleetFile(inv.Out, p, desc); err != nil {
			return err
		}
	}
	if inv.Plot != "" {
		curves, err := Sweep(w, c, p, 3)
		if err != nil {
			return err
		}
		if err := writeFile(inv.Plot, func(out io.Writer) error {
			return WritePlot(out, curves, inv.SLO, fmt.Sprintf("%s; peak ×%.3g; plan %s", desc, scale, p.Plan.Label()))
		}); err != nil {
			return err
		}
	}
	if inv.JSON {
		return writeJSON(stdout, struct {
			Source string `json:"source"`
			*CapacityPlan
			WallS float64 `json:"wall_s"`
		}{desc, p, round(p.Wall.Seconds(), 2)})
	}
	return WriteCapacity(stdout, p, desc, inv.Out)
}

// LoRA runs `meridian plan lora`.
func (inv *Invocation) LoRA(ctx context.Context, stdout io.Writer) error {
	c, err := inv.capacity()
	if err != nil {
		return err
	}
	src := inv.Source
	if src.Prometheus.URL != "" {
		return fmt.Errorf("plan: %w: plan lora replays a trace (--trace); Prometheus gives the adapters' popularity with --adapters-from URL", ErrBadInput)
	}
	var shares map[string]float64
	switch from := inv.AdaptersFrom; {
	case from == "":
		return fmt.Errorf("plan: %w: --adapters-from trace|zipf:N,s|PROMETHEUS_URL is required", ErrBadInput)
	case from == "trace":
	case strings.HasPrefix(from, "zipf:"):
		n, s, err := parseZipf(strings.TrimPrefix(from, "zipf:"))
		if err != nil {
			return err
		}
		src.Load.ZipfAdapters, src.Load.ZipfS = n, s
	case strings.HasPrefix(from, "http://") || strings.HasPrefix(from, "https://"):
		pr := src.Prometheus
		pr.URL = from
		if shares, err = pr.AdapterShares(ctx); err != nil {
			return err
		}
	default:
		return fmt.Errorf("plan: %w: --adapters-from %q: want trace, zipf:N,s (e.g. zipf:40,2.3) or a Prometheus URL", ErrBadInput, from)
	}
	src.Load.Seed = inv.Seed
	w, scale, desc, err := src.workload(ctx, inv.Seed)
	if err != nil {
		return err
	}
	if shares != nil {
		AssignAdapters(w, shares, inv.Seed)
		desc += fmt.Sprintf("; adapters drawn with Tier-1's shares from %s", inv.AdaptersFrom)
	} else if inv.AdaptersFrom == "trace" && w.Adapters == nil {
		return fmt.Errorf("plan: %w: %s carries no adapter ids (neither the Mooncake nor the Azure format has them): use --adapters-from zipf:N,s or a Prometheus URL", ErrBadInput, src.Trace)
	}
	c.Scale = scale
	p, err := PlanLoRA(w, LoRA{Capacity: c, HotShare: inv.HotShare})
	if err != nil {
		return err
	}
	if w.AdapterNote != "" {
		desc += "; " + w.AdapterNote
	}
	if inv.JSON {
		return writeJSON(stdout, struct {
			Source string `json:"source"`
			*LoRAPlan
			WallS float64 `json:"wall_s"`
		}{desc, p, round(p.Wall.Seconds(), 2)})
	}
	return WriteLoRA(stdout, p, desc)
}

// parseZipf parses "N,s" (s optional, default 2.3).
func parseZipf(v string) (int, float64, error) {
	ns, ss, _ := strings.Cut(v, ",")
	n, err := strconv.Atoi(strings.TrimSpace(ns))
	if err != nil || n < 2 || n > 10000 {
		return 0, 0, fmt.Errorf("plan: %w: --adapters-from zipf:%s: want zipf:N,s with 2 ≤ N ≤ 10000 adapters", ErrBadInput, v)
	}
	s := 2.3
	if ss != "" {
		s, err = strconv.ParseFloat(strings.TrimSpace(ss), 64)
		if err != nil || !(s > 0) || math.IsInf(s, 0) {
			return 0, 0, fmt.Errorf("plan: %w: --adapters-from zipf:%s: want a Zipf exponent s > 0", ErrBadInput, v)
		}
	}
	return n, s, nil
}

// verdict is one replay in words.
func verdict(t Trial, slo time.Duration) string {
	switch {
	case t.Pods() == 0:
		return "serves nothing (misses)"
	case t.Abandoned:
		return fmt.Sprintf("misses (over 1%% of requests past %v; stopped early)", slo)
	case t.Met:
		return fmt.Sprintf("meets: P99 TTFT %s, %.2f%% within %v", fmtMS(t.P99TTFTMS), 100*t.Attainment, slo)
	}
	return fmt.Sprintf("misses: P99 TTFT %s, %.2f%% within %v, %d failed", fmtMS(t.P99TTFTMS), 100*t.Attainment, slo, t.Failed)
}

// WriteCapacity writes a capacity plan for people.
func WriteCapacity(w io.Writer, p *CapacityPlan, desc, out string) error {
	slo := time.Duration(p.SLOMS * float64(time.Millisecond))
	fmt.Fprintf(w, "# %s; peak ×%.4g = %.3f req/s; SLO: P99 TTFT ≤ %v (failures count as misses); Meridian's shipped scheduler\n",
		desc, p.Scale, p.PeakRPS, slo)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	unit := "price/h"
	if !p.Priced {
		unit = "-"
	}
	fmt.Fprintf(tw, "pool\tgpu\tpods\t%s\n", unit)
	for _, pc := range p.Plan.Pools {
		if pc.Count == 0 {
			continue
		}
		price := "-"
		if p.Priced {
			for _, fp := range p.Fleet.Pools {
				if fp.Name == pc.Pool {
					price = fmt.Sprintf("%.2f", float64(pc.Count)*priceOf(p.Fleet, fp.Profile))
				}
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", pc.Pool, pc.GPU, pc.Count, price)
	}
	total := "-"
	if p.Priced {
		total = fmt.Sprintf("%.2f", p.Plan.Cost)
	}
	fmt.Fprintf(tw, "total\t\t%d\t%s\n", p.Plan.Pods(), total)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	fmt.Fprintf(w, "replay of the plan: %s\n", verdict(p.Plan, slo))
	fmt.Fprintln(w, "minimal: with one pod fewer in each pool the replay misses the SLO:")
	for _, t := range p.OneFewer {
		fmt.Fprintf(w, "  %s: %s\n", t.Label(), verdict(t, slo))
	}
	if p.Margin.RPS > 0 {
		fmt.Fprintf(w, "margin: meets the SLO up to ×%.4g the trace's rate = %.3f req/s, %.0f%% above the peak (breaks within 3%% above that)\n",
			p.Margin.Scale, p.Margin.RPS, 100*(p.Margin.OverPeak-1))
	}
	if out != "" {
		fmt.Fprintf(w, "fleet file: %s (meridian replay --fleet %s ... replays it)\n", out, out)
	}
	fmt.Fprintf(w, "# %d replays in %.1f s\n", p.Replays, p.Wall.Seconds())
	return nil
}

func priceOf(f *sim.Fleet, gpu string) float64 {
	for k, v := range f.Prices {
		if strings.EqualFold(k, gpu) {
			return v
		}
	}
	return 0
}

// WriteLoRA writes a LoRA layout for people.
func WriteLoRA(w io.Writer, p *LoRAPlan, desc string) error {
	slo := time.Duration(p.SLOMS * float64(time.Millisecond))
	fmt.Fprintf(w, "# %s; peak ×%.4g; SLO: P99 TTFT ≤ %v; Meridian's shipped scheduler\n", desc, p.Scale, slo)
	fmt.Fprintf(w, "hot set: %d of %d adapters carry %.1f%% of adapter requests: %s\n",
		len(p.HotSet), p.Adapters, 100*p.HotShare, strings.Join(p.HotSet, ", "))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "pool\tadapters\trequests\t--max-loras\tpods")
	for _, pl := range p.Pools {
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%d\t%s\n", pl.Role, len(pl.Adapters), 100*pl.Share, pl.MaxLoRAs, pl.Plan.Plan.Label())
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "replayed\tpods\tP99 TTFT\twithin SLO\tfailed\tadapter loads\t")
	for _, r := range []struct {
		name string
		o    Outcome
	}{{"layout", p.Layout}, {fmt.Sprintf("one shared pool (--max-loras %d)", p.SharedMaxLoRAs), p.Shared}} {
		var pods []string
		for _, pc := range r.o.Pods {
			pods = append(pods, fmt.Sprintf("%d×%s", pc.Count, pc.Pool))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f%%\t%d\t%d\t\n", r.name, strings.Join(pods, " + "), fmtMS(r.o.P99TTFTMS), 100*r.o.Attainment, r.o.Failed, r.o.AdapterLoads)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	fmt.Fprintf(w, "# %d replays in %.1f s\n", p.Replays, p.Wall.Seconds())
	return nil
}

// WriteFleetFile writes the plan as a fleet file `meridian replay` reads.
func WriteFleetFile(path string, p *CapacityPlan, desc string) error {
	b, err := yaml.Marshal(p.Fleet)
	if err != nil {
		return fmt.Errorf("plan: fleet file: %w", err)
	}
	slo := time.Duration(p.SLOMS * float64(time.Millisecond))
	head := fmt.Sprintf("# Planned by `meridian plan capacity`: %s; peak ×%.4g (%.3f req/s);\n# P99 TTFT %s against an SLO of %v; meets it up to %.3f req/s.\n",
		strings.ReplaceAll(desc, "\n", " "), p.Scale, p.PeakRPS, fmtMS(p.Plan.P99TTFTMS), slo, p.Margin.RPS)
	if _, err := sim.ParseFleet(b); err != nil {
		return fmt.Errorf("plan: fleet file: %w", err)
	}
	return writeFile(path, func(w io.Writer) error {
		_, err := io.WriteString(w, head+string(b))
		return err
	})
}

func writeFile(path string, f func(io.Writer) error) error {
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if err := f(out); err != nil {
		out.Close()
		return fmt.Errorf("plan: %s: %w", path, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	return nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	return nil
}

func baseName(p string) string {
	if i := strings.LastIndexAny(p, `/\`); i >= 0 {
		return p[i+1:]
	}
	return p
}
