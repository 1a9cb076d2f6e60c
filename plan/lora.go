package plan

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/meridian-router/meridian/replay"
	"github.com/meridian-router/meridian/sim"
)

// LoRA is a LoRA layout question: how to split a workload's adapters
// between pools, how many adapter slots (vLLM's --max-loras) and pods each
// pool needs.
type LoRA struct {
	// Capacity sizes each pool (fleet templates, GPUs, prices, SLO, peak
	// scale, policy, seed, progress).
	Capacity
	// HotShare is the share of requests the hot set must carry: the hot
	// set is the fewest most popular adapters whose requests reach it.
	// Default 0.9, the seed's rule ("40 adapters with 3 taking 90% is two
	// pools, not one").
	HotShare float64
}

// LoRAPlan is the answer to a LoRA question.
type LoRAPlan struct {
	// Adapters is the catalogue size; HotSet the hot adapters, most
	// popular first, and HotShare the share of requests they carry.
	Adapters int      `json:"adapters"`
	HotSet   []string `json:"hot_set"`
	HotShare float64  `json:"hot_share"`
	// Pools are the proposed pools: the hot set's, then the long tail's
	// (none when the hot set is the whole catalogue).
	Pools []LoRAPool `json:"pools"`
	// Layout is the replay of the proposed pools together; Shared the
	// replay of one pool of the same pods serving every adapter with the
	// fleet's --max-loras.
	Layout Outcome `json:"layout"`
	Shared Outcome `json:"shared"`
	// SharedMaxLoRAs is the shared pool's --max-loras.
	SharedMaxLoRAs int `json:"shared_max_loras"`
	// SLOMS and Scale restate the question.
	SLOMS   float64       `json:"slo_ttft_p99_ms"`
	Scale   float64       `json:"peak_scale"`
	Replays int           `json:"replays"`
	Wall    time.Duration `json:"-"`
}

// LoRAPool is one pool of a layout.
type LoRAPool struct {
	// Role is "hot" or "tail".
	Role string `json:"role"`
	// Adapters are the adapters the pool serves; Share their share of
	// requests (base-model requests go to the hot pool).
	Adapters []string `json:"adapters"`
	Share    float64  `json:"share"`
	// MaxLoRAs is the pool's --max-loras.
	MaxLoRAs int `json:"max_loras"`
	// Plan is the pool's capacity plan for its share of the traffic.
	Plan *CapacityPlan `json:"plan"`
}

// Outcome is a replay of a layout over the whole workload.
type Outcome struct {
	Pods         []PoolCount `json:"pods"`
	Requests     int         `json:"requests"`
	Failed       int         `json:"failed"`
	P99TTFTMS    float64     `json:"p99_ttft_ms"`
	Attainment   float64     `json:"slo_attainment"`
	Met          bool        `json:"meets_slo"`
	AdapterLoads uint64      `json:"adapter_loads"`
}

// PlanLoRA splits w's adapters into a hot set and a long tail, sizes a
// pool for each (--max-loras of the hot pool = the hot set; the tail pool
// keeps the fleet's), and replays the layout against one shared pool of
// the same pods. The two pools are separate InferencePools, each with its
// own scheduler: requests reach a pool by the adapter they name, as
// Tier-1's routing by model name does.
func PlanLoRA(w *replay.Workload, l LoRA) (*LoRAPlan, error) {
	start := time.Now()
	if err := l.Capacity.defaults(); err != nil {
		return nil, err
	}
	if w == nil || len(w.Records) == 0 {
		return nil, fmt.Errorf("plan: %w: the workload has no requests", ErrBadInput)
	}
	if w.Adapters == nil {
		return nil, fmt.Errorf("plan: %w: the workload names no LoRA adapters", ErrBadInput)
	}
	if l.HotShare == 0 {
		l.HotShare = 0.9
	}
	if !(l.HotShare > 0 && l.HotShare <= 1) {
		return nil, fmt.Errorf("plan: %w: the hot set's share must be in (0, 1], got %v", ErrBadInput, l.HotShare)
	}

	// Popularity, most requested first.
	count := map[string]int{}
	for _, a := range w.Adapters {
		count[a]++
	}
	// The catalogue: adapters the workload draws from, requested or not
	// (an adapter nobody asked for in the window still needs a pool).
	var names []string
	for a := range count {
		if a != "" {
			names = append(names, a)
		}
	}
	for _, a := range w.AdapterNames {
		if _, ok := count[a]; !ok && a != "" {
			names = append(names, a)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("plan: %w: no request names a LoRA adapter", ErrBadInput)
	}
	slices.SortFunc(names, func(a, b string) int {
		if c := cmp.Compare(count[b], count[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	adapterReqs := len(w.Records) - count[""]
	hot, acc := 0, 0
	for hot < len(names) && float64(acc) < l.HotShare*float64(adapterReqs) {
		acc += count[names[hot]]
		hot++
	}
	out := &LoRAPlan{
		Adapters: len(names),
		HotSet:   slices.Clone(names[:hot]),
		HotShare: round(float64(acc)/float64(adapterReqs), 4),
		SLOMS:    float64(l.SLO) / float64(time.Millisecond),
		Scale:    l.Scale,
	}
	groups := [][]string{names[:hot]}
	if hot < len(names) {
		groups = append(groups, names[hot:])
	}

	inGroup := make([]int, len(w.Records)) // request → group
	group := map[string]int{"": 0}
	for g, as := range groups {
		for _, a := range as {
			group[a] = g
		}
	}
	for i, a := range w.Adapters {
		inGroup[i] = group[a]
	}

	replays := 0
	var layout []*replay.Result
	var sharedCounts = map[string]int{} // GPU → pods
	for g, as := range groups {
		sub := subWorkload(w, inGroup, g, as)
		role := "hot"
		if g > 0 {
			role = "tail"
		}
		c := l.Capacity
		c.Fleet = &sim.Fleet{Prices: l.Fleet.Prices}
		maxLoRAs := 0
		for _, p := range l.Fleet.Pools {
			p.Name += "-" + role
			p.Adapters = slices.Clone(as)
			if role == "hot" {
				o := sim.ProfileOverrides{}
				if p.Overrides != nil {
					o = *p.Overrides
				}
				n := len(as)
				o.MaxLoRAs = &n
				p.Overrides = &o
			}
			c.Fleet.Pools = append(c.Fleet.Pools, p)
			if maxLoRAs == 0 {
				maxLoRAs = effectiveMaxLoRAs(p)
			}
		}
		c.noMargin = true
		cp, err := PlanCapacity(sub, c)
		if err != nil {
			return nil, fmt.Errorf("plan: %s pool (%d adapters, %d requests): %w", role, len(as), len(sub.Records), err)
		}
		replays += cp.Replays
		layout = append(layout, cp.Plan.result)
		for _, pc := range cp.Plan.Pools {
			sharedCounts[pc.GPU] += pc.Count
			if pc.Count > 0 {
				out.Layout.Pods = append(out.Layout.Pods, pc)
			}
		}
		out.Pools = append(out.Pools, LoRAPool{
			Role: role, Adapters: slices.Clone(as), MaxLoRAs: maxLoRAs, Plan: cp,
			Share: round(float64(len(sub.Records))/float64(len(w.Records)), 4),
		})
	}
	slo := replay.SLO{TTFT: l.SLO}
	out.Layout.fill(layout, slo)

	// One shared pool of the same pods: every adapter, the fleet's slots.
	shared := &sim.Fleet{}
	for _, p := range l.Fleet.Pools {
		gpu := p.Profile
		n := 0
		for g, c := range sharedCounts {
			if strings.EqualFold(g, gpu) {
				n += c
				sharedCounts[g] = 0
			}
		}
		if n == 0 {
			continue
		}
		p.Count = n
		p.Adapters = slices.Clone(names)
		shared.Pools = append(shared.Pools, p)
		out.Shared.Pods = append(out.Shared.Pods, PoolCount{Pool: p.Name, GPU: gpu, Count: n})
		if out.SharedMaxLoRAs == 0 {
			out.SharedMaxLoRAs = effectiveMaxLoRAs(p)
		}
	}
	for g, n := range sharedCounts {
		if n > 0 { // a --gpus GPU the fleet has no pool for
			shared.Pools = append(shared.Pools, sim.FleetPool{Name: g, Profile: g, Count: n, Adapters: slices.Clone(names)})
			out.Shared.Pods = append(out.Shared.Pods, PoolCount{Pool: g, GPU: g, Count: n})
		}
	}
	r, err := replay.Run(w, l.Policy, replay.Options{Fleet: shared, RateScale: l.Scale, Seed: l.Seed})
	if err != nil {
		return nil, fmt.Errorf("plan: shared pool: %w", err)
	}
	replays++
	out.Shared.fill([]*replay.Result{r}, slo)
	out.Replays = replays
	out.Wall = time.Since(start)
	return out, nil
}

// subWorkload is the requests of group g, arrival times kept.
func subWorkload(w *replay.Workload, inGroup []int, g int, adapters []string) *replay.Workload {
	sub := &replay.Workload{AdapterNames: slices.Clone(adapters), AdapterNote: w.AdapterNote}
	for i, rec := range w.Records {
		if inGroup[i] == g {
			sub.Records = append(sub.Records, rec)
			sub.Adapters = append(sub.Adapters, w.Adapters[i])
		}
	}
	return sub
}

// fill sets the outcome from the replays of its pools, merged.
func (o *Outcome) fill(rs []*replay.Result, slo replay.SLO) {
	var ttfts []time.Duration
	for _, r := range rs {
		o.Requests += r.Requests
		o.Failed += r.Failed
		o.AdapterLoads += r.AdapterLoads
		ttfts = append(ttfts, r.TTFTs...)
	}
	slices.Sort(ttfts)
	merged := &replay.Result{Requests: o.Requests, TTFTs: ttfts}
	o.Met, o.Attainment = slo.Met(merged)
	o.Attainment = round(o.Attainment, 4)
	if len(ttfts) > 0 {
		i := int(math.Ceil(0.99*float64(len(ttfts)))) - 1
		i = min(max(i, 0), len(ttfts)-1)
		o.P99TTFTMS = round(float64(ttfts[i])/float64(time.Millisecond), 1)
	}
}

// effectiveMaxLoRAs is a pool's --max-loras: its override or its
// profile's.
func effectiveMaxLoRAs(p sim.FleetPool) int {
	if p.Overrides != nil && p.Overrides.MaxLoRAs != nil {
		return *p.Overrides.MaxLoRAs
	}
	prof, err := sim.LookupProfile(p.Profile)
	if err != nil {
		return 0
	}
	return prof.MaxLoRAs
}
