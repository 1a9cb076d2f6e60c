package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/meridian-router/meridian/priority"
)

// Mix returns the scenario's tenants at a total load of overload × the
// pool's capacity: one Critical tenant at 0.2 of capacity whatever the
// load, five equal-weight Standard tenants of which one sends ten times
// each other's rate, and one Sheddable tenant, the non-Critical streams
// scaled together. At 3× every Standard tenant wants more than its fair
// share of what Critical leaves ((1 − 0.2) / 5 = 0.16 of capacity; the
// light ones send 0.18).
func Mix(overload float64) []Tenant {
	const critical = 0.2
	base := []Tenant{
		{"payments", priority.Critical, critical},
		{"search", priority.Standard, 1.8},
		{"docs", priority.Standard, 0.18},
		{"mail", priority.Standard, 0.18},
		{"chat", priority.Standard, 0.18},
		{"ads", priority.Standard, 0.18},
		{"batch", priority.Sheddable, 0.28},
	}
	k := (overload - critical) / (3 - critical)
	for i := range base {
		if base[i].Band != priority.Critical {
			base[i].Share *= k
		}
	}
	return base
}

// StandardTenants are the tenants Jain's index is computed over.
var StandardTenants = []string{"search", "docs", "mail", "chat", "ads"}

// Comparison is one seed's four runs: each policy at overload and
// without.
type Comparison struct {
	Seed     uint64
	Capacity float64
	Runs     map[Policy][2]*Result // [no overload, overload]
}

// Compare runs both policies at the calm and overloaded loads.
func Compare(base Scenario, calm, overload float64) (*Comparison, error) {
	c := &Comparison{Seed: base.Seed, Capacity: base.Capacity, Runs: map[Policy][2]*Result{}}
	for _, p := range []Policy{Meridian, GIE} {
		var pair [2]*Result
		for i, load := range []float64{calm, overload} {
			s := base
			s.Policy, s.Tenants = p, Mix(load)
			r, err := Run(s)
			if err != nil {
				return nil, err
			}
			pair[i] = r
		}
		c.Runs[p] = pair
	}
	return c, nil
}

func main() {
	var (
		pods     = flag.Int("pods", 4, "pods in the pool")
		profile  = flag.String("profile", "a10g", "GPU profile of the pods (sim)")
		count    = flag.Int("count", 5, "runs (seeds 1..count); medians are reported")
		measure  = flag.Duration("measure", 120*time.Second, "measured virtual time per run")
		warmup   = flag.Duration("warmup", 20*time.Second, "virtual time before measuring")
		queue    = flag.Float64("queue-threshold", 0, "Meridian's queue threshold per pod (0: the default, 5)")
		kv       = flag.Float64("kv-threshold", 0, "Meridian's KV-cache threshold (0: the default, 0.8)")
		reserve  = flag.Float64("critical-reserve", 0, "Meridian's Critical reserve (0: the default, 0.65)")
		overload = flag.Float64("overload", 3, "offered load at overload, × capacity")
		calm     = flag.Float64("calm", 0.5, "offered load without overload, × capacity")
		timeout  = flag.Duration("client-timeout", 30*time.Second, "clients give up after this long")
	)
	flag.Parse()
	if err := run(os.Stdout, *pods, *profile, *count, *measure, *warmup, priority.Thresholds{Queue: *queue, KVCache: *kv}, priority.Config{CriticalReserve: *reserve}, *overload, *calm, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "priority bench:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, pods int, profile string, count int, measure, warmup time.Duration, th priority.Thresholds, gc priority.Config, overload, calm float64, timeout time.Duration) error {
	capacity, err := Calibrate(pods, profile, 1)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "pool: %d × %s pods, capacity %.2f req/s (closed-loop calibration); load %.1f× vs %.1f×; %s measured after %s; client timeout %s; Meridian thresholds: queue %v, KV %v, Critical reserve %v\n\n",
		pods, profile, capacity, overload, calm, measure, warmup, timeout, label(th.Queue, "5"), label(th.KVCache, "0.8"), label(gc.CriticalReserve, "0.65"))
	var cs []*Comparison
	for seed := uint64(1); seed <= uint64(count); seed++ {
		c, err := Compare(Scenario{Pods: pods, Profile: profile, Capacity: capacity, Warmup: warmup, Measure: measure,
			ClientTimeout: timeout, Thresholds: th, Gate: gc, Seed: seed}, calm, overload)
		if err != nil {
			return err
		}
		cs = append(cs, c)
		for _, p := range []Policy{Meridian, GIE} {
			fmt.Fprintf(w, "seed %d %-8s %s\n", seed, p, summary(c.Runs[p]))
		}
	}
	fmt.Fprintf(w, "\nmedians over %d seeds:\n", len(cs))
	fmt.Fprintln(w, "| policy | Critical P99 TTFT calm | at overload | ratio | Critical shed / timed out | Standard Jain | Standard served (heavy / light median) | Sheddable 429 P99 wall | Sheddable shed share | throughput req/s |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, p := range []Policy{Meridian, GIE} {
		med := func(f func(*Comparison) float64) float64 {
			var xs []float64
			for _, c := range cs {
				xs = append(xs, f(c))
			}
			slices.Sort(xs)
			return xs[len(xs)/2]
		}
		calmP99 := med(func(c *Comparison) float64 { return ms(c.Runs[p][0].Bands[priority.Critical].TTFTP99) })
		hotP99 := med(func(c *Comparison) float64 { return ms(c.Runs[p][1].Bands[priority.Critical].TTFTP99) })
		ratio := med(func(c *Comparison) float64 {
			return ms(c.Runs[p][1].Bands[priority.Critical].TTFTP99) / ms(c.Runs[p][0].Bands[priority.Critical].TTFTP99)
		})
		critLost := med(func(c *Comparison) float64 {
			b := c.Runs[p][1].Bands[priority.Critical]
			return float64(total(b.Shed) + b.ClientTimeouts)
		})
		jain := med(func(c *Comparison) float64 { return c.Runs[p][1].Jain(StandardTenants) })
		heavy := med(func(c *Comparison) float64 { return float64(c.Runs[p][1].Served["search"]) })
		light := med(func(c *Comparison) float64 {
			r := c.Runs[p][1]
			xs := []float64{float64(r.Served["docs"]), float64(r.Served["mail"]), float64(r.Served["chat"]), float64(r.Served["ads"])}
			slices.Sort(xs)
			return (xs[1] + xs[2]) / 2
		})
		shedWall := med(func(c *Comparison) float64 {
			return float64(c.Runs[p][1].Bands[priority.Sheddable].RejectWallP99) / float64(time.Microsecond)
		})
		shedShare := med(func(c *Comparison) float64 {
			b := c.Runs[p][1].Bands[priority.Sheddable]
			return float64(total(b.Shed)) / float64(max(1, b.Offered))
		})
		thr := med(func(c *Comparison) float64 { return c.Runs[p][1].Throughput })
		fmt.Fprintf(w, "| %s | %.0f ms | %.0f ms | %.2f | %.0f | %.3f | %.0f / %.0f | %.1f µs | %.2f | %.2f |\n",
			p, calmP99, hotP99, ratio, critLost, jain, heavy, light, shedWall, shedShare, thr)
	}
	return nil
}

func label(v float64, def string) string {
	if v <= 0 {
		return def + " (default)"
	}
	return fmt.Sprint(v)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func summary(pair [2]*Result) string {
	calm, hot := pair[0], pair[1]
	var b strings.Builder
	c0, c1 := calm.Bands[priority.Critical], hot.Bands[priority.Critical]
	fmt.Fprintf(&b, "critical p99 %6.0f→%6.0f ms (served %d/%d, shed %v, timeouts %d) ", ms(c0.TTFTP99), ms(c1.TTFTP99), c1.Served, c1.Offered, c1.Shed, c1.ClientTimeouts)
	st := hot.Bands[priority.Standard]
	fmt.Fprintf(&b, "| standard p99 %6.0f ms served %d/%d shed %v timeouts %d jain %.3f served %v ", ms(st.TTFTP99), st.Served, st.Offered, st.Shed, st.ClientTimeouts, hot.Jain(StandardTenants), servedOf(hot))
	sh := hot.Bands[priority.Sheddable]
	fmt.Fprintf(&b, "| sheddable served %d/%d shed %v 429 wall p99 %s virtual max %s | %.2f req/s | wall %s",
		sh.Served, sh.Offered, sh.Shed, sh.RejectWallP99, sh.RejectVirtualMax, hot.Throughput, (calm.Wall + hot.Wall).Round(time.Millisecond))
	return b.String()
}

func servedOf(r *Result) []int {
	var out []int
	for _, t := range StandardTenants {
		out = append(out, r.Served[t])
	}
	return out
}
