package ratelimit_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/ratelimit"
	"github.com/meridian-router/meridian/tier2/gossip"
	"github.com/meridian-router/meridian/tier2/gossip/faultnet"
)

// These tests run Limiters over real memberlist nodes on loopback, one per
// Region, on a shared fake clock. Payloads travel through memberlist for
// real, but reach the Limiter through an in-process delaying channel: the
// sender stamps each payload with its fake time, and the receiver queues
// it and merges it once the fake clock passes the stamp plus the one-way
// latency between the two Regions (40ms when the test injects an 80ms
// round trip, else none). Time advances in 1ms steps; every 100ms each
// instance syncs and broadcasts, and the test waits — on Merge events, not
// on sleeps — until every instance has received every peer's report of
// that sync before advancing the clock. What the Limiters see is then the
// same on any machine, however loaded: a slow machine only makes the test
// take longer in real time.

// delayed is the gossip channel of one instance: it stamps what it sends
// with the fake time and holds what it receives until it is due.
type delayed struct {
	c      *gossipCluster
	i      int
	mu     sync.Mutex
	queue  []inbound
	newest map[string]int64 // sender → newest stamp received
}

type inbound struct {
	due     int64 // fake unix nanoseconds
	from    string
	payload []byte
}

func stamp(t time.Time, p []byte) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(t.UnixNano())), p...)
}

func (d *delayed) LocalState() []byte {
	return stamp(d.c.clk.Now(), d.c.lims[d.i].LocalState())
}

func (d *delayed) Merge(from string, p []byte) {
	if len(p) < 8 {
		d.c.t.Errorf("unstamped payload from %s", from)
		return
	}
	sent := int64(binary.LittleEndian.Uint64(p))
	d.mu.Lock()
	d.queue = append(d.queue, inbound{due: sent + int64(d.c.oneWay), from: from, payload: p[8:]})
	d.newest[from] = max(d.newest[from], sent)
	d.mu.Unlock()
	select {
	case d.c.merged <- struct{}{}:
	default:
	}
}

// deliver merges, in order of due time, whatever is due at now.
func (d *delayed) deliver(now time.Time) {
	d.mu.Lock()
	var due []inbound
	kept := d.queue[:0]
	for _, m := range d.queue {
		if m.due <= now.UnixNano() {
			due = append(due, m)
		} else {
			kept = append(kept, m)
		}
	}
	d.queue = kept
	d.mu.Unlock()
	slices.SortStableFunc(due, func(a, b inbound) int { return int(a.due - b.due) })
	for _, m := range due {
		d.c.lims[d.i].Merge(m.from, m.payload)
	}
}

func (d *delayed) received(from string) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.newest[from]
}

type gossipCluster struct {
	t      *testing.T
	clk    *testkit.Clock
	oneWay time.Duration
	lims   []*ratelimit.Limiter
	chans  []*delayed
	nodes  []*gossip.Node
	merged chan struct{}
}

const gossipSync = 100 * time.Millisecond

func startGossipCluster(t *testing.T, n int, oneWay time.Duration, tenants map[string]*config.Tenant) *gossipCluster {
	t.Helper()
	c := &gossipCluster{
		t: t, clk: testkit.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		oneWay: oneWay, merged: make(chan struct{}, 1),
	}
	var cfgs []gossip.Config
	for i := range n {
		name := fmt.Sprintf("r%d", i)
		cfg := ratelimit.DefaultConfig(name)
		cfg.Now = c.clk.Now
		lim, err := ratelimit.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := lim.Update(tenants); err != nil {
			t.Fatal(err)
		}
		ch := &delayed{c: c, i: i, newest: map[string]int64{}}
		c.lims = append(c.lims, lim)
		c.chans = append(c.chans, ch)
		cfgs = append(cfgs, gossip.Config{
			Name: name, Region: name,
			Channels:          map[byte]gossip.Channel{gossip.ChannelRateLimit: ch},
			GossipInterval:    5 * time.Millisecond,
			PushPullInterval:  time.Second,
			ReconnectInterval: 200 * time.Millisecond,
			// Patient failure detection: on a loaded machine a 100ms probe
			// timeout had memberlist declare live nodes dead, stop gossiping
			// to them and leave each sync waiting for a reconnect (a 3-node
			// case took 335s at load average 60). The clock the Limiters see
			// is fake, so this changes nothing they decide. (memberlist's
			// probe goroutines outliving Close are ignored by TestMain.)
			ProbeInterval: 2 * time.Second,
			ProbeTimeout:  time.Second,
		})
	}
	c.nodes = faultnet.NewNetwork().Start(t, cfgs...)
	return c
}

// sync has the instances in syncing sync and broadcast, and waits until
// every other instance has received their reports.
func (c *gossipCluster) sync(syncing ...int) {
	c.t.Helper()
	now := c.clk.Now()
	for _, i := range syncing {
		for k, p := range c.lims[i].Sync() {
			if err := c.nodes[i].BroadcastLatest(gossip.ChannelRateLimit, strconv.Itoa(k), stamp(now, p)); err != nil {
				c.t.Fatal(err)
			}
		}
	}
	heard := func() bool {
		for i, ch := range c.chans {
			for _, j := range syncing {
				if i != j && ch.received(c.nodes[j].Name()) < now.UnixNano() {
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
			c.t.Fatalf("instances did not hear each other's sync within 30s")
		}
	}
}

// load is one tenant's offered requests per second on each instance as a
// function of the time since the start.
type load struct {
	tenant string
	rate   func(instance int, since time.Duration) float64
	acc    []float64
	// admitted[instance][window] counts admissions per 100ms window.
	admitted [][]int
}

// run advances the cluster by d in 1ms steps, offering each load evenly
// paced and syncing every gossipSync; at (if not nil) is called at every
// step before the load is offered.
func (c *gossipCluster) run(start time.Time, d time.Duration, loads []*load, at func(since time.Duration)) {
	c.t.Helper()
	end := c.clk.Now().Add(d)
	for c.clk.Now().Before(end) {
		c.clk.Advance(time.Millisecond)
		now := c.clk.Now()
		since := now.Sub(start)
		for _, ch := range c.chans {
			ch.deliver(now)
		}
		if at != nil {
			at(since)
		}
		w := int(since / (100 * time.Millisecond))
		for _, ld := range loads {
			for i, lim := range c.lims {
				for len(ld.admitted[i]) <= w {
					ld.admitted[i] = append(ld.admitted[i], 0)
				}
				ld.acc[i] += ld.rate(i, since) / 1000
				for ; ld.acc[i] >= 1; ld.acc[i]-- {
					if lim.AllowAt(now, ratelimit.Request{Tenant: ld.tenant}).Allowed {
						ld.admitted[i][w]++
					}
				}
			}
		}
		// Instance i syncs at its own phase, i × 37ms into each interval,
		// so that the latency between them decides what each has heard.
		var syncing []int
		for i := range c.lims {
			if (since-time.Duration(i)*37*time.Millisecond)%gossipSync == 0 {
				syncing = append(syncing, i)
			}
		}
		if len(syncing) > 0 {
			c.sync(syncing...)
		}
	}
}

func newLoad(tenant string, n int, rate func(int, time.Duration) float64) *load {
	return &load{tenant: tenant, rate: rate, acc: make([]float64, n), admitted: make([][]int, n)}
}

// between counts admissions per instance in [from, to) since the start.
func (ld *load) between(from, to time.Duration) []int {
	out := make([]int, len(ld.admitted))
	for i, ws := range ld.admitted {
		for w := int(from / (100 * time.Millisecond)); w < int(to/(100*time.Millisecond)) && w < len(ws); w++ {
			out[i] += ws[w]
		}
	}
	return out
}

func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

func perSecond(limit, burst int64) *config.Tenant {
	return &config.Tenant{Spec: config.TenantSpec{Limits: config.TenantLimit{
		Requests: &config.Rate{Limit: limit, Per: config.Duration(time.Second), Burst: burst},
	}}}
}

func perMinute(limit, burst int64) *config.Tenant {
	return &config.Tenant{Spec: config.TenantSpec{Limits: config.TenantLimit{
		Requests: &config.Rate{Limit: limit, Per: config.Duration(time.Minute), Burst: burst},
	}}}
}

// TestClusterOverMemberlist runs four tenants at once on 2 and 3
// instances, with and without an 80ms round trip between them:
//
//   - burst: busy on one instance for 3s, idle for 11s, then a burst of
//     2B requests at one instant spread over the instances. The first B
//     must be at least 90% admitted, and all 2B at most B + 10% + 1.
//   - paced and paced-small: from 2s to 22s, three (four) times the rate,
//     spread evenly: the total is burst + rate × time, ±10%.
//   - shift: twice its 1000/s rate, 80% on the first instance, moving to
//     the last at 8s: from 1s after the shift every 1s window admits the
//     rate ±5%, as does every steady window before it.
func TestClusterOverMemberlist(t *testing.T) {
	if testing.Short() {
		t.Skip("starts memberlist nodes")
	}
	const (
		burstR, burstB   = 50, 100
		pacedR, pacedB   = 10, 100
		smallB           = 10 // 60/min: 1/s
		shiftR, shiftB   = 1000, 100
		idleFrom, idleTo = 3 * time.Second, 14 * time.Second
		pacedFrom        = 2 * time.Second
		pacedTo          = 22 * time.Second
		shiftAt          = 8 * time.Second
	)
	tenants := map[string]*config.Tenant{
		"burst":       perSecond(burstR, burstB),
		"paced":       perSecond(pacedR, pacedB),
		"paced-small": perMinute(60, smallB),
		"shift":       perSecond(shiftR, shiftB),
	}
	cases := []struct {
		n      int
		oneWay time.Duration
	}{
		{2, 0}, {3, 0}, {2, 40 * time.Millisecond}, {3, 40 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%d instances, %v RTT", tc.n, 2*tc.oneWay), func(t *testing.T) {
			c := startGossipCluster(t, tc.n, tc.oneWay, tenants)
			// Let the instances hear each other (memberlist's join has
			// already exchanged state; one sync settles the shares).
			all := make([]int, tc.n)
			for i := range all {
				all[i] = i
			}
			c.sync(all...)
			start := c.clk.Now()
			busy := newLoad("burst", tc.n, func(i int, s time.Duration) float64 {
				if i == 0 && s < idleFrom {
					return 2 * burstR
				}
				return 0
			})
			paced := func(tenant string, total float64) *load {
				return newLoad(tenant, tc.n, func(i int, s time.Duration) float64 {
					if s < pacedFrom || s >= pacedTo {
						return 0
					}
					return total / float64(tc.n)
				})
			}
			pacedLoad, smallLoad := paced("paced", 3*pacedR), paced("paced-small", 4)
			// 80% of twice the rate on the first instance, the rest spread
			// over the others; at shiftAt the first and last swap.
			shift := newLoad("shift", tc.n, func(i int, s time.Duration) float64 {
				heavy := 0
				if s >= shiftAt {
					heavy = tc.n - 1
				}
				if i == heavy {
					return 0.8 * 2 * shiftR
				}
				return 0.2 * 2 * shiftR / float64(tc.n-1)
			})
			var burstFirst, burstAll int
			at := func(s time.Duration) {
				if s != idleTo {
					return
				}
				for k := range 2 * burstB {
					if c.lims[k%tc.n].AllowAt(c.clk.Now(), ratelimit.Request{Tenant: "burst"}).Allowed {
						burstAll++
						if k < burstB {
							burstFirst++
						}
					}
				}
			}
			c.run(start, pacedTo, []*load{busy, pacedLoad, smallLoad, shift}, at)

			// The burst after idling: the whole burst, not one slice of it.
			if burstFirst < burstB*9/10 || float64(burstAll) > 1.1*burstB+1 {
				t.Errorf("burst after %v idle: %d of the first %d admitted (want ≥ %d), %d of %d in all (want ≤ %.0f)",
					idleTo-idleFrom, burstFirst, burstB, burstB*9/10, burstAll, 2*burstB, 1.1*burstB+1)
			}
			t.Logf("burst after idling: %d of the first %d, %d of %d", burstFirst, burstB, burstAll, 2*burstB)

			// Paced above the rate: burst + rate × time.
			span := (pacedTo - pacedFrom).Seconds()
			for _, p := range []struct {
				ld          *load
				rate, burst float64
			}{{pacedLoad, pacedR, pacedB}, {smallLoad, 1, smallB}} {
				got := float64(sum(p.ld.between(pacedFrom, pacedTo)))
				want := p.burst + p.rate*span
				// ±10%, as issue 16 asks (1e-9: 0.9 × 30 is not 27 in
				// floating point). The small limit over three instances
				// sits at the edge, 27 of 30: each instance but one may
				// hold the fraction of a request unspent at the end
				// (docs/rate-limits.md: stranded fractions).
				if got < 0.9*want-1e-9 || got > 1.1*want+1e-9 {
					t.Errorf("%s: paced above the rate admitted %.0f in %.0fs, want burst + rate × time = %.0f ±10%% (per instance %v)",
						p.ld.tenant, got, span, want, p.ld.between(pacedFrom, pacedTo))
				}
				t.Logf("%s: admitted %.0f, burst + rate × time = %.0f", p.ld.tenant, got, want)
			}

			// The shifting tenant: every whole second from 1s on, except
			// the one after the shift, admits the rate ±5%.
			var worst float64
			for from := time.Second; from+time.Second <= pacedTo; from += time.Second {
				if from >= shiftAt && from < shiftAt+time.Second {
					continue
				}
				per := shift.between(from, from+time.Second)
				got := float64(sum(per))
				if !within(got, shiftR, 0.05) {
					t.Errorf("shift: [%v, %v) admitted %.0f, want %d ±5%% (per instance %v)", from, from+time.Second, got, shiftR, per)
				}
				worst = math.Max(worst, math.Abs(got-shiftR)/shiftR)
			}
			t.Logf("shift: worst whole second %.1f%% off the rate; second after the shift %v", 100*worst, shift.between(shiftAt, shiftAt+time.Second))
		})
	}
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}
