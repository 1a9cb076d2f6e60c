package replay

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/tier1"
)

// epoch is virtual time zero on the scheduler's clock. Any fixed instant
// works; a recent one keeps UnixNano stamps positive.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// tier1Router is one Tier-1 replica: the real scheduler over its own Pool
// (endpoint accounting, latency models, prefix index), fed scrapes of the
// simulated pods.
type tier1Router struct {
	sched *tier1.Scheduler
	eps   []*tier1.Endpoint // by pod index
	slot  map[*tier1.Endpoint]int
	model string
	// peers receive this replica's dispatches as prefix events and its
	// loads (Meridian mode with several replicas); name is the
	// replica's name in them.
	peers []*tier1Router
	name  string

	req   tier1.Request
	dst   []*tier1.Endpoint
	text  []byte
	chars int // prompt characters worth hashing: max blocks × block size
}

func newTier1Router(pods []*sim.Pod, model string, pol config.SchedulerPolicy, seed uint64) (*tier1Router, error) {
	pool := tier1.NewPool()
	rng := rand.New(rand.NewPCG(seed, seed^0x6a09e667f3bcc909))
	sched, err := tier1.NewScheduler(pool, config.Scheduler{Name: "replay", ModelName: model}, pol,
		tier1.Options{Rand: rng.Uint64, Fallbacks: -1})
	if err != nil {
		return nil, err
	}
	r := &tier1Router{sched: sched, slot: map[*tier1.Endpoint]int{}, model: model}
	blockChars := sched.Policy().BlockSize
	for i, p := range pods {
		ep := pool.Add(p.Name(), p.Name())
		// What the pod's /v1/models would say: its model, its registered
		// adapters and its max-model-len. GIE mode does not use them.
		cfg := p.Config()
		ep.SetCapabilities(&tier1.Capabilities{Models: []string{p.Model()}, Adapters: cfg.Adapters, MaxModelLen: cfg.Profile.MaxModelLen})
		// Pods of one profile share a latency model, as a Tier-1 that
		// reads their gpu label (sim/fleet.go sets it to the profile)
		// does by default.
		pool.SetClass(ep, cfg.Profile.Name)
		r.eps = append(r.eps, ep)
		r.slot[ep] = i
		// GIE auto-tunes its block to the servers' KV block × 4 characters.
		blockChars = max(blockChars, p.Config().Profile.BlockSize*4)
	}
	r.chars = sched.Policy().MaxPrefixBlocks * blockChars
	return r, nil
}

func (r *tier1Router) scrape(ms []sim.Metrics, now time.Duration) {
	at := epoch.Add(now)
	for i, m := range ms {
		r.eps[i].SetMetrics(&tier1.Metrics{
			Waiting:         m.Waiting,
			Running:         m.Running,
			KVCacheUsage:    m.KVCacheUsage,
			RunningAdapters: m.RunningAdapters,
			WaitingAdapters: m.WaitingAdapters,
			MaxLoRA:         m.MaxLoRA,
			LoRAReported:    true,
			BlockSize:       m.BlockSize,
			GPUBlocks:       m.NumGPUBlocks,
			ScrapedAt:       at,
		})
	}
}

func (r *tier1Router) route(it *item, now time.Duration) (int, func(*sim.Outcome), error) {
	at := epoch.Add(now)
	req := r.prepare(it)
	var err error
	r.dst, err = r.sched.Schedule(req, at, r.dst[:0])
	if err != nil {
		return 0, nil, err
	}
	ep := r.dst[0]
	ticket := r.sched.Dispatch(ep, req, at)
	if len(r.peers) > 0 && len(req.Hashes) > 0 {
		ev := tier1.PrefixEvent{Endpoint: ep.ID, Stamp: at.UnixNano(), Hashes: req.Hashes}
		for _, p := range r.peers {
			p.sched.ApplyPrefixEvent(ev)
		}
	}
	r.publishInFlight(ep)
	// The latency model learns each TTFT at the first token, as live, and
	// the prompt leaves the backlog the other replicas are told of.
	it.firstToken = func(ttft time.Duration) {
		ticket.FirstToken(ttft)
		r.publishInFlight(ep)
	}
	return r.slot[ep], func(o *sim.Outcome) {
		if ttft := o.TTFT(); ttft >= 0 {
			ticket.FirstToken(ttft) // a one-token request: no earlier report
		}
		ticket.Done()
		r.publishInFlight(ep)
	}, nil
}

// publishInFlight tells the other replicas this one's load on ep (the
// in-flight count and prefill backlog tier1/gateway publishes live, at the
// same moments), as tier1/peers carries it (here instantly).
func (r *tier1Router) publishInFlight(ep *tier1.Endpoint) {
	if len(r.peers) == 0 {
		return
	}
	load := ep.LoadReport()
	for _, p := range r.peers {
		p.sched.ApplyPeerInFlight(r.name, ep.ID, load)
	}
}

// prepare fills the replica's reusable tier1 request for it.
func (r *tier1Router) prepare(it *item) *tier1.Request {
	req := &r.req
	req.Model, req.Adapter, req.PromptTokens = r.model, it.adapter, it.tokens
	// The trace's output length stands for the request's max_tokens.
	req.MaxTokens = 0
	if it.req != nil {
		req.MaxTokens = it.req.OutputTokens
	}
	req.Hashes = req.Hashes[:0]
	if len(it.hashIDs) > 0 {
		r.text = promptText(r.text[:0], it.hashIDs, it.tokens, r.chars)
		r.sched.HashText(req, r.text, "")
	}
	return req
}

// tokenChars is the characters a token is written as in synthetic prompt
// text; tier1 and GIE assume 4 characters a token.
const tokenChars = 4

// promptText appends synthetic prompt text standing for a Mooncake
// request: each 512-token block is the hex of its hash id repeated to 4
// characters a token, so equal ids give equal text and the scheduler's own
// hashing (block size, chaining, cap) applies unchanged. It stops at limit
// characters, since the scheduler hashes no further.
func promptText(dst []byte, ids []uint64, tokens, limit int) []byte {
	const blockChars = 512 * tokenChars
	total := min(tokens*tokenChars, limit)
	var unit [16]byte
	for _, id := range ids {
		if len(dst) >= total {
			break
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], id)
		hex.Encode(unit[:], b[:])
		end := min(len(dst)+blockChars, total)
		for len(dst) < end {
			dst = append(dst, unit[:min(len(unit), end-len(dst))]...)
		}
	}
	return dst
}

// newRouters builds one router per replica for p over pods.
func newRouters(p Policy, pods []*sim.Pod, model string, replicas int, seed uint64) ([]router, error) {
	out := make([]router, replicas)
	var t1 []*tier1Router
	for i := range out {
		rs := seed*0x9e3779b97f4a7c15 + uint64(i+1)*0xbf58476d1ce4e5b9
		switch p.Kind {
		case RoundRobin:
			out[i] = &roundRobin{n: len(pods)}
		case Random:
			out[i] = &random{rng: rand.New(rand.NewPCG(rs, rs^1)), n: len(pods)}
		case LeastRequest:
			out[i] = &leastRequest{rng: rand.New(rand.NewPCG(rs, rs^1)), active: make([]int, len(pods))}
		case LeastOutstanding:
			out[i] = &leastOutstanding{active: make([]int, len(pods))}
		case Oracle:
			out[i] = &oracle{pods: pods, rng: rand.New(rand.NewPCG(rs, rs^1))}
		case GIEDefault, Meridian:
			r, err := newTier1Router(pods, model, p.Scheduler, rs)
			if err != nil {
				return nil, fmt.Errorf("replay: policy %s: %w", p.Name, err)
			}
			r.name = fmt.Sprintf("replica-%d", i)
			t1 = append(t1, r)
			out[i] = r
		default:
			return nil, fmt.Errorf("replay: %w %q", ErrUnknownPolicy, p.Kind)
		}
	}
	// Meridian replicas exchange prefix events; GIE's stay apart.
	if len(t1) > 1 && t1[0].sched.SharesPrefixIndex() {
		for _, r := range t1 {
			for _, q := range t1 {
				if q != r {
					r.peers = append(r.peers, q)
				}
			}
		}
	}
	return out, nil
}
