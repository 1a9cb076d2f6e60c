package replay

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/tier1"
)

// Options are the conditions of a replay, shared by every policy compared.
type Options struct {
	// Fleet is the simulated pods. Every pod must serve the same base
	// model: a trace names no model, so one scheduler routes all of it.
	Fleet *sim.Fleet
	// Replicas is how many Tier-1 (or Envoy) replicas take the requests in
	// turn, request i going to replica i mod Replicas. Each keeps its own
	// state (in-flight counts, metrics, latency models); Meridian replicas
	// share prefix events, GIE replicas do not. Default 1.
	Replicas int
	// RateScale multiplies the trace's arrival rate: 2 replays it twice as
	// fast (arrival times halved). Default 1.
	RateScale float64
	// ScrapeInterval is how often each replica scrapes every pod's metrics,
	// in virtual time. Replica r scrapes r×interval/Replicas after replica
	// 0, as independent scrapers drift apart. Default 50ms, GIE's and
	// Meridian's production interval: decisions see the same staleness.
	ScrapeInterval time.Duration
	// Seed seeds the engine (pod faults), the random policies and the
	// schedulers' tie-breaks. Equal seeds give equal results.
	Seed uint64
	// Progress, if set, is called on the replay's goroutine with the
	// number of requests that finished since its previous call (every
	// few hundred, and at the end). Compare and the searches run replays
	// concurrently, so it must be safe for concurrent use.
	Progress func(finished int)
	// Deadline, when positive, ends the run early once more than
	// MissBudget requests have failed or taken longer than Deadline to
	// their first token: the run has then missed that TTFT objective
	// whatever follows, and the rest of an overloaded replay is the
	// slowest part of it. The Result is marked Abandoned and its figures
	// cover only what finished. Searches set it; 0 replays everything.
	Deadline   time.Duration
	MissBudget int
}

func (o Options) withDefaults() Options {
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.RateScale <= 0 {
		o.RateScale = 1
	}
	if o.ScrapeInterval <= 0 {
		o.ScrapeInterval = 50 * time.Millisecond
	}
	return o
}

// Result is one policy's replay. Its JSON form is the shape `meridian
// replay --json` promises other tools; fields without a JSON name are for
// the table and the plot only.
type Result struct {
	Policy    string `json:"policy"`
	Requests  int    `json:"requests"`
	Completed int    `json:"completed"`
	// Failed counts requests refused or cut by a pod (for example a prompt
	// longer than an A10G's max-model-len) or that no endpoint could take.
	Failed int `json:"failed"`
	// TTFT is time to first token of completed requests, in ms.
	TTFT TTFTQuantiles `json:"ttft_ms"`
	// E2E is arrival to last token of completed requests, in ms.
	E2E E2EQuantiles `json:"e2e_ms"`
	// ThroughputRPS and OutputTokensPerS are completed requests and their
	// output tokens per second from the first arrival to the last finish.
	ThroughputRPS    float64 `json:"throughput_rps"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	// PrefixHitRatio is the prompt tokens of completed requests that the
	// pods' prefix caches supplied when each was first scheduled, over
	// their prompt tokens. (vLLM's own counters also count the lookups of
	// preempted requests resuming, which finds their own blocks and would
	// reward a policy for causing preemptions.)
	PrefixHitRatio float64 `json:"prefix_hit_ratio"`
	// QueueSpreadMax is the largest difference, at any scrape, between the
	// most and the least waiting requests on a pod of the fleet (the seed
	// dashboard's max − min of vllm:num_requests_waiting).
	QueueSpreadMax int `json:"queue_spread_max"`
	// Preemptions counts preemptions by recompute over the fleet.
	Preemptions uint64 `json:"preemptions"`
	// AdapterLoads counts LoRA adapter loads over the fleet (first loads
	// and reloads after an eviction); left out when there are none.
	AdapterLoads uint64 `json:"adapter_loads,omitempty"`
	// GoodputRPS is set by the goodput search only: the offered request
	// rate at the highest rate scale meeting the SLO (Goodput).
	GoodputRPS *float64 `json:"goodput_rps,omitempty"`

	// RateScale is the rate scale of the run these figures come from.
	RateScale float64 `json:"-"`
	// SLOAttainment is the fraction of requests whose first token came
	// within the SLO, failures counting as misses (goodput search only).
	SLOAttainment float64 `json:"-"`
	// Served counts the requests each pod was sent, by pod name.
	Served map[string]int `json:"-"`
	// FailedBy counts failures by reason.
	FailedBy map[string]int `json:"-"`
	// Abandoned reports that the run stopped early, past Options'
	// miss budget; its figures cover only the requests that finished.
	Abandoned bool `json:"-"`
	// Wall is how long the replay took on this machine.
	Wall time.Duration `json:"-"`
	// TTFTs are every completed request's TTFT, sorted (for the CDF plot).
	TTFTs []time.Duration `json:"-"`
}

// TTFTQuantiles are percentiles in milliseconds.
type TTFTQuantiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// E2EQuantiles are percentiles in milliseconds.
type E2EQuantiles struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

// Run replays w through policy p on a fresh simulated fleet and measures
// it. It is deterministic in (w, p, o) and safe to call concurrently for
// different runs over the same workload.
func Run(w *Workload, p Policy, o Options) (*Result, error) {
	o = o.withDefaults()
	if o.Fleet == nil {
		return nil, errors.New("replay: no fleet")
	}
	if len(w.Records) == 0 {
		return nil, errors.New("replay: empty workload")
	}
	start := time.Now()
	fleet := withAdapters(o.Fleet, w.AdapterNames)
	e := sim.NewEngine(o.Seed)
	pods, err := e.AddFleet(fleet)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	model := pods[0].Model()
	for _, pod := range pods[1:] {
		if pod.Model() != model {
			return nil, fmt.Errorf("replay: the fleet serves %q (%s) and %q (%s); a trace names no model, so replay one model at a time",
				model, pods[0].Name(), pod.Model(), pod.Name())
		}
	}
	routers, err := newRouters(p, pods, model, o.Replicas, o.Seed)
	if err != nil {
		return nil, err
	}

	res := &Result{Policy: p.Name, Requests: len(w.Records), RateScale: o.RateScale, FailedBy: map[string]int{}, Served: map[string]int{}}
	snap := make([]sim.Metrics, len(pods))
	takeSnapshot := func() {
		lo, hi := math.MaxInt, math.MinInt
		for i, pod := range pods {
			snap[i] = pod.Metrics()
			lo, hi = min(lo, snap[i].Waiting), max(hi, snap[i].Waiting)
		}
		res.QueueSpreadMax = max(res.QueueSpreadMax, hi-lo)
	}
	for r, rt := range routers {
		offset := o.ScrapeInterval * time.Duration(r) / time.Duration(len(routers))
		e.At(offset, func() {
			scrape := func() {
				// Each replica scrapes every pod at its own phase, as
				// independent scrapers do.
				takeSnapshot()
				rt.scrape(snap, e.Now())
			}
			scrape()
			e.Every(o.ScrapeInterval, scrape)
		})
	}

	var (
		ttfts, e2es   []time.Duration
		outputTokens  int64
		cached, tried int64
		first         = scaled(w.Records[0].Arrival, o.RateScale)
		last          = first
		sinceProgress int
		misses        int
	)
	finish := func(o2 *sim.Outcome, err error, at time.Duration) {
		last = max(last, at)
		if err == nil {
			res.Completed++
			ttfts = append(ttfts, o2.TTFT())
			e2es = append(e2es, o2.Finish-o2.Arrival)
			outputTokens += int64(o2.OutputTokens)
			cached += int64(o2.CachedTokens)
			tried += int64(o2.Request.PromptTokens)
		} else {
			res.Failed++
			res.FailedBy[failureReason(err)]++
		}
		if o.Deadline > 0 && (err != nil || o2.TTFT() > o.Deadline) {
			if misses++; misses > o.MissBudget && !res.Abandoned {
				res.Abandoned = true
				e.Stop()
			}
		}
		if sinceProgress++; o.Progress != nil && sinceProgress >= 256 {
			o.Progress(sinceProgress)
			sinceProgress = 0
		}
	}

	next := 0
	var arrive func()
	arrive = func() {
		i := next
		next++
		if next < len(w.Records) {
			e.At(scaled(w.Records[next].Arrival, o.RateScale), arrive)
		}
		rec := &w.Records[i]
		req := sim.TraceRequest(*rec)
		it := item{tokens: rec.InputTokens, hashIDs: rec.HashIDs, req: req}
		if w.Adapters != nil {
			it.adapter = w.Adapters[i]
			req.Adapter = it.adapter
		}
		k, done, err := routers[i%len(routers)].route(&it, e.Now())
		if err != nil {
			finish(nil, err, e.Now())
			return
		}
		res.Served[pods[k].Name()]++
		var first func()
		if it.firstToken != nil {
			arrival := e.Now()
			first = func() { it.firstToken(e.Now() - arrival) }
		}
		e.SubmitFirst(pods[k], req, first, func(out sim.Outcome) {
			if done != nil {
				done(&out)
			}
			finish(&out, out.Err, out.Finish)
		})
	}
	e.At(first, arrive)
	e.Run()
	if o.Progress != nil && sinceProgress > 0 {
		o.Progress(sinceProgress)
	}

	for _, pod := range pods {
		m := pod.Metrics()
		res.Preemptions += m.Preemptions
		res.AdapterLoads += m.AdapterLoads
	}
	if tried > 0 {
		res.PrefixHitRatio = round(float64(cached)/float64(tried), 4)
	}
	slices.Sort(ttfts)
	slices.Sort(e2es)
	res.TTFTs = ttfts
	res.TTFT = TTFTQuantiles{P50: quantileMS(ttfts, 0.50), P90: quantileMS(ttfts, 0.90), P99: quantileMS(ttfts, 0.99)}
	res.E2E = E2EQuantiles{P50: quantileMS(e2es, 0.50), P99: quantileMS(e2es, 0.99)}
	if span := (last - first).Seconds(); span > 0 {
		res.ThroughputRPS = round(float64(res.Completed)/span, 3)
		res.OutputTokensPerS = round(float64(outputTokens)/span, 1)
	}
	res.Wall = time.Since(start)
	return res, nil
}

// scaled maps a trace arrival time to virtual time at a rate scale.
func scaled(t time.Duration, scale float64) time.Duration {
	return time.Duration(float64(t) / scale)
}

// quantileMS is the nearest-rank q-quantile of sorted durations, in ms
// rounded to 0.1 ms; 0 for none.
func quantileMS(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = min(max(i, 0), len(sorted)-1)
	return round(float64(sorted[i])/float64(time.Millisecond), 1)
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// failureReason names a failure for the table.
func failureReason(err error) string {
	for _, r := range []struct {
		err  error
		name string
	}{
		{sim.ErrContextLength, "context-length"},
		{tier1.ErrContextLength, "context-length"},
		{sim.ErrUnknownAdapter, "unknown-adapter"},
		{sim.ErrServerError, "server-error"},
		{sim.ErrRateLimited, "rate-limited"},
		{sim.ErrCrashed, "crashed"},
		{sim.ErrUnfinished, "unfinished"},
		{sim.ErrInvalidRequest, "invalid"},
	} {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return "no-endpoint"
}

// withAdapters returns the fleet with the synthetic adapters added to
// every pool that lists none, so that its pods can serve them.
func withAdapters(f *sim.Fleet, names []string) *sim.Fleet {
	if len(names) == 0 {
		return f
	}
	out := &sim.Fleet{Pools: slices.Clone(f.Pools)}
	for i := range out.Pools {
		if len(out.Pools[i].Adapters) == 0 {
			out.Pools[i].Adapters = names
		}
	}
	return out
}
