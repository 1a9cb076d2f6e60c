package replay

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/tier1"
)

// Policy kinds, the names --policy and --compare accept.
const (
	// RoundRobin is Envoy's ROUND_ROBIN: each replica sends its requests
	// to the pods in turn.
	RoundRobin = "round-robin"
	// Random is Envoy's RANDOM: a uniformly random pod.
	Random = "random"
	// LeastRequest is Envoy's LEAST_REQUEST with its default choice count
	// of 2: two distinct random pods, the one with fewer requests this
	// replica has in flight (the first on a tie).
	LeastRequest = "least-request"
	// LeastOutstanding sends each request to the pod with the fewest
	// requests this replica has in flight (all pods compared; ties to the
	// first): the least-outstanding-requests balancing of AWS ALB and
	// many proxies.
	LeastOutstanding = "least-outstanding"
	// GIEDefault is the Gateway API Inference Extension's default
	// profile: queue 2, kv-cache 2, prefix 3, max-score picker, with GIE's
	// scorer semantics (tier1's "gie" scoring mode).
	GIEDefault = "gie-default"
	// Meridian is Meridian's scheduler (tier1's "meridian" scoring mode)
	// with the given weights, or a scheduler taken from a gateway config.
	Meridian = "meridian"
	// Oracle is the yardstick, not a deployable policy: at the instant of
	// each decision it sees every pod's true state (waiting queue, running
	// batch, prefix cache, adapter slots; no scrape staleness) and sends
	// the request to the pod the simulator's own model predicts gives it
	// the earliest first token (sim.Pod.PredictFirstToken), skipping pods
	// that would refuse it. It is greedy: it does not plan for arrivals it
	// has not seen. Replicas share its knowledge, which is the truth.
	Oracle = "oracle"
)

// PolicyKinds lists the policy names in the order help text shows them.
var PolicyKinds = []string{RoundRobin, Random, LeastRequest, LeastOutstanding, GIEDefault, Meridian, Oracle}

// ErrUnknownPolicy and ErrUnknownWeight are wrapped by the errors for bad
// policy or weight names; the message lists the valid ones.
var (
	ErrUnknownPolicy = errors.New("unknown policy")
	ErrUnknownWeight = errors.New("unknown weight")
)

// Policy is one routing policy to replay.
type Policy struct {
	// Name labels the policy's results ("meridian", "meridian prefix=5").
	Name string
	// Kind is one of PolicyKinds.
	Kind string
	// Scheduler is the tier1 scheduling policy for GIEDefault and
	// Meridian; ignored by the Envoy policies.
	Scheduler config.SchedulerPolicy
}

// ParsePolicy returns the policy named kind. weights applies to Meridian
// only; nil means the binary's defaults (config.DefaultWeights).
func ParsePolicy(kind string, weights *config.Weights) (Policy, error) {
	switch kind {
	case RoundRobin, Random, LeastRequest, LeastOutstanding, Oracle:
		return Policy{Name: kind, Kind: kind}, nil
	case GIEDefault:
		p := config.DefaultPolicy()
		p.Scoring = config.ScoringGIE
		p.Weights = config.GIEWeights()
		return Policy{Name: kind, Kind: kind, Scheduler: p}, nil
	case Meridian:
		p := config.DefaultPolicy()
		if weights != nil {
			p.Weights = *weights
		}
		return Policy{Name: kind, Kind: kind, Scheduler: p}, nil
	}
	return Policy{}, fmt.Errorf("replay: %w %q (valid: %s)", ErrUnknownPolicy, kind, strings.Join(PolicyKinds, ", "))
}

// ParsePolicies parses a comma-separated list such as
// "round-robin,gie-default,meridian".
func ParsePolicies(list string, weights *config.Weights) ([]Policy, error) {
	var out []Policy
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		p, err := ParsePolicy(name, weights)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("replay: no policy named (valid: %s)", strings.Join(PolicyKinds, ", "))
	}
	return out, nil
}

// GatewayPolicy returns the Meridian policy of the scheduler named name in
// the gateway configuration under dir, as the data plane would resolve it
// (weights, or the EndpointPickerConfig its configMapRef names; a
// "scoring: gie" scheduler replays with GIE semantics).
func GatewayPolicy(dir, name string) (Policy, error) {
	snap, err := config.LoadDir(dir)
	if err != nil {
		return Policy{}, fmt.Errorf("replay: gateway config: %w", err)
	}
	var found []string
	var pol config.SchedulerPolicy
	var have []string
	for _, gw := range snap.Gateways {
		for _, sc := range gw.Spec.Schedulers {
			have = append(have, gw.Metadata.Name+"/"+sc.Name)
			if sc.Name != name && gw.Metadata.Name+"/"+sc.Name != name {
				continue
			}
			p, ok := snap.Policy(gw.Metadata.Name, sc.Name)
			if !ok {
				return Policy{}, fmt.Errorf("replay: gateway %q scheduler %q: no resolved policy", gw.Metadata.Name, sc.Name)
			}
			if p.Scoring == "" {
				p.Scoring = sc.Scoring
			}
			found = append(found, gw.Metadata.Name+"/"+sc.Name)
			pol = p
		}
	}
	switch len(found) {
	case 0:
		return Policy{}, fmt.Errorf("replay: no scheduler %q in %s (have %s)", name, dir, strings.Join(have, ", "))
	case 1:
	default:
		return Policy{}, fmt.Errorf("replay: scheduler %q is ambiguous in %s (%s): name it gateway/scheduler", name, dir, strings.Join(found, ", "))
	}
	return Policy{Name: Meridian + " " + found[0], Kind: Meridian, Scheduler: pol}, nil
}

// ParseWeights parses "queue=2,kvCache=2,prefix=3" into weights. Weights
// not named are zero, as in a gateway config's weights block.
func ParseWeights(s string) (config.Weights, error) {
	var w config.Weights
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		name, val, ok := strings.Cut(kv, "=")
		if !ok {
			return w, fmt.Errorf("replay: weights: %q: want name=value", kv)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || v < 0 {
			return w, fmt.Errorf("replay: weights: %s: want a number ≥ 0, got %q", name, val)
		}
		p, err := weightField(&w, strings.TrimSpace(name))
		if err != nil {
			return w, err
		}
		*p = v
	}
	return w, nil
}

// weightField returns the field of w a weight name sets.
func weightField(w *config.Weights, name string) (*float64, error) {
	fields := [...]*float64{&w.Queue, &w.KVCache, &w.Prefix, &w.LoraAffinity, &w.RunningRequests, &w.PredictedLatency, &w.LRU}
	i := slices.Index(tier1.ScorerNames[:], name)
	if i < 0 {
		return nil, fmt.Errorf("replay: %w %q (valid: %s)", ErrUnknownWeight, name, strings.Join(tier1.ScorerNames[:], ", "))
	}
	return fields[i], nil
}

// FormatWeights writes weights as ParseWeights reads them, zero weights
// left out.
func FormatWeights(w config.Weights) string {
	vals := [...]float64{w.Queue, w.KVCache, w.Prefix, w.LoraAffinity, w.RunningRequests, w.PredictedLatency, w.LRU}
	var parts []string
	for i, v := range vals {
		if v != 0 {
			parts = append(parts, tier1.ScorerNames[i]+"="+strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	return strings.Join(parts, ",")
}

// router is one replica of a policy: it picks a pod for each request it
// is handed and learns from scrapes and outcomes. Routers run on the
// engine's goroutine only.
type router interface {
	// route picks a pod index for r at now; done, if not nil, is called
	// with the request's outcome.
	route(r *item, now time.Duration) (pod int, done func(*sim.Outcome), err error)
	// scrape installs a metrics snapshot of every pod taken at now.
	scrape(m []sim.Metrics, now time.Duration)
}

// item is one request as the routers see it.
type item struct {
	tokens  int
	adapter string
	hashIDs []uint64
	// req is the request the pod will be handed (the oracle's view).
	req *sim.Request
	// firstToken, if a router sets it in route, is called with the TTFT
	// when the request's first token comes (as a streaming proxy sees it).
	firstToken func(ttft time.Duration)
}

// roundRobin cycles through the pods.
type roundRobin struct{ next, n int }

func (r *roundRobin) route(*item, time.Duration) (int, func(*sim.Outcome), error) {
	p := r.next
	r.next = (r.next + 1) % r.n
	return p, nil, nil
}
func (r *roundRobin) scrape([]sim.Metrics, time.Duration) {}

// random picks uniformly.
type random struct {
	rng *rand.Rand
	n   int
}

func (r *random) route(*item, time.Duration) (int, func(*sim.Outcome), error) {
	return r.rng.IntN(r.n), nil, nil
}
func (r *random) scrape([]sim.Metrics, time.Duration) {}

// leastRequest is Envoy's power of two choices on this replica's own
// count of active requests per host.
type leastRequest struct {
	rng    *rand.Rand
	active []int
}

func (r *leastRequest) route(*item, time.Duration) (int, func(*sim.Outcome), error) {
	n := len(r.active)
	a := r.rng.IntN(n)
	pick := a
	if n > 1 {
		b := r.rng.IntN(n - 1)
		if b >= a {
			b++
		}
		if r.active[b] < r.active[a] {
			pick = b
		}
	}
	r.active[pick]++
	return pick, func(*sim.Outcome) { r.active[pick]-- }, nil
}
func (r *leastRequest) scrape([]sim.Metrics, time.Duration) {}

// leastOutstanding picks the pod with the fewest requests in flight from
// this replica.
type leastOutstanding struct{ active []int }

func (r *leastOutstanding) route(*item, time.Duration) (int, func(*sim.Outcome), error) {
	pick := 0
	for i, n := range r.active {
		if n < r.active[pick] {
			pick = i
		}
	}
	r.active[pick]++
	return pick, func(*sim.Outcome) { r.active[pick]-- }, nil
}
func (r *leastOutstanding) scrape([]sim.Metrics, time.Duration) {}

// oracle sends each request to the pod predicted, from the pods' true
// state, to give it the earliest first token.
type oracle struct {
	pods  []*sim.Pod
	rng   *rand.Rand
	order []int
}

func (o *oracle) route(it *item, now time.Duration) (int, func(*sim.Outcome), error) {
	// Project the least loaded pods first: the best found so far bounds
	// the projection of the rest.
	o.order = o.order[:0]
	for i := range o.pods {
		o.order = append(o.order, i)
	}
	slices.SortStableFunc(o.order, func(a, b int) int { return o.pods[a].InFlight() - o.pods[b].InFlight() })
	best, bestAt, ties := -1, time.Duration(0), 0
	var refusal error
	for _, i := range o.order {
		limit := time.Duration(0)
		if best >= 0 {
			limit = bestAt
		}
		at, err := o.pods[i].PredictFirstToken(it.req, limit)
		switch {
		case errors.Is(err, sim.ErrBeyondLimit):
			continue
		case err != nil:
			refusal = err
			continue
		}
		switch {
		case best < 0 || at < bestAt:
			best, bestAt, ties = i, at, 1
		case at == bestAt:
			// Equal predictions (idle twins): an even draw among them.
			ties++
			if o.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if best < 0 {
		if refusal == nil {
			refusal = errors.New("no pod can give a first token")
		}
		return 0, nil, fmt.Errorf("replay: oracle: %w", refusal)
	}
	return best, nil, nil
}
func (o *oracle) scrape([]sim.Metrics, time.Duration) {}
