package peers_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/simtest"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/peers"
	"github.com/meridian-router/meridian/tier1/proxy"
	"github.com/meridian-router/meridian/tier1/scrape"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// race lets TestReplicasShareIndex send the next request without waiting
// for the previous one's event to be applied, as production does.
var race = flag.Bool("race-events", false, "TestReplicasShareIndex: do not wait for prefix events before the next request")

var quiet = slog.New(slog.DiscardHandler)

const gatewayYAML = testkit.ChatGateway + `    scoring: %s
    # Prefix-led weights (GIE's profile): these tests measure the shared
    # prefix index, not the latency model, whose per-replica learning
    # would add noise to the hit ratios on a loaded machine.
    weights: {queue: 2, kvCache: 2, prefix: 3}
`

func startPods(tb testing.TB, k int) []*sim.LivePod {
	tb.Helper()
	return simtest.StartPods(tb, sim.PodSpec{
		Pod:              sim.PodConfig{Name: "chat", Profile: simtest.Profile(tb, "h100"), Model: "chat-model"},
		TimeScale:        100,
		DefaultMaxTokens: 4,
	}, k)
}

func snapshot(tb testing.TB, scoring string, pods []*sim.LivePod) *config.Snapshot {
	tb.Helper()
	var eps []testkit.Endpoint
	for _, lp := range pods {
		eps = append(eps, testkit.Endpoint{Name: lp.Name(), Address: lp.Addr(), Pool: "chat"})
	}
	return testkit.Snapshot(tb, 1, fmt.Sprintf(gatewayYAML, scoring)+testkit.StaticEndpoints(eps...))
}

// replica is one Tier-1 replica: a gateway, its standalone proxy, and
// (when sharing) its peer exchange on a loopback gRPC server.
type replica struct {
	gw   *gateway.Gateway
	x    *peers.Exchange
	url  string
	addr string // the Replicas service
}

// startReplicas starts n replicas over the same pods. With share, each
// exchanges prefix events with all the others (the peer list includes
// the replica itself, as a headless Service's would).
func startReplicas(tb testing.TB, n int, scoring string, share bool, pods []*sim.LivePod) []*replica {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var lis []net.Listener
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		lis = append(lis, l)
		addrs = append(addrs, l.Addr().String())
	}
	var rs []*replica
	var stops []func()
	for i := range n {
		r := &replica{addr: addrs[i]}
		gcfg := gateway.Config{
			Cluster: "c1", Replica: fmt.Sprintf("r%d", i), Logger: quiet,
			Scrape:  scrape.Config{Interval: 50 * time.Millisecond},
			Options: tier1.Options{MaxMetricsAge: time.Second},
		}
		if share {
			x, err := peers.New(peers.Config{Replica: gcfg.Replica, Peers: addrs, Logger: quiet, MinBackoff: 5 * time.Millisecond})
			if err != nil {
				tb.Fatal(err)
			}
			r.x = x
			gcfg.OnDispatch = x.Publish
			gcfg.OnInFlight = x.PublishInFlight
		}
		gw, err := gateway.New(gcfg, snapshot(tb, scoring, pods))
		if err != nil {
			tb.Fatal(err)
		}
		gw.Start(ctx, nil)
		r.gw = gw
		g := grpc.NewServer()
		done := make(<-chan struct{})
		if share {
			r.x.Register(g)
			done = r.x.Start(ctx, gw)
		} else {
			closed := make(chan struct{})
			close(closed)
			done = closed
		}
		go g.Serve(lis[i])
		srv := httptest.NewServer((&proxy.Proxy{Gateway: gw, Logger: quiet, Transport: &http.Transport{}}).Handler())
		r.url = srv.URL
		stops = append(stops, func() { srv.Close(); <-done; g.Stop() })
		rs = append(rs, r)
	}
	tb.Cleanup(func() {
		cancel()
		for _, s := range stops {
			s()
		}
	})
	testkit.Eventually(tb, "every endpoint scraped by every replica", func() bool {
		for _, r := range rs {
			for _, v := range r.gw.Pools() {
				for _, ep := range v.Pool.Endpoints() {
					if ep.Metrics() == nil {
						return false
					}
				}
			}
		}
		return true
	})
	if share {
		testkit.Eventually(tb, "every replica connected to its peers", func() bool {
			for _, r := range rs {
				if r.x.Stats().Connected != n {
					return false
				}
			}
			return true
		})
	}
	return rs
}

func chat(text string) string {
	b, _ := json.Marshal(map[string]any{"model": "chat-model", "max_tokens": 2,
		"messages": []map[string]string{{"role": "user", "content": text}}})
	return string(b)
}

// workload is groups of requests sharing a long system prompt, the groups
// interleaved. The number of groups is odd so that, alternating between
// two replicas, every group visits both.
func workload(groups, perGroup int) []string {
	var out []string
	for q := range perGroup {
		for g := range groups {
			system := strings.Repeat(fmt.Sprintf("You are assistant %d of the claims desk; answer precisely. ", g), 40)
			out = append(out, chat(system+fmt.Sprintf("Question %d about claim %d?", q, 1000*g+q)))
		}
	}
	return out
}

// hitRatio sends the workload, request i to replica i mod len(rs), and
// returns the prefix-cache hit ratio the pods themselves counted.
func hitRatio(tb testing.TB, rs []*replica, pods []*sim.LivePod, reqs []string) float64 {
	tb.Helper()
	var h0, q0 uint64
	for _, lp := range pods {
		m := lp.Metrics()
		h0, q0 = h0+m.PrefixCacheHits, q0+m.PrefixCacheQueries
	}
	sentVia := make([]int64, len(rs))
	for i, body := range reqs {
		k := i % len(rs)
		resp, err := http.Post(rs[k].url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			tb.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			tb.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		sentVia[k]++
		if rs[0].x != nil && !*race {
			// The next request goes to another replica: let this one's
			// event arrive first, so the measure does not depend on
			// scheduling luck (on loopback it arrives in well under the
			// time a request takes; docs/tier1.md discusses the race).
			testkit.Eventually(tb, "the dispatch applied by every peer", func() bool {
				for j, r := range rs {
					want := int64(0)
					for o, n := range sentVia {
						if o != j {
							want += n
						}
					}
					if r.x.Stats().Applied < want {
						return false
					}
				}
				return true
			})
		}
	}
	var h1, q1 uint64
	for _, lp := range pods {
		m := lp.Metrics()
		h1, q1 = h1+m.PrefixCacheHits, q1+m.PrefixCacheQueries
	}
	return float64(h1-h0) / float64(q1-q0)
}

// TestReplicasShareIndex: two replicas taking alternate requests of a
// shared-prefix workload reach the prefix hit ratio of one replica when
// they exchange prefix events, and fall short of it when they do not.
func TestReplicasShareIndex(t *testing.T) {
	reqs := workload(9, 6)
	arms := []struct {
		name     string
		replicas int
		scoring  string
		share    bool
	}{
		{"one replica", 1, "meridian", false},
		{"two replicas sharing", 2, "meridian", true},
		{"two replicas isolated", 2, "meridian", false},
		{"two replicas gie", 2, "gie", false},
	}
	ratio := map[string]float64{}
	for _, arm := range arms {
		// A subtest per arm, so each arm's pods and replicas stop before
		// the next starts.
		t.Run(arm.name, func(t *testing.T) {
			pods := startPods(t, 4)
			rs := startReplicas(t, arm.replicas, arm.scoring, arm.share, pods)
			ratio[arm.name] = hitRatio(t, rs, pods, reqs)
			if arm.share {
				for i, r := range rs {
					// Replica i took every len(rs)-th request; it must
					// have applied all the others' and none of its own
					// (which reached it through its own peer list).
					others := int64(len(reqs) - (len(reqs)-i+len(rs)-1)/len(rs))
					st := r.x.Stats()
					if st.Dropped != 0 || st.Unknown != 0 || st.Received != others || st.Applied != others {
						t.Errorf("replica %d: %+v; want %d received and applied, no drops, no unknown endpoints", i, st, others)
					}
				}
			}
			t.Logf("pod-reported prefix hit ratio %.3f", ratio[arm.name])
		})
	}
	one, shared, isolated := ratio["one replica"], ratio["two replicas sharing"], ratio["two replicas isolated"]
	if shared < 0.95*one {
		t.Errorf("two sharing replicas hit %.3f, one replica %.3f: more than 5%% apart", shared, one)
	}
	if isolated >= shared {
		t.Errorf("isolated replicas hit %.3f, sharing ones %.3f: the workload does not tell them apart", isolated, shared)
	}
}

// idleGateway is a gateway over endpoints that are never scraped: enough
// to apply prefix events to.
func idleGateway(t testing.TB) *gateway.Gateway {
	t.Helper()
	s := testkit.Snapshot(t, 1, fmt.Sprintf(gatewayYAML, "meridian")+
		testkit.StaticEndpoints(testkit.Endpoint{Name: "pod-a", Address: "10.0.0.1:8000", Pool: "chat"}))
	gw, err := gateway.New(gateway.Config{Cluster: "c1", Logger: quiet}, s)
	if err != nil {
		t.Fatal(err)
	}
	return gw
}

// serveReceiver serves an exchange named "b", applying what it receives to
// into, on a loopback gRPC server until the test ends; it returns the
// exchange and the server's address.
func serveReceiver(tb testing.TB, into peers.Applier) (*peers.Exchange, string) {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	x, err := peers.New(peers.Config{Replica: "b", Logger: quiet})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	g := grpc.NewServer()
	x.Register(g)
	ran := x.Start(ctx, into)
	go g.Serve(l)
	tb.Cleanup(func() { cancel(); <-ran; g.Stop() })
	return x, l.Addr().String()
}

// TestDropsAndReconnect: while a peer is down, events beyond the queue are
// dropped and counted, never blocking Publish; once the peer comes up the
// queued events reach it.
func TestDropsAndReconnect(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // the peer is down for now

	a, err := peers.New(peers.Config{Replica: "a", Peers: []string{addr}, QueueSize: 4, Logger: quiet,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := a.Start(ctx, idleGateway(t))
	defer func() { cancel(); <-ran }()

	ev := func(i int) tier1.PrefixEvent {
		return tier1.PrefixEvent{Endpoint: "pod-a", Stamp: int64(i + 1), Hashes: []uint64{uint64(i), uint64(i) + 100}}
	}
	for i := range 10 {
		a.Publish("chat", ev(i))
	}
	if st := a.Stats(); st.Dropped != 6 || st.Sent != 0 {
		t.Fatalf("peer down, queue of 4, 10 events: %+v; want 6 dropped, 0 sent", st)
	}

	// The peer comes up on the same address.
	l, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the peer's port was taken meanwhile: %v", err)
	}
	b, err := peers.New(peers.Config{Replica: "b", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	b.Register(g)
	bran := b.Start(ctx, idleGateway(t))
	defer func() { cancel(); <-bran }()
	go g.Serve(l)
	defer g.Stop()

	testkit.Eventually(t, "the queued events applied by the peer", func() bool { return b.Stats().Applied == 4 })
	a.Publish("chat", ev(10))
	a.Publish("chat", tier1.PrefixEvent{Endpoint: "pod-gone", Stamp: 99, Hashes: []uint64{1}})
	a.Publish("no-such-pool", ev(11))
	testkit.Eventually(t, "later events delivered", func() bool { return b.Stats().Received == 7 })
	if st := b.Stats(); st.Applied != 5 || st.Unknown != 2 {
		t.Fatalf("peer: %+v; want 5 applied, 2 unknown", st)
	}
	if st := a.Stats(); st.Sent != 7 || st.Dropped != 6 || st.Connected != 1 {
		t.Fatalf("sender: %+v; want 7 sent, 6 dropped, connected", st)
	}
}

func TestConfigErrors(t *testing.T) {
	for name, cfg := range map[string]peers.Config{
		"no replica":     {Peers: []string{"127.0.0.1:1"}},
		"negative queue": {Replica: "a", QueueSize: -1},
	} {
		if _, err := peers.New(cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestConcurrentPublish: many request goroutines publish at once through a
// small queue; every event is either sent or counted as dropped, and the
// peer receives exactly the sent ones.
func TestConcurrentPublish(t *testing.T) {
	b, addr := serveReceiver(t, idleGateway(t))
	ctx, cancel := context.WithCancel(context.Background())
	a, err := peers.New(peers.Config{Replica: "a", Peers: []string{addr}, QueueSize: 64, BatchSize: 16, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	aran := a.Start(ctx, idleGateway(t))
	defer func() { cancel(); <-aran }()
	testkit.Eventually(t, "connected", func() bool { return a.Stats().Connected == 1 })

	const workers, each = 8, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				a.Publish("chat", tier1.PrefixEvent{Endpoint: "pod-a", Stamp: int64(w*each + i + 1), Hashes: []uint64{uint64(i), uint64(w)}})
			}
		}()
	}
	wg.Wait()
	testkit.Eventually(t, "the queue drained", func() bool {
		st := a.Stats()
		return st.Sent+st.Dropped == workers*each && b.Stats().Received == st.Sent
	})
	if st := b.Stats(); st.Applied != st.Received || st.Unknown != 0 {
		t.Fatalf("receiver: %+v; want everything applied", st)
	}
	t.Logf("sender: %+v", a.Stats())
}

// peerLoad sums what the other replicas reported to r over its endpoints.
func peerLoad(r *replica) tier1.PeerLoad {
	var l tier1.PeerLoad
	for _, v := range r.gw.Pools() {
		for _, ep := range v.Pool.Endpoints() {
			l.InFlight += ep.PeerInFlight()
			l.Backlog += ep.PeerBacklog()
		}
	}
	return l
}

// Replicas tell each other their in-flight counts and prefill backlogs: a
// request held open on one replica shows on the other's endpoint, and is
// gone from it once the request ends.
func TestReplicasShareInFlight(t *testing.T) {
	pods := startPods(t, 2)
	rs := startReplicas(t, 2, "meridian", true, pods)
	// Published loads are absolute: the latest per endpoint wins.
	ep := rs[0].gw.Pools()[0].Pool.Endpoints()[0]
	for _, l := range []tier1.PeerLoad{{InFlight: 5, Backlog: 3000}, {InFlight: 2, Backlog: 0}, {InFlight: 3, Backlog: 700}, {}} {
		rs[0].x.PublishInFlight("chat", ep.ID, l)
		testkit.Eventually(t, fmt.Sprintf("replica 1 sees replica 0's %+v", l), func() bool { return peerLoad(rs[1]) == l })
	}
	// Through the proxy: a request served by replica 0 is published when
	// dispatched, at its first token and when done, so replica 1 ends at
	// 0 again, having received the loads (applied, not unknown).
	before := rs[1].x.Stats().InFlight
	resp, err := http.Post(rs[0].url+"/v1/chat/completions", "application/json", strings.NewReader(chat("in flight")))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	testkit.Eventually(t, "replica 1 applied replica 0's dispatch, first token and end", func() bool {
		return rs[1].x.Stats().InFlight >= before+3 && peerLoad(rs[1]) == tier1.PeerLoad{}
	})
	if u := rs[1].x.Stats().Unknown; u != 0 {
		t.Errorf("%d events unknown to replica 1", u)
	}
}

// TestPeerLoadForgottenWithPeer: what a replica reported stops counting on
// the others when its stream ends (it stopped), backlog as well as
// in-flight count.
func TestPeerLoadForgottenWithPeer(t *testing.T) {
	bgw := idleGateway(t)
	_, addr := serveReceiver(t, bgw)
	actx, acancel := context.WithCancel(context.Background())
	a, err := peers.New(peers.Config{Replica: "a", Peers: []string{addr}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	aran := a.Start(actx, idleGateway(t))
	defer func() { acancel(); <-aran }()
	ep := bgw.Pools()[0].Pool.Endpoint("pod-a")
	a.PublishInFlight("chat", "pod-a", tier1.PeerLoad{InFlight: 3, Backlog: 2048})
	testkit.Eventually(t, "b sees a's 3 requests and 2048 tokens on pod-a", func() bool {
		return ep.PeerInFlight() == 3 && ep.PeerBacklog() == 2048
	})
	acancel()
	<-aran
	testkit.Eventually(t, "b forgets them once a's stream ends", func() bool {
		return ep.PeerInFlight() == 0 && ep.PeerBacklog() == 0
	})
}
