package tier1

import (
	"math"
	"sync"
	"sync/atomic"
)

// The latency model predicts a request's time to first token on one
// endpoint as a linear function of what is ahead of it there:
//
//	TTFT ≈ θ0 + θ1·waiting + θ2·running/10 + θ3·uncached/1000 + θ4·backlog/1000
//
// where waiting counts requests queued ahead (scraped plus dispatched
// since), running the batch it joins, uncached the prompt tokens this
// request must prefill (its tokens less the prefix cached there), and
// backlog the uncached prompt tokens sent there whose first token has not
// yet been seen (prefill queued ahead), this replica's plus what the other
// replicas report of theirs (peerload.go). Each endpoint learns its own θ
// by recursive least squares with forgetting from the TTFTs it actually shows, so a slower
// card (or one sharing its GPU) ends up with larger coefficients and the
// same work is priced higher there. Until it has seen any, an endpoint
// predicts with the prior below, which roughly describes an 8B model on
// one modern GPU; the prior only orders endpoints sensibly at start.
const numFeatures = 5

var latencyPrior = [numFeatures]float64{
	0.05, // s fixed overhead
	0.08, // s per request waiting ahead
	0.02, // s per 10 running requests (decode steps interleaved with prefill)
	0.10, // s per 1000 uncached prompt tokens (10k tokens/s prefill)
	0.10, // s per 1000 prompt tokens queued ahead (backlog)
}

const (
	// latencyForget is RLS's forgetting factor: observations lose half
	// their weight after ln2/(1−λ) ≈ 140 completions, so the model follows
	// a pod whose speed changes (thermal throttling, a neighbour) within a
	// few hundred requests.
	latencyForget = 0.995
	// latencyPriorVar is the prior's variance per coefficient; it also
	// caps how uncertain a coefficient may become when its feature stays
	// constant (forgetting would otherwise inflate it without bound).
	latencyPriorVar = 0.5
	// maxObservedTTFT clips observations so that one stuck request does
	// not wreck the model.
	maxObservedTTFT = 120.0
)

type latencyModel struct {
	coef atomic.Pointer[[numFeatures]float64] // nil: the prior
	// streamed is set by the first streamed first token observed: from
	// then on, non-streamed answers (whose first byte is their last) no
	// longer train the model (observeWhole).
	streamed atomic.Bool

	mu    sync.Mutex
	state *rlsState // nil until the first observation
}

// rlsState is recursive least squares' covariance and observation count.
type rlsState struct {
	p [numFeatures][numFeatures]float64
	n int64
}

func latencyFeatures(waiting, running, uncachedTokens, backlogTokens float64) [numFeatures]float64 {
	return [numFeatures]float64{1, waiting, running / 10, uncachedTokens / 1000, backlogTokens / 1000}
}

// latencyUnobserved is what an endpoint that has shown no first token yet
// predicts with once another candidate has: the prior's queue, batch and
// backlog terms, but no fixed overhead and a free prefill. Optimism until
// observed: otherwise one slow pod that showed a TTFT early (and so holds
// the prompts' caches) can look faster for a cached prompt than the prior
// says the idle, never-tried fast pods are for an uncached one, and keep
// all the traffic (live, the first A10G to answer took 64 requests of 64);
// each pod is tried before it is judged. The queue terms still count, so
// a burst does not all go to one new pod.
var latencyUnobserved = [numFeatures]float64{0, latencyPrior[1], latencyPrior[2], 0, latencyPrior[4]}

// predict returns the predicted TTFT in seconds, never negative. An
// endpoint with no observation predicts with latencyUnobserved when
// othersObserved (some other candidate has learned coefficients), else
// with the prior.
func (m *latencyModel) predict(x *[numFeatures]float64, othersObserved bool) float64 {
	c := m.coef.Load()
	if c == nil {
		c = &latencyPrior
		if othersObserved {
			c = &latencyUnobserved
		}
	}
	y := 0.0
	for i := range x {
		y += c[i] * x[i]
	}
	return max(y, 0)
}

// observe updates the model with one observed TTFT (seconds).
func (m *latencyModel) observe(x *[numFeatures]float64, y float64) {
	if math.IsNaN(y) || y < 0 {
		return
	}
	y = min(y, maxObservedTTFT)
	m.mu.Lock()
	defer m.mu.Unlock()
	theta := latencyPrior
	if c := m.coef.Load(); c != nil {
		theta = *c
	}
	if m.state == nil {
		m.state = &rlsState{}
		for i := range m.state.p {
			m.state.p[i][i] = latencyPriorVar
		}
	}
	st := m.state
	st.n++
	var px [numFeatures]float64
	den := latencyForget
	for i := range px {
		for j := range x {
			px[i] += st.p[i][j] * x[j]
		}
		den += x[i] * px[i]
	}
	e := y
	for i := range x {
		e -= theta[i] * x[i]
	}
	for i := range theta {
		theta[i] += px[i] / den * e
	}
	// A request queued ahead, or prefill queued ahead, never makes a first
	// token come sooner: keep those coefficients non-negative (projected
	// RLS). Unconstrained, the fit trades them against the others on
	// collinear features and can learn a negative one (a mixed fleet's
	// A10G learned −1.2 s per waiting request); the pod then looks faster
	// the more it is sent, and a burst herds onto it (Mooncake ×1.25: an
	// A10G predicted 0 s took ten requests in a row, TTFTs 30–70 s). The
	// batch and prefill terms are left free: on short prompts they also
	// stand for what the features miss (an H100 with a large batch is a
	// fast one), and bounding them cost 10% of Azure's goodput.
	theta[1] = max(theta[1], 0)
	theta[4] = max(theta[4], 0)
	for i := range st.p {
		for j := range st.p[i] {
			st.p[i][j] = (st.p[i][j] - px[i]*px[j]/den) / latencyForget
		}
	}
	// Keep every variance at most the prior's: a congruence by a diagonal
	// matrix keeps p symmetric positive definite.
	for i := range st.p {
		if v := st.p[i][i]; v > latencyPriorVar {
			f := math.Sqrt(latencyPriorVar / v)
			for j := range st.p {
				st.p[i][j] *= f
				st.p[j][i] *= f
			}
		}
	}
	m.coef.Store(&theta)
}

// observeWhole learns from a non-streamed answer, whose first byte came
// with its last token: y is the whole answer's time, decode included. It
// is a first token's time only as an upper bound, so it trains the model
// only until a streamed first token has been seen (a pool whose callers
// never stream still learns which pods answer sooner); after that it
// would teach every pod of the class that prefill costs what a whole
// answer does.
func (m *latencyModel) observeWhole(x *[numFeatures]float64, y float64) {
	if m.streamed.Load() {
		return
	}
	m.observe(x, y)
}

// observations is how many TTFTs the model has learned from.
func (m *latencyModel) observations() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state == nil {
		return 0
	}
	return m.state.n
}

// PrefillSeconds prices tokens uncached prompt tokens with the latency
// model: θ3·tokens/1000, θ3 averaged over eps' learned coefficients (the
// prior's when eps is empty). It is what a prompt that missed the prefix
// cache pays in time to first token, all else equal. An endpoint whose
// learned θ3 is not positive is priced with the prior's: prefilling more
// never makes a first token come sooner, so such a θ3 only says that
// noise (a host starved of CPU, queueing the features miss) drowned the
// prefill cost in its TTFTs, and a price of 0 would report lost cache
// hits as free.
func PrefillSeconds(eps []*Endpoint, tokens float64) float64 {
	perK := latencyPrior[3]
	if len(eps) > 0 {
		perK = 0
		for _, ep := range eps {
			c := ep.latency.Load().coef.Load()
			if c == nil || c[3] <= 0 {
				c = &latencyPrior
			}
			perK += c[3]
		}
		perK /= float64(len(eps))
	}
	return perK * tokens / 1000
}
