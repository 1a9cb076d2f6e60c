package ratelimit_test

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/ratelimit"
	"github.com/meridian-router/meridian/tier2/gossip"
	"github.com/meridian-router/meridian/tier2/gossip/gossiptest"
)

// These tests run Limiters over real memberlist nodes on loopback, through
// gossiptest's fault-injecting transport (80ms round trips between
// Regions, 10% loss, partitions). The Limiters share a fake clock that the
// test advances in sync rounds of 100ms; after each round the test waits —
// on Merge events, not on sleeps — until every instance has heard every
// reachable peer's report of that round, so the outcome does not depend on
// how fast the machine is.

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// observed signals merged after each Merge, so the test can wait for news.
type observed struct {
	*ratelimit.Limiter
	merged chan struct{}
}

func (o *observed) Merge(from string, payload []byte) {
	o.Limiter.Merge(from, payload)
	select {
	case o.merged <- struct{}{}:
	default:
	}
}

type gossipCluster struct {
	t        *testing.T
	clk      *fakeClock
	net      *gossiptest.Network
	lims     []*ratelimit.Limiter
	nodes    []*gossip.Node
	regions  []string
	demand   []float64 // requests per second per instance
	acc      []float64
	admitted []int // per Region, since the last reset
	merged   chan struct{}
}

const (
	gossipR        = 1000 // requests per second
	gossipRound    = 100 * time.Millisecond
	gossipStep     = 10 * time.Millisecond
	gossipPerRound = int(gossipRound / gossipStep)
)

func startGossipCluster(t *testing.T, regions []string, perRegion int) *gossipCluster {
	t.Helper()
	c := &gossipCluster{
		t: t, clk: &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
		net: gossiptest.NewNetwork(), merged: make(chan struct{}, 1),
		admitted: make([]int, len(regions)),
	}
	for _, a := range regions {
		c.net.Delay(gossiptest.Region(a), gossiptest.Not(gossiptest.Region(a)), 40*time.Millisecond)
	}
	tenants := map[string]*config.Tenant{"acme": {Spec: config.TenantSpec{Limits: config.TenantLimit{
		// A burst of 100ms' worth keeps the transients (each instance
		// spending what its bucket held when its share shrank) short.
		Requests: &config.Rate{Limit: gossipR * 60, Per: config.Duration(time.Minute), Burst: gossipR / 10},
	}}}}
	var cfgs []gossip.Config
	for _, region := range regions {
		for i := range perRegion {
			name := fmt.Sprintf("%s-%d", region, i)
			cfg := ratelimit.DefaultConfig(name)
			cfg.Now = c.clk.Now
			// Every round waits for all reports, so a peer silent for
			// three rounds is cut off; hold its share then.
			cfg.StaleAfter = 300 * time.Millisecond
			lim, err := ratelimit.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := lim.Update(tenants); err != nil {
				t.Fatal(err)
			}
			c.lims = append(c.lims, lim)
			c.regions = append(c.regions, region)
			cfgs = append(cfgs, gossip.Config{
				Name: name, Region: region,
				Channels:          map[byte]gossip.Channel{gossip.ChannelRateLimit: &observed{lim, c.merged}},
				GossipInterval:    10 * time.Millisecond,
				PushPullInterval:  500 * time.Millisecond,
				ReconnectInterval: 200 * time.Millisecond,
				// A short probe interval also bounds how long memberlist's
				// probe goroutines outlive Close (goleak checks at exit).
				ProbeInterval: 200 * time.Millisecond,
				ProbeTimeout:  100 * time.Millisecond,
			})
		}
	}
	c.demand = make([]float64, len(c.lims))
	c.acc = make([]float64, len(c.lims))
	c.nodes = c.net.Start(t, cfgs...)
	// Loss between Regions starts once the cluster has formed: gossiptest
	// applies Drop rules to join dials too.
	for i, a := range regions {
		for _, b := range regions[i+1:] {
			c.net.Drop(gossiptest.Region(a), gossiptest.Region(b), 0.1)
		}
	}
	return c
}

func (c *gossipCluster) setDemand(total float64, split map[string]float64) {
	count := map[string]int{}
	for _, r := range c.regions {
		count[r]++
	}
	for i, r := range c.regions {
		c.demand[i] = total * split[r] / float64(count[r])
	}
}

func (c *gossipCluster) regionIndex(r string) int {
	for i, x := range []string{"a", "b", "c"} {
		if x == r {
			return i
		}
	}
	return -1
}

// round offers one round of demand, syncs and broadcasts every instance,
// and waits until each instance i has heard this round from every j with
// reach(i, j).
func (c *gossipCluster) round(reach func(i, j int) bool) {
	c.t.Helper()
	for range gossipPerRound {
		c.clk.Advance(gossipStep)
		now := c.clk.Now()
		for i, lim := range c.lims {
			c.acc[i] += c.demand[i] * gossipStep.Seconds()
			for ; c.acc[i] >= 1; c.acc[i]-- {
				if lim.AllowAt(now, ratelimit.Request{Tenant: "acme"}).Allowed {
					c.admitted[c.regionIndex(c.regions[i])]++
				}
			}
		}
	}
	seq := uint64(c.clk.Now().UnixNano())
	for i, lim := range c.lims {
		for k, p := range lim.Sync() {
			if err := c.nodes[i].BroadcastLatest(gossip.ChannelRateLimit, strconv.Itoa(k), p); err != nil {
				c.t.Fatal(err)
			}
		}
	}
	heard := func() bool {
		for i, lim := range c.lims {
			got := map[string]uint64{}
			for _, p := range lim.Peers() {
				got[p.Instance] = p.Seq
			}
			for j := range c.lims {
				if j != i && reach(i, j) && got[c.nodes[j].Name()] < seq {
					return false
				}
			}
		}
		return true
	}
	giveUp := time.After(30 * time.Second) // a failure bound, not a wait
	for !heard() {
		select {
		case <-c.merged:
		case <-giveUp:
			c.t.Fatalf("instances did not hear each other's round within 30s")
		}
	}
}

func everyone(i, j int) bool { return true }

func (c *gossipCluster) rounds(n int, reach func(i, j int) bool) []int {
	c.t.Helper()
	c.admitted = make([]int, len(c.admitted))
	start := time.Now()
	for range n {
		c.round(reach)
	}
	c.t.Logf("%d rounds took %v", n, time.Since(start))
	return c.admitted
}

func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

func TestOverMemberlist(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six memberlist nodes")
	}
	c := startGossipCluster(t, []string{"a", "b", "c"}, 2)
	c.setDemand(2*gossipR, map[string]float64{"a": .8, "b": .15, "c": .05})
	c.rounds(8, everyone)

	// Steady state: the global total is the limit, split as demand is.
	per := c.rounds(6, everyone)
	if got := float64(sum(per)) / 0.6; !within(got, gossipR, 0.05) {
		t.Fatalf("steady state admitted %.0f/s, want %d ±5%% (per Region %v)", got, gossipR, per)
	}
	t.Logf("steady state: %v per Region over 0.6s", per)

	// Demand shifts from a to c: from 0.8s on, the total is at the limit
	// and c gets the lion's share.
	c.setDemand(2*gossipR, map[string]float64{"a": .05, "b": .15, "c": .8})
	c.rounds(8, everyone)
	per = c.rounds(6, everyone)
	if got := float64(sum(per)) / 0.6; !within(got, gossipR, 0.05) || float64(per[2]) < 0.75*float64(sum(per)) {
		t.Fatalf("0.8-1.4s after the shift admitted %v per Region, want %d ±5%% with ≥75%% in c", per, gossipR)
	}

	// Region a is cut off and its demand jumps sixteenfold. Both sides
	// keep the shares they had: the total stays at the limit.
	c.net.Partition(gossiptest.Region("a"), gossiptest.Not(gossiptest.Region("a")))
	c.setDemand(2*gossipR, map[string]float64{"a": .8, "b": .15, "c": .8})
	side := func(i, j int) bool { return (c.regions[i] == "a") == (c.regions[j] == "a") }
	c.rounds(4, side)
	per = c.rounds(5, side)
	if got := float64(sum(per)) * 2; !within(got, gossipR, 0.05) {
		t.Fatalf("during the partition admitted %.0f/s, want %d ±5%% (per Region %v)", got, gossipR, per)
	}

	// Healed (Heal removes the loss rules too), and demand moves back to
	// a: shares follow.
	c.net.Heal()
	c.setDemand(2*gossipR, map[string]float64{"a": .8, "b": .15, "c": .05})
	c.rounds(8, everyone)
	per = c.rounds(6, everyone)
	if got := float64(sum(per)) / 0.6; !within(got, gossipR, 0.05) || float64(per[0]) < 0.75*float64(sum(per)) {
		t.Fatalf("after healing admitted %v per Region, want %d ±5%% with ≥75%% in a", per, gossipR)
	}
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}
