package ratelimit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
)

// An in-process cluster of Limiters on one fake clock. Payloads travel
// through a queue that delays each by the one-way latency between the two
// instances' Regions, drops some, and drops all across a partition. Time
// advances in 1ms steps; each instance turns its demand (requests per
// second) into evenly spaced Allow calls and syncs every SyncInterval at
// its own phase, broadcasting its entry to every other instance, and does a
// push/pull of LocalState with one random peer each second.

type simNode struct {
	l        *Limiter
	region   int
	demand   float64 // requests per second offered to this instance
	nextSync time.Time
	nextPush time.Time
	down     bool
}

type simMsg struct {
	due      time.Time
	from, to int
	payload  []byte
}

type simCluster struct {
	t       *testing.T
	clk     *clock
	cfg     Config
	nodes   []*simNode
	queue   []simMsg
	rng     *rand.Rand
	oneWay  func(a, b int) time.Duration // between Regions
	drop    float64
	cut     func(a, b int) bool // Regions that cannot talk
	tokens  int64               // estimate per request
	used    int64               // real usage per request, settled at once
	tenants map[string]*config.Tenant

	// admitted[region][window] counts admissions per 100ms window.
	admitted [][]int
}

const simWindow = 100 * time.Millisecond

func newSimCluster(t *testing.T, regions, perRegion int, tenants map[string]*config.Tenant, mod func(*Config)) *simCluster {
	t.Helper()
	c := &simCluster{
		t: t, clk: &clock{now: epoch}, rng: rand.New(rand.NewPCG(1, 2)), tenants: tenants,
		oneWay: func(a, b int) time.Duration {
			if a == b {
				return time.Millisecond
			}
			return 40 * time.Millisecond // 80ms round trip across Regions
		},
		cut:      func(a, b int) bool { return false },
		admitted: make([][]int, regions),
	}
	for r := range regions {
		for i := range perRegion {
			cfg := DefaultConfig(fmt.Sprintf("r%d-%d", r, i))
			cfg.Now = c.clk.Now
			if mod != nil {
				mod(&cfg)
			}
			c.cfg = cfg
			l := newWith(t, cfg, tenants)
			phase := time.Duration(c.rng.Int64N(int64(cfg.SyncInterval)))
			c.nodes = append(c.nodes, &simNode{
				l: l, region: r,
				nextSync: epoch.Add(phase),
				nextPush: epoch.Add(phase + time.Duration(c.rng.Int64N(int64(time.Second)))),
			})
		}
	}
	return c
}

// setDemand spreads total requests per second over the Regions by split,
// evenly over each Region's instances.
func (c *simCluster) setDemand(total float64, split ...float64) {
	perRegion := map[int]int{}
	for _, n := range c.nodes {
		perRegion[n.region]++
	}
	for _, n := range c.nodes {
		n.demand = total * split[n.region] / float64(perRegion[n.region])
	}
}

// poisson draws the number of arrivals in one step (Knuth; λ is small).
func poisson(rng *rand.Rand, lambda float64) int {
	if lambda <= 0 {
		return 0
	}
	l, k, p := math.Exp(-lambda), 0, 1.0
	for {
		p *= rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

func (c *simCluster) send(from, to int, p []byte) {
	a, b := c.nodes[from], c.nodes[to]
	if a.down || b.down || c.cut(a.region, b.region) || c.rng.Float64() < c.drop {
		return
	}
	c.queue = append(c.queue, simMsg{due: c.clk.now.Add(c.oneWay(a.region, b.region)), from: from, to: to, payload: p})
}

// run advances the cluster by d.
func (c *simCluster) run(d time.Duration) {
	end := c.clk.now.Add(d)
	for c.clk.now.Before(end) {
		c.clk.Advance(time.Millisecond)
		now := c.clk.now
		w := int(now.Sub(epoch) / simWindow)
		for r := range c.admitted {
			for len(c.admitted[r]) <= w {
				c.admitted[r] = append(c.admitted[r], 0)
			}
		}
		// Deliver what is due.
		kept := c.queue[:0]
		for _, m := range c.queue {
			if m.due.After(now) {
				kept = append(kept, m)
				continue
			}
			if !c.nodes[m.to].down && !c.cut(c.nodes[m.from].region, c.nodes[m.to].region) {
				c.nodes[m.to].l.Merge(c.nodes[m.from].l.cfg.Instance, m.payload)
			}
		}
		c.queue = kept
		for i, n := range c.nodes {
			if n.down {
				continue
			}
			for range poisson(c.rng, n.demand/1000) {
				dec := n.l.AllowAt(now, Request{Tenant: "acme", Tokens: c.tokens})
				if dec.Allowed {
					c.admitted[n.region][w]++
					n.l.SettleAt(now, dec.Ticket, c.used)
				}
			}
			if !now.Before(n.nextSync) {
				for _, p := range n.l.SyncAt(now) {
					for j := range c.nodes {
						if j != i {
							c.send(i, j, p)
						}
					}
				}
				n.nextSync = n.nextSync.Add(c.cfg.SyncInterval)
			}
			if !now.Before(n.nextPush) {
				j := c.rng.IntN(len(c.nodes))
				if j != i {
					c.send(i, j, n.l.LocalState())
					c.send(j, i, c.nodes[j].l.LocalState())
				}
				n.nextPush = n.nextPush.Add(time.Second)
			}
		}
	}
}

// admittedBetween counts admissions per Region in [from, to) since epoch.
func (c *simCluster) admittedBetween(from, to time.Duration) []int {
	out := make([]int, len(c.admitted))
	for r, ws := range c.admitted {
		for w := int(from / simWindow); w < int(to/simWindow) && w < len(ws); w++ {
			out[r] += ws[w]
		}
	}
	return out
}

// rate is the admissions per second in [from, to) since epoch, all Regions.
func (c *simCluster) rate(from, to time.Duration) float64 {
	return float64(sum(c.admittedBetween(from, to))) / (to - from).Seconds()
}

// regionShares sums the instances' shares of the tenant's first limit per Region.
func (c *simCluster) regionShares() []float64 {
	out := make([]float64, len(c.admitted))
	for _, n := range c.nodes {
		if n.down {
			continue
		}
		t := (*n.l.tenants.Load())["acme"]
		t.mu.Lock()
		out[n.region] += t.all[0].share
		t.mu.Unlock()
	}
	return out
}

func sum[T int | float64](xs []T) T {
	var s T
	for _, x := range xs {
		s += x
	}
	return s
}

// reconvergence runs the cluster until every Region's share is within tol
// of want and stays there for hold, and returns how long that took from
// the start of the call (the moment the shift happened).
func (c *simCluster) reconvergence(want []float64, tol float64, limit, hold time.Duration) time.Duration {
	start := c.clk.now
	var since time.Time
	for c.clk.now.Sub(start) < limit+hold {
		c.run(10 * time.Millisecond)
		ok := true
		for r, s := range c.regionShares() {
			if math.Abs(s-want[r]) > tol {
				ok = false
			}
		}
		switch {
		case !ok:
			since = time.Time{}
		case since.IsZero():
			since = c.clk.now
		case c.clk.now.Sub(since) >= hold:
			return since.Sub(start)
		}
	}
	return -1
}

func acmeRequests(perSec, burst int64) map[string]*config.Tenant {
	return map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{Requests: rate(perSec*60, time.Minute, burst)})}
}

func acmeTokens(perSec, burst int64) map[string]*config.Tenant {
	return map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{Tokens: rate(perSec*60, time.Minute, burst)})}
}

func TestGlobalAccuracy(t *testing.T) {
	const R = 1000 // units per second
	cases := []struct {
		name     string
		tenants  map[string]*config.Tenant
		perUnit  float64 // units per request
		tokens   int64   // estimate
		used     int64   // settled
		demand   float64 // requests per second, all Regions
		split    []float64
		drop     float64
		wantRate float64 // admitted units per second
		// wantSplit is each Region's part of the admissions when it is
		// not its part of the demand: an instance offered more than the
		// whole limit counts only the limit as demand (refused retries
		// claim no share). Nil means split.
		wantSplit []float64
	}{
		{name: "requests 80/15/5 at 2x", tenants: acmeRequests(R, R), perUnit: 1, demand: 2 * R, split: []float64{.8, .15, .05}, wantRate: R},
		// Region 0's instances are offered 4R/3 each and count R: 3R,
		// 0.75R and 0.25R of demand.
		{name: "requests 80/15/5 at 5x", tenants: acmeRequests(R, R), perUnit: 1, demand: 5 * R, split: []float64{.8, .15, .05}, wantRate: R, wantSplit: []float64{.75, .1875, .0625}},
		{name: "requests 80/15/5 with 20% loss", tenants: acmeRequests(R, R), perUnit: 1, demand: 2 * R, split: []float64{.8, .15, .05}, drop: .2, wantRate: R},
		{name: "idle Regions give their capacity away", tenants: acmeRequests(R, R), perUnit: 1, demand: 2 * R, split: []float64{1, 0, 0}, wantRate: R},
		{name: "even split", tenants: acmeRequests(R, R), perUnit: 1, demand: 1.5 * R, split: []float64{1. / 3, 1. / 3, 1. / 3}, wantRate: R},
		{name: "under the limit admits all", tenants: acmeRequests(R, R), perUnit: 1, demand: 0.5 * R, split: []float64{.8, .15, .05}, wantRate: 0.5 * R},
		// Tokens: the estimate is 4x real usage; what counts is real usage.
		{name: "tokens 80/15/5, settled at a quarter", tenants: acmeTokens(50*R, 50*R), perUnit: 50, tokens: 200, used: 50, demand: 2 * R, split: []float64{.8, .15, .05}, wantRate: 50 * R},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newSimCluster(t, 3, 3, tc.tenants, nil)
			c.drop, c.tokens, c.used = tc.drop, tc.tokens, tc.used
			c.setDemand(tc.demand, tc.split...)
			c.run(25 * time.Second)
			per := c.admittedBetween(5*time.Second, 25*time.Second)
			got := float64(sum(per)) * tc.perUnit / 20
			if math.Abs(got-tc.wantRate)/tc.wantRate > 0.05 {
				t.Fatalf("admitted %.0f units/s, want %.0f ±5%% (per Region %v)", got, tc.wantRate, per)
			}
			// Each Region gets what a single global bucket would give it:
			// a fraction of the admissions equal to its fraction of demand.
			want := tc.split
			if tc.wantSplit != nil {
				want = tc.wantSplit
			}
			for r, n := range per {
				if f := float64(n) / float64(sum(per)); math.Abs(f-want[r]) > 0.05 {
					t.Errorf("Region %d admitted %.3f of the total, want %.3f ±0.05", r, f, want[r])
				}
			}
			t.Logf("admitted %.1f units/s (%+.2f%%), per Region %v", got, 100*(got-tc.wantRate)/tc.wantRate, per)
		})
	}
}

func TestDemandShiftReconverges(t *testing.T) {
	const R = 1000
	c := newSimCluster(t, 3, 3, acmeRequests(R, R), nil)
	c.setDemand(2*R, .8, .15, .05)
	c.run(15 * time.Second)
	for r, s := range c.regionShares() {
		if want := []float64{.8, .15, .05}[r]; math.Abs(s-want) > 0.05 {
			t.Fatalf("not converged before the shift: shares %v", c.regionShares())
		}
	}

	// The heavy demand moves from Region 0 to Region 2.
	c.setDemand(2*R, .05, .15, .8)
	shift := c.clk.now.Sub(epoch)
	took := c.reconvergence([]float64{.05, .15, .8}, 0.05, 2*time.Second, 3*time.Second)
	if took < 0 || took > 2*time.Second {
		t.Fatalf("shares re-converged after %v, want ≤ 2s; shares now %v", took, c.regionShares())
	}
	t.Logf("re-converged in %v", took)
	c.run(shift + 5*time.Second - c.clk.now.Sub(epoch))
	// And the total stayed near the limit through the shift, in every
	// whole second from the shift on: the Region whose demand fell
	// releases the refill it no longer uses to those that ran dry.
	for from := shift; from < shift+5*time.Second; from += time.Second {
		per := c.admittedBetween(from, from+time.Second)
		if got := float64(sum(per)); math.Abs(got-R)/R > 0.05 {
			t.Errorf("admitted %.0f in [%v, %v) after the shift, want %d ±5%% (per Region %v)", got, from-shift, from-shift+time.Second, R, per)
		}
	}
}

func TestPartitionAndHeal(t *testing.T) {
	const R = 1000
	cases := []struct {
		name        string
		peerTimeout time.Duration
		// wantMax is the documented bound on the admitted rate during the
		// partition, in units of R: the limit while peers' shares are
		// held; one limit per side once they expire. Here Region 0 has 80%
		// of a demand of 2R and the other side 20% of it (0.4R, under the
		// limit), so after expiry the total is R + 0.4R.
		wantMax float64
		wantMin float64
		// grow multiplies the cut-off Region's demand during the partition.
		grow float64
	}{
		{"shorter than PeerTimeout: shares held", 30 * time.Second, 1.05, 0.95, 1},
		{"demand grows on the cut-off side: shares still held", 30 * time.Second, 1.05, 0.95, 3},
		// Region 0 falls to 0.08R but holds 0.8 of the limit; the other
		// side, demanding 0.4R, keeps its 0.2: 0.28R in all. Holding
		// trades this idle capacity for the bound.
		{"demand collapses on the cut-off side: its share is held unused", 30 * time.Second, 0.31, 0.25, 0.05},
		{"longer than PeerTimeout: each side takes the limit", 3 * time.Second, 2.0, 1.35, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newSimCluster(t, 3, 2, acmeRequests(R, R), func(cfg *Config) { cfg.PeerTimeout = tc.peerTimeout })
			c.setDemand(2*R, .8, .15, .05)
			c.run(10 * time.Second)

			// Region 0 is cut off from Regions 1 and 2 for 10s.
			c.cut = func(a, b int) bool { return (a == 0) != (b == 0) }
			c.setDemand(2*R, .8*tc.grow, .15, .05)
			start := c.clk.now.Sub(epoch)
			c.run(10 * time.Second)
			// Skip the first PeerTimeout plus a second: the steady state
			// of the partition is what the bound is about.
			from := start + min(tc.peerTimeout+time.Second, 5*time.Second)
			per := c.admittedBetween(from, start+10*time.Second)
			got := float64(sum(per)) / (start + 10*time.Second - from).Seconds() / R
			if got > tc.wantMax || got < tc.wantMin {
				t.Fatalf("during the partition admitted %.3f R, want in [%.2f, %.2f] R (per Region %v)", got, tc.wantMin, tc.wantMax, per)
			}
			t.Logf("during the partition: %.3f R", got)

			// Heal: the shares come back to the demand split.
			c.cut = func(a, b int) bool { return false }
			c.setDemand(2*R, .8, .15, .05)
			heal := c.clk.now.Sub(epoch)
			took := c.reconvergence([]float64{.8, .15, .05}, 0.05, 2*time.Second, 3*time.Second)
			if took < 0 || took > 2*time.Second {
				t.Fatalf("after healing, re-converged in %v, want ≤ 2s; shares %v", took, c.regionShares())
			}
			c.run(heal + 5*time.Second - c.clk.now.Sub(epoch))
			if got := c.rate(heal+2*time.Second, heal+5*time.Second); math.Abs(got-R)/R > 0.05 {
				t.Errorf("after healing admitted %.0f/s, want %d ±5%%", got, R)
			}
		})
	}
}

// steadyTrio is three instances in one Region, acme limited to r requests
// a second, after 5 s of a demand of 2r.
func steadyTrio(t *testing.T, r int64) *simCluster {
	t.Helper()
	c := newSimCluster(t, 1, 3, acmeRequests(r, r), nil)
	c.setDemand(2*float64(r), 1)
	c.run(5 * time.Second)
	return c
}

func TestLeaveReleasesShare(t *testing.T) {
	const R = 1000
	c := steadyTrio(t, R)
	// Instance 0 shuts down cleanly; the other two take the limit.
	gone := c.nodes[0]
	for _, p := range gone.l.Leave() {
		c.send(0, 1, p)
		c.send(0, 2, p)
	}
	gone.down = true
	c.nodes[1].demand, c.nodes[2].demand = R, R
	start := c.clk.now.Sub(epoch)
	c.run(3 * time.Second)
	if got := c.rate(start+time.Second, start+3*time.Second); math.Abs(got-R)/R > 0.05 {
		t.Fatalf("after a clean leave, admitted %.0f/s, want %d ±5%%", got, R)
	}
}

func TestNewInstanceStartsSmall(t *testing.T) {
	const R = 1000
	c := steadyTrio(t, R)
	// A fourth instance starts: until it hears a peer it holds
	// InitialShare, not the whole limit.
	cfg := c.cfg
	cfg.Instance = "late"
	l := newWith(t, cfg, c.tenants)
	late := &simNode{l: l, region: 0, demand: 2 * R / 3, nextSync: c.clk.now, nextPush: c.clk.now.Add(time.Second)}
	for _, n := range c.nodes {
		n.demand = 2 * R / 4
	}
	late.demand = 2 * R / 4
	if s := l.SyncAt(c.clk.now); len(s) != 1 || (*l.tenants.Load())["acme"].all[0].share != cfg.InitialShare {
		t.Fatalf("new instance share %v, want InitialShare %v", (*l.tenants.Load())["acme"].all[0].share, cfg.InitialShare)
	}
	c.nodes = append(c.nodes, late)
	start := c.clk.now.Sub(epoch)
	c.run(5 * time.Second)
	if got := c.rate(start, start+5*time.Second); math.Abs(got-R)/R > 0.05 {
		t.Fatalf("with an instance joining, admitted %.0f/s, want %d ±5%%", got, R)
	}
	if s := c.regionShares()[0]; math.Abs(s-1) > 0.05 {
		t.Fatalf("shares sum to %.3f after the join, want 1", s)
	}
}
