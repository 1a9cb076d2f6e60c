// Command scale runs N Tier-2 instances' gossip and rate-limit code in one
// process and measures what grows with the fleet: gossip bytes and packets
// per instance, CPU per rate-limit sync, heap, how fast pool digests reach
// every instance, how close global rate limits stay to their rate, and how
// long the fleet takes to agree again after a Region is cut off and rejoins.
//
// Each instance is a real tier2/gossip Node (hashicorp/memberlist, LAN
// timings unless -profile says otherwise) on a faultnet transport (loopback
// UDP and TCP with per-link delay and loss), a real ratelimit.Limiter on
// channel 2 and a real regions.DigestStore on channel 1, wired as
// tier2.Instance wires them. Synthetic Tier-1s put pool digests into the
// stores of their Region's instances every -digest-interval; synthetic
// clients call Limiter.Allow at 1.5× each active tenant's request limit,
// 80% of a tenant's traffic at its home Region.
//
//	go run ./bench/scale -instances 10 -regions 5 -active-limits 2000
//	go run ./bench/scale -instances 100 -regions 20 -active-limits 2000 -json
//	go run ./bench/scale -sweep 10,30,100 -plot docs/
//
// Every count is exact; timings on a loaded machine are upper bounds
// (many instances share two cores here: see "cpu_busy" in the output).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

type options struct {
	Instances      int           `json:"instances"`
	Regions        int           `json:"regions"`
	Tenants        int           `json:"tenants"`
	ActiveLimits   int           `json:"active_limits"`
	Clusters       int           `json:"clusters"`
	PoolsPer       int           `json:"pools_per_cluster"`
	Latency        time.Duration `json:"latency_ns"`
	Loss           float64       `json:"loss"`
	Profile        string        `json:"profile"`
	Sync           time.Duration `json:"sync_ns"`
	DigestInterval time.Duration `json:"digest_interval_ns"`
	Warmup         time.Duration `json:"warmup_ns"`
	Window         time.Duration `json:"window_ns"`
	Windows        int           `json:"windows"`
	CutFor         time.Duration `json:"cut_ns"`
	ReconvergeMax  time.Duration `json:"reconverge_max_ns"`
}

func main() {
	var o options
	flag.IntVar(&o.Instances, "instances", 10, "Tier-2 instances")
	flag.IntVar(&o.Regions, "regions", 5, "Regions the instances (and clusters) are spread over, round robin")
	flag.IntVar(&o.Tenants, "tenants", 10000, "tenants, each with 4 or 6 limits (requests and tokens, overall and for 1 or 2 models)")
	flag.IntVar(&o.ActiveLimits, "active-limits", 2000, "limits under demand: the most popular tenants (Zipf) are active until their limits add up to this")
	flag.IntVar(&o.Clusters, "clusters", 500, "clusters, spread over the Regions")
	flag.IntVar(&o.PoolsPer, "pools", 4, "pools per cluster")
	flag.DurationVar(&o.Latency, "latency", 150*time.Millisecond, "one-way delay between Regions")
	flag.Float64Var(&o.Loss, "loss", 0.01, "fraction of gossip packets lost on every link")
	flag.StringVar(&o.Profile, "profile", "lan", "gossip profile: lan, wan or local")
	flag.DurationVar(&o.Sync, "sync", 100*time.Millisecond, "rate-limit SyncInterval")
	flag.DurationVar(&o.DigestInterval, "digest-interval", 500*time.Millisecond, "how often each pool's Tier-1 publishes a digest")
	flag.DurationVar(&o.Warmup, "warmup", 15*time.Second, "time after the last join before measuring")
	flag.DurationVar(&o.Window, "window", 10*time.Second, "rate-limit accuracy window")
	flag.IntVar(&o.Windows, "windows", 3, "steady-state windows measured")
	flag.DurationVar(&o.CutFor, "cut", 10*time.Second, "how long the last Region is cut off after the steady windows (0: no cut)")
	flag.DurationVar(&o.ReconvergeMax, "reconverge-max", 60*time.Second, "give up waiting for reconvergence after this")
	asJSON := flag.Bool("json", false, "print one JSON object instead of the table")
	sweep := flag.String("sweep", "", "comma-separated instance counts to run in turn (Regions: instances/5, at least 1); with -plot draws the curves")
	plotDir := flag.String("plot", "", "directory to write the sweep's PNG plots into")
	from := flag.String("from", "", "comma-separated files of earlier -json results: print their table (and -plot) instead of running")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	log.SetFlags(0)
	if o.Regions < 1 || o.Instances < o.Regions {
		log.Fatal("scale: need 1 ≤ regions ≤ instances")
	}
	if *from != "" {
		var results []*Result
		for _, f := range strings.Split(*from, ",") {
			b, err := os.ReadFile(f)
			if err != nil {
				log.Fatal(err)
			}
			var r Result
			if err := json.Unmarshal(b, &r); err != nil {
				log.Fatalf("scale: %s: %v", f, err)
			}
			results = append(results, &r)
		}
		printTable(os.Stdout, results)
		if *plotDir != "" {
			if err := writePlots(*plotDir, results); err != nil {
				log.Fatal(err)
			}
		}
		return
	}
	if *sweep == "" {
		r, err := run(context.Background(), o, os.Stderr)
		if err != nil {
			log.Fatal(err)
		}
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(r)
			return
		}
		printTable(os.Stdout, []*Result{r})
		return
	}
	var results []*Result
	for _, f := range strings.Split(*sweep, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			log.Fatalf("scale: -sweep: %q is not an instance count", f)
		}
		so := o
		so.Instances, so.Regions = n, max(1, n/5)
		r, err := run(context.Background(), so, os.Stderr)
		if err != nil {
			log.Fatal(err)
		}
		results = append(results, r)
	}
	if *asJSON {
		_ = json.NewEncoder(os.Stdout).Encode(results)
	} else {
		printTable(os.Stdout, results)
	}
	if *plotDir != "" {
		if err := writePlots(*plotDir, results); err != nil {
			log.Fatal(err)
		}
	}
}

func printTable(w io.Writer, rs []*Result) {
	fmt.Fprintf(w, "%9s %7s %6s %11s %11s %9s %9s %10s %10s %9s %10s %10s %8s %8s %7s %7s %8s\n",
		"instances", "regions", "limits", "in kB/s", "out kB/s", "pkts in/s", "pkts out/s", "model kB/s", "sync p50", "heap MiB",
		"dig p50 s", "dig p99 s", "rl worst", "rl min", "back s", "fresh s", "cpu busy")
	for _, r := range rs {
		fmt.Fprintf(w, "%9d %7d %6d %11.1f %11.1f %9.0f %9.0f %10.1f %10s %9.1f %10.2f %10.2f %8.3f %8.3f %7.1f %7.1f %8.2f\n",
			r.Options.Instances, r.Options.Regions, r.ActiveLimitsReal, r.BytesInPerS/1e3, r.BytesOutPerS/1e3, r.PacketsInPerS, r.PacketsOutPerS,
			r.Model.GossipCapBytesPerS/1e3+r.Model.PushPullBytesPerS/1e3, time.Duration(r.SyncP50Ms*1e6).Round(time.Microsecond), r.HeapPerInstanceMiB,
			r.DigestConvergenceP50, r.DigestConvergenceP99, r.RatelimitWorstRatio, r.RatelimitMinRatio, r.MembersBackS, r.PeersFreshS, r.CPUBusy)
	}
}
