package gossip_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	regionspkg "github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/tier2/gossip"
	"github.com/meridian-router/meridian/tier2/gossip/faultnet"
)

// set is a grow-only set of strings: the simplest Channel that converges
// both by broadcast (one item) and by push/pull (all items, one per line).
// It also counts members through MemberObserver.
type set struct {
	mu      sync.Mutex
	items   map[string]time.Time
	waiters map[string][]chan struct{}
	members map[string]bool
	mwait   []memberWaiter
}

type memberWaiter struct {
	cond func(map[string]bool) bool
	ch   chan struct{}
}

func newSet() *set {
	return &set{items: map[string]time.Time{}, waiters: map[string][]chan struct{}{}, members: map[string]bool{}}
}

func (s *set) LocalState() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.items))
	for k := range s.items {
		keys = append(keys, k)
	}
	return []byte(strings.Join(keys, "\n"))
}

func (s *set) Merge(_ string, payload []byte) {
	if len(payload) == 0 {
		return
	}
	for _, item := range strings.Split(string(payload), "\n") {
		s.Add(item)
	}
}

func (s *set) Add(item string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.items[item]; ok {
		return
	}
	s.items[item] = time.Now()
	for _, ch := range s.waiters[item] {
		close(ch)
	}
	delete(s.waiters, item)
}

// Has reports whether item arrived, and when.
func (s *set) Has(item string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.items[item]
	return at, ok
}

// Wait returns a channel closed once item is present.
func (s *set) Wait(item string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	if _, ok := s.items[item]; ok {
		close(ch)
		return ch
	}
	s.waiters[item] = append(s.waiters[item], ch)
	return ch
}

func (s *set) MemberJoined(m gossip.Member) { s.memberEvent(m.Name, true) }
func (s *set) MemberLeft(name string)       { s.memberEvent(name, false) }

func (s *set) memberEvent(name string, alive bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.members[name] = alive
	kept := s.mwait[:0]
	for _, w := range s.mwait {
		if w.cond(s.members) {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	s.mwait = kept
}

// WaitMembers returns a channel closed once cond holds over the members
// this node has seen (name → alive).
func (s *set) WaitMembers(cond func(map[string]bool) bool) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	if cond(s.members) {
		close(ch)
	} else {
		s.mwait = append(s.mwait, memberWaiter{cond, ch})
	}
	return ch
}

func alive(names ...string) func(map[string]bool) bool {
	return func(m map[string]bool) bool {
		for _, n := range names {
			if !m[n] {
				return false
			}
		}
		return true
	}
}

func gone(names ...string) func(map[string]bool) bool {
	return func(m map[string]bool) bool {
		for _, n := range names {
			if a, seen := m[n]; !seen || a {
				return false
			}
		}
		return true
	}
}

// bound is how long a test waits for something that should take well under
// a second: a deadline for failing, not a timing assertion.
const bound = 60 * time.Second

func await(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(bound):
		t.Fatalf("gave up after %v waiting for %s", bound, what)
	}
}

type cluster struct {
	net    *faultnet.Network
	nodes  []*gossip.Node
	sets   []*set
	stores []*watchedStore // regions.DigestStore on gossip.ChannelRegions
	names  []string
}

// startCluster starts n nodes; regions[i%len(regions)] is node i's Region.
func startCluster(t testing.TB, n int, regions []string, tune func(*gossip.Config)) *cluster {
	t.Helper()
	return startClusterOn(t, faultnet.NewNetwork(), n, regions, tune)
}

// startClusterOn is startCluster on a network whose faults are already set.
func startClusterOn(t testing.TB, net *faultnet.Network, n int, regions []string, tune func(*gossip.Config)) *cluster {
	t.Helper()
	c := &cluster{net: net}
	cfgs := make([]gossip.Config, n)
	for i := range cfgs {
		s := newSet()
		c.sets = append(c.sets, s)
		ds := &watchedStore{DigestStore: regionspkg.NewDigestStore(5*time.Second, nil)}
		c.stores = append(c.stores, ds)
		name := fmt.Sprintf("t2-%02d", i)
		c.names = append(c.names, name)
		cfgs[i] = gossip.Config{
			Name:     name,
			Region:   regions[i%len(regions)],
			Channels: map[byte]gossip.Channel{gossip.ChannelTest: s, gossip.ChannelRegions: ds},
			// Probes patient enough for a loaded test machine; gossip
			// itself keeps the profile's interval.
			ProbeTimeout: 500 * time.Millisecond,
		}
		if tune != nil {
			tune(&cfgs[i])
		}
	}
	start := time.Now()
	c.nodes = c.net.Start(t, cfgs...)
	for i, ds := range c.stores {
		node := c.nodes[i]
		ds.SetPublish(func(key string, payload []byte) error {
			return node.BroadcastLatest(gossip.ChannelRegions, key, payload)
		})
	}
	for i, s := range c.sets {
		await(t, s.WaitMembers(alive(c.names...)), fmt.Sprintf("%s to see all %d members", c.names[i], n))
	}
	t.Logf("%d nodes started and saw each other in %v", n, time.Since(start))
	return c
}

// spread broadcasts item from node i and returns how long until the last
// other node had it.
func (c *cluster) spread(t testing.TB, i int, item string) time.Duration {
	t.Helper()
	start := time.Now()
	if err := c.nodes[i].Broadcast(gossip.ChannelTest, []byte(item)); err != nil {
		t.Fatal(err)
	}
	c.sets[i].Add(item)
	var last time.Time
	for j, s := range c.sets {
		await(t, s.Wait(item), fmt.Sprintf("%s to receive %q", c.names[j], item))
		at, _ := s.Has(item)
		if at.After(last) {
			last = at
		}
	}
	return last.Sub(start)
}

// TestThirtyNodes measures how long a broadcast, and a pool-health digest
// wired as Tier-2 wires it, take to reach all of 30 memberlist nodes, and
// asserts it against the convergence goal (a change reaches every node
// within 1 s) with the slack below.
func TestThirtyNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("30 memberlist nodes")
	}
	// Failure detection is out of this test's way: probes once a minute
	// (memberlist's suspicion timeout scales with the probe interval), so
	// a starved machine that delays a probe reply cannot make a member
	// suspect, dead and rejoining while the test waits for all 30. Under
	// load averages of 30–90 on 2 cores, 1 s probes flapped until the
	// 60 s bound. Joins get 30 s (gossiptest gives 10 s): 29 nodes join
	// through node 0, and at load 90 a join timed out after 10 s. Gossip
	// and push/pull keep the profile's timings, which are what the
	// figures measure.
	c := startCluster(t, 30, []string{"us-east-1", "eu-west-1", "ap-south-1"}, func(cfg *gossip.Config) {
		cfg.ProbeInterval = time.Minute
		cfg.ProbeTimeout = 5 * time.Second
		cfg.StreamTimeout = 30 * time.Second
	})
	var took, digestTook []time.Duration
	for i := range 5 {
		took = append(took, c.spread(t, i*7%30, fmt.Sprintf("item-%d", i)))
		digestTook = append(digestTook, c.spreadDigest(t, (i*7+3)%30, uint64(i+1)))
	}
	slices.Sort(took)
	slices.Sort(digestTook)
	t.Logf("broadcast to all of 30 nodes (local profile): median %v, max %v, all %v", took[2], took[4], took)
	t.Logf("digest to all of 30 nodes (local profile): median %v, max %v, all %v", digestTook[2], digestTook[4], digestTook)
	// Asserted on the median of five, with documented slack: the goal is
	// 1 s, measured without the race detector by BenchmarkConvergence30
	// (docs/BENCHMARKS.md). Under -race on the shared 2-core machine at
	// load average 98 the medians were 2.2 s (broadcast) and 2.1 s
	// (digest), maxima 3.6 s, so the test allows 5× the goal. That still
	// fails a change that spreads by push/pull repair instead of gossip:
	// the local profile's push/pull runs every 15 s.
	const goal, slack = time.Second, 5
	if took[2] > slack*goal || digestTook[2] > slack*goal {
		t.Errorf("median time to reach all 30 nodes: broadcast %v, digest %v; want at most %v (goal %v, ×%d slack for -race on a loaded machine)",
			took[2], digestTook[2], slack*goal, goal, slack)
	}
	for i, n := range c.nodes {
		if got := n.Dropped(); got != 0 {
			t.Errorf("%s dropped %d messages", n.Name(), got)
		}
		if st := c.stores[i].Stats(); st.Rejected != 0 || st.PublishErrors != 0 {
			t.Errorf("%s digest store: %+v", n.Name(), st)
		}
	}
	// Regions travel in node metadata.
	regions := map[string]int{}
	for _, m := range c.nodes[5].Members() {
		regions[m.Region]++
	}
	if want := map[string]int{"us-east-1": 10, "eu-west-1": 10, "ap-south-1": 10}; fmt.Sprint(regions) != fmt.Sprint(want) {
		t.Errorf("members by region = %v, want %v", regions, want)
	}
}

// BenchmarkConvergence30 measures, for 30 nodes in three Regions, how long
// a broadcast and a pool-health digest (published through
// regions.DigestStore as Tier-2 does) take to reach the last node. One
// iteration spreads one of each; the metrics are medians and maxima over
// the iterations.
func BenchmarkConvergence30(b *testing.B) {
	regions := []string{"us-east-1", "eu-west-1", "ap-south-1"}
	for _, bc := range []struct {
		name    string
		profile string
		oneWay  time.Duration // added to every cross-Region packet
	}{
		{"local", gossip.ProfileLocal, 0},
		{"lan", gossip.ProfileLAN, 0},
		{"lan/cross-region-rtt=80ms", gossip.ProfileLAN, 40 * time.Millisecond},
		{"wan/cross-region-rtt=80ms", gossip.ProfileWAN, 40 * time.Millisecond},
	} {
		b.Run(bc.name, func(b *testing.B) {
			net := faultnet.NewNetwork()
			for _, r := range regions {
				if bc.oneWay > 0 {
					net.Delay(faultnet.Region(r), faultnet.Not(faultnet.Region(r)), bc.oneWay)
				}
			}
			c := startClusterOn(b, net, 30, regions, func(cfg *gossip.Config) { cfg.Profile = bc.profile })
			var casts, digests []time.Duration
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				casts = append(casts, c.spread(b, i%30, fmt.Sprintf("bench-%d", i)))
				digests = append(digests, c.spreadDigest(b, (i+15)%30, uint64(i+1)))
			}
			b.StopTimer()
			for _, m := range []struct {
				name string
				d    []time.Duration
			}{{"broadcast", casts}, {"digest", digests}} {
				slices.Sort(m.d)
				b.ReportMetric(float64(m.d[len(m.d)/2].Microseconds())/1000, "ms-median-"+m.name)
				b.ReportMetric(float64(m.d[len(m.d)-1].Microseconds())/1000, "ms-max-"+m.name)
			}
		})
	}
}

// healsFast tunes a cluster for partition tests: a dead member is found
// in about 100 ms (probes every 100 ms, 50 ms timeout), dead members are
// tried again every 200 ms, and full state is exchanged every pushPull,
// which is what carries news across a healed partition.
func healsFast(pushPull time.Duration) func(*gossip.Config) {
	return func(cfg *gossip.Config) {
		cfg.ProbeInterval = 100 * time.Millisecond
		cfg.ProbeTimeout = 50 * time.Millisecond
		cfg.PushPullInterval = pushPull
		cfg.ReconnectInterval = 200 * time.Millisecond
	}
}

func TestPartitionAndHeal(t *testing.T) {
	c := startCluster(t, 6, []string{"a", "b"}, healsFast(300*time.Millisecond))
	var sideA, sideB []int
	for i, n := range c.nodes {
		if n.Region() == "a" {
			sideA = append(sideA, i)
		} else {
			sideB = append(sideB, i)
		}
	}
	namesOf := func(idx []int) []string {
		var out []string
		for _, i := range idx {
			out = append(out, c.names[i])
		}
		return out
	}

	start := time.Now()
	c.net.Partition(faultnet.Region("a"), faultnet.Region("b"))
	// Failure detection across the cut proves the partition holds.
	for _, i := range sideA {
		await(t, c.sets[i].WaitMembers(gone(namesOf(sideB)...)), c.names[i]+" to declare side b dead")
	}
	for _, i := range sideB {
		await(t, c.sets[i].WaitMembers(gone(namesOf(sideA)...)), c.names[i]+" to declare side a dead")
	}
	if c.net.Dropped() == 0 {
		t.Fatal("partition dropped no packets")
	}

	t.Logf("%v: sides declared each other dead", time.Since(start))
	must(t, c.nodes[sideA[0]].Broadcast(gossip.ChannelTest, []byte("from-a")))
	must(t, c.nodes[sideB[0]].Broadcast(gossip.ChannelTest, []byte("from-b")))
	c.sets[sideA[0]].Add("from-a")
	c.sets[sideB[0]].Add("from-b")
	for _, i := range sideA {
		await(t, c.sets[i].Wait("from-a"), c.names[i]+" to get its own side's broadcast")
	}
	for _, i := range sideB {
		await(t, c.sets[i].Wait("from-b"), c.names[i]+" to get its own side's broadcast")
	}
	for _, i := range sideB {
		if _, ok := c.sets[i].Has("from-a"); ok {
			t.Errorf("%s received side a's broadcast across the partition", c.names[i])
		}
	}

	t.Logf("%v: broadcasts stayed on their side", time.Since(start))
	c.net.Heal()
	for i, s := range c.sets {
		await(t, s.WaitMembers(alive(c.names...)), c.names[i]+" to see every member again")
		await(t, s.Wait("from-a"), c.names[i]+" to sync from-a after heal")
		await(t, s.Wait("from-b"), c.names[i]+" to sync from-b after heal")
	}
	t.Logf("%v: healed and synced", time.Since(start))
}

func TestLeave(t *testing.T) {
	c := startCluster(t, 4, []string{"a"}, nil)
	leaver := c.nodes[3]
	must(t, leaver.Leave(time.Second))
	must(t, leaver.Close())
	must(t, leaver.Close()) // idempotent
	for i := range 3 {
		await(t, c.sets[i].WaitMembers(gone(leaver.Name())), c.names[i]+" to see the leave")
		for _, m := range c.nodes[i].Members() {
			if m.Name == leaver.Name() {
				t.Errorf("%s still lists %s after its leave", c.names[i], m.Name)
			}
		}
	}
	if err := leaver.Broadcast(gossip.ChannelTest, []byte("x")); !errors.Is(err, gossip.ErrClosed) {
		t.Errorf("Broadcast after Close = %v, want ErrClosed", err)
	}
}

func TestRegisterLateAndPushPull(t *testing.T) {
	// A channel registered after New still converges: through broadcasts
	// from then on and through push/pull for what came before.
	c := startCluster(t, 3, []string{"a"}, func(cfg *gossip.Config) {
		cfg.PushPullInterval = 200 * time.Millisecond
	})
	late := newSet()
	const id = 7
	early := newSet()
	early.Add("before-register")
	c.nodes[0].Register(id, early)
	c.nodes[2].Register(id, late)
	await(t, late.Wait("before-register"), "push/pull to carry state registered late")
}

func TestRTTMeasuredAcrossRegions(t *testing.T) {
	const oneWay = 40 * time.Millisecond
	n := faultnet.NewNetwork()
	n.Delay(faultnet.Region("us-east-1"), faultnet.Region("eu-west-1"), oneWay)
	nodes := n.Start(t,
		gossip.Config{Name: "use", Region: "us-east-1", ProbeInterval: 50 * time.Millisecond, ProbeTimeout: time.Second},
		gossip.Config{Name: "euw", Region: "eu-west-1", ProbeInterval: 50 * time.Millisecond, ProbeTimeout: time.Second},
	)
	rtt := eventually(t, func() (time.Duration, bool) { return nodes[0].RTT("euw") })
	// Each packet is held oneWay in each direction, so no probe can come
	// back sooner than 2×oneWay: a floor, not a timing assertion.
	if rtt < 2*oneWay {
		t.Errorf("RTT use→euw = %v, want ≥ %v (the injected delay)", rtt, 2*oneWay)
	}
	if n.Delayed() == 0 {
		t.Error("no packet was delayed")
	}
	var found bool
	for _, m := range nodes[0].Members() {
		if m.Name == "euw" {
			found = true
			if m.Region != "eu-west-1" || m.RTT < 2*oneWay {
				t.Errorf("member euw = %+v", m)
			}
		}
	}
	if !found {
		t.Error("euw missing from Members")
	}
}

// eventually polls f until it reports ok. Used only where no event exists
// to wait on (memberlist's probe results).
func eventually[T any](t *testing.T, f func() (T, bool)) T {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(bound)
	for {
		if v, ok := f(); ok {
			return v
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("condition not met within %v", bound)
		}
	}
}

func TestBroadcastTooLarge(t *testing.T) {
	c := startCluster(t, 1, []string{"a"}, nil)
	n := c.nodes[0]
	max := n.MaxPayload("")
	if max < 1000 {
		t.Fatalf("MaxPayload = %d, want room for a digest", max)
	}
	must(t, n.Broadcast(1, make([]byte, max)))
	if err := n.Broadcast(1, make([]byte, max+1)); !errors.Is(err, gossip.ErrTooLarge) {
		t.Errorf("Broadcast(MaxPayload+1) = %v, want ErrTooLarge", err)
	}
	kmax := n.MaxPayload("pool/x")
	if err := n.BroadcastLatest(1, "pool/x", make([]byte, kmax+1)); !errors.Is(err, gossip.ErrTooLarge) {
		t.Errorf("BroadcastLatest(MaxPayload+1) = %v, want ErrTooLarge", err)
	}
}

func TestEncryptedCluster(t *testing.T) {
	key := []byte("0123456789abcdef")
	c := startCluster(t, 3, []string{"a"}, func(cfg *gossip.Config) { cfg.SecretKey = key })
	c.spread(t, 0, "secret")

	tr, err := c.net.Transport("intruder", "a")
	must(t, err)
	_, err = gossip.New(gossip.Config{Name: "intruder", Region: "a", Profile: gossip.ProfileLocal, Transport: tr,
		SecretKey: []byte("fedcba9876543210"), Join: []string{c.nodes[0].Addr()}})
	if err == nil {
		t.Fatal("a node with the wrong key joined")
	}
}

func TestConfigErrors(t *testing.T) {
	for name, cfg := range map[string]gossip.Config{
		"no name":     {},
		"bad profile": {Name: "x", Profile: "fast"},
		"bad key":     {Name: "x", SecretKey: []byte("short")},
		"long region": {Name: "x", Region: strings.Repeat("r", 256)},
		"nil channel": {Name: "x", Channels: map[byte]gossip.Channel{1: nil}},
		"bad port":    {Name: "x", BindPort: 70000},
	} {
		if _, err := gossip.New(cfg); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestBroadcastSurvivesPacketLoss(t *testing.T) {
	// A fifth of all packets are lost; retransmission by every receiver
	// and push/pull still get each broadcast everywhere.
	c := startCluster(t, 8, []string{"a", "b"}, func(cfg *gossip.Config) {
		cfg.PushPullInterval = 500 * time.Millisecond
	})
	c.net.Drop(faultnet.Region("a"), faultnet.Region("b"), 0.2)
	c.net.Drop(faultnet.Region("a"), faultnet.Region("a"), 0.2)
	c.net.Drop(faultnet.Region("b"), faultnet.Region("b"), 0.2)
	for i := range 5 {
		c.spread(t, i, fmt.Sprintf("lossy-%d", i))
	}
	if c.net.Dropped() == 0 {
		t.Error("no packet was dropped")
	}
}

// Keys rotate across a running cluster in three steps (new key second,
// first, alone) without a split: every step still spreads, and after
// the last a node holding only the old key is refused.
func TestKeyRotation(t *testing.T) {
	k1, k2 := []byte("0123456789abcdef"), []byte("fedcba9876543210fedcba98")
	c := startCluster(t, 3, []string{"a", "b"}, func(cfg *gossip.Config) { cfg.Keys = [][]byte{k1} })
	c.spread(t, 0, "k1")
	for step, keys := range [][][]byte{{k1, k2}, {k2, k1}, {k2}} {
		for i, n := range c.nodes {
			if err := n.SetKeys(keys); err != nil {
				t.Fatalf("step %d: node %d: %v", step+1, i, err)
			}
		}
		c.spread(t, step%len(c.nodes), fmt.Sprintf("step-%d", step+1))
	}
	for name, keys := range map[string][][]byte{"old key": {k1}, "no key": nil} {
		tr, err := c.net.Transport("intruder-"+strings.ReplaceAll(name, " ", "-"), "a")
		must(t, err)
		n, err := gossip.New(gossip.Config{Name: "intruder", Region: "a", Profile: gossip.ProfileLocal, Transport: tr,
			Keys: keys, Join: []string{c.nodes[0].Addr()}})
		if err == nil {
			n.Close()
			t.Errorf("a node with %s joined after the rotation", name)
		}
	}
	if err := c.nodes[0].SetKeys(nil); err == nil {
		t.Error("SetKeys(nil) succeeded: gossip would go back to plaintext")
	}
	if err := c.nodes[0].SetKeys([][]byte{[]byte("short")}); err == nil {
		t.Error("SetKeys accepted a 5-byte key")
	}
}

func TestParseKeys(t *testing.T) {
	good := "# primary first\nMDEyMzQ1Njc4OWFiY2RlZg==\n\n ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4 \n"
	keys, err := gossip.ParseKeys(good)
	if err != nil || len(keys) != 2 || string(keys[0]) != "0123456789abcdef" {
		t.Fatalf("ParseKeys = %q, %v", keys, err)
	}
	for text, want := range map[string]string{
		"":                   "no keys",
		"# only a comment\n": "no keys",
		"not base64!\n":      "line 1: not base64",
		"c2hvcnQ=\n":         "line 1: key is 5 bytes",
		"MDEyMzQ1Njc4OWFiY2RlZg==\nMDEyMzQ1Njc4OWFiY2RlZg==\n": "key 2 repeats key 1",
	} {
		if _, err := gossip.ParseKeys(text); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseKeys(%q) = %v, want an error containing %q", text, err, want)
		}
	}
}
