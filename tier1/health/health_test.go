package health

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	tier1v1 "github.com/meridian-router/meridian/api/tier1/v1"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/request"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/simtest"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/scrape"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// newGateway is a gateway over four endpoints of pool "chat" that are
// never scraped: tests install metrics by hand. Built inside a synctest
// bubble it runs on the fake clock.
func newGateway(t *testing.T) (*gateway.Gateway, []*tier1.Endpoint) {
	t.Helper()
	pods := make([]testkit.Endpoint, 4)
	for i := range pods {
		pods[i] = testkit.Endpoint{Name: fmt.Sprintf("pod-%d", i), Address: fmt.Sprintf("10.0.0.%d:8000", i+1), Pool: "chat"}
	}
	s := testkit.Snapshot(t, 1, testkit.ChatGateway+"    loraAdapters: [a1, a2, a3]\n"+testkit.StaticEndpoints(pods...))
	gw, err := gateway.New(gateway.Config{Cluster: "c1", Logger: quiet, Options: tier1.Options{MaxMetricsAge: time.Hour}}, s)
	if err != nil {
		t.Fatal(err)
	}
	eps := slices.Clone(gw.Pools()[0].Pool.Endpoints())
	slices.SortFunc(eps, func(a, b *tier1.Endpoint) int { return strings.Compare(a.ID, b.ID) })
	return gw, eps
}

func scraped(waiting, running int, kv float64, adapters ...string) *tier1.Metrics {
	return &tier1.Metrics{Waiting: waiting, Running: running, KVCacheUsage: kv, RunningAdapters: adapters,
		LoRAReported: true, MaxLoRA: 4, ScrapedAt: time.Now()}
}

// version of pool chat in the latest digest (0 before any).
func version(p *Publisher) uint64 {
	d := p.Latest()
	if d == nil || len(d.Pools) == 0 {
		return 0
	}
	return d.Pools[0].Version
}

// TestPublishTiming: a digest at once, then every Interval, and at the
// next check after a significant change, on the fake clock.
func TestPublishTiming(t *testing.T) {
	cases := []struct {
		name   string
		change func(eps []*tier1.Endpoint)
		early  bool // published at the next check, before the interval
	}{
		{"nothing changes", func([]*tier1.Endpoint) {}, false},
		{"small queue change", func(eps []*tier1.Endpoint) { eps[0].SetMetrics(scraped(3, 2, 0.2)) }, false},
		{"queue jump", func(eps []*tier1.Endpoint) { eps[0].SetMetrics(scraped(7, 2, 0.2)) }, true},
		{"pod becomes unready", func(eps []*tier1.Endpoint) { eps[1].SetReady(false) }, true},
		{"pod goes stale", func(eps []*tier1.Endpoint) {
			m := *scraped(1, 2, 0.2)
			m.ScrapedAt = time.Now().Add(-3 * time.Second)
			eps[2].SetMetrics(&m)
		}, true},
		{"gate queue jump", nil, true}, // five requests start waiting in the pool's Gate
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				gw, eps := newGateway(t)
				for _, ep := range eps {
					ep.SetMetrics(scraped(1, 2, 0.2))
				}
				reg := prometheus.NewRegistry()
				p := NewPublisher(gw, Config{Region: "r1", Cluster: "c1", Logger: quiet, Registerer: reg})
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				go p.Run(ctx)
				synctest.Wait()
				if v := version(p); v != 1 {
					t.Fatalf("at start: version %d, want 1", v)
				}
				time.Sleep(120 * time.Millisecond) // between two 50 ms checks
				if tc.change != nil {
					tc.change(eps)
				} else {
					gate := gw.Gate("chat")
					gate.Observe(priority.Saturation{Value: 2, PerRequest: 0.1, Fresh: 3})
					for range 5 {
						defer gate.Submit(priority.Request{Tenant: "t", Band: priority.Standard}, func(*priority.Ticket, error) {})()
					}
				}
				time.Sleep(30 * time.Millisecond) // the check at 150 ms
				synctest.Wait()
				want := uint64(1)
				if tc.early {
					want = 2
				}
				if v := version(p); v != want {
					t.Fatalf("after the change, before the interval: version %d, want %d", v, want)
				}
				// The regular publication comes 500 ms after the last one.
				last := 0 * time.Millisecond
				if tc.early {
					last = 150 * time.Millisecond
				}
				time.Sleep(last + 499*time.Millisecond - 150*time.Millisecond)
				synctest.Wait()
				if v := version(p); v != want {
					t.Fatalf("just before the interval: version %d, want %d", v, want)
				}
				time.Sleep(time.Millisecond + 50*time.Millisecond)
				synctest.Wait()
				if v := version(p); v != want+1 {
					t.Fatalf("after the interval: version %d, want %d", v, want+1)
				}
				changes := 0.0
				if tc.early {
					changes = 1
				}
				if got := counter(t, reg, "meridian_tier1_health_digests_total", "change"); got != changes {
					t.Fatalf("digests published on a change: %v, want %v", got, changes)
				}
			})
		})
	}
}

// TestSlowSubscriber: a subscriber that does not read gets the newest
// digest, never a backlog, and never slows the publisher.
func TestSlowSubscriber(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gw, eps := newGateway(t)
		for _, ep := range eps {
			ep.SetMetrics(scraped(0, 0, 0))
		}
		p := NewPublisher(gw, Config{Region: "r1", Cluster: "c1", Logger: quiet})
		ch, stop := p.subscribe()
		defer stop()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go p.Run(ctx)
		time.Sleep(5*time.Second + time.Millisecond)
		synctest.Wait()
		d := <-ch
		if v := d.Pools[0].Version; v != 11 {
			t.Fatalf("slow subscriber got version %d, want the newest, 11", v)
		}
		select {
		case d := <-ch:
			t.Fatalf("a second digest (version %d) was queued", d.Pools[0].Version)
		default:
		}
	})
}

// TestPoolDigest checks every field against a pool whose state is set by
// hand and requests routed through the real gateway on the fake clock.
func TestPoolDigest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gw, eps := newGateway(t)
		eps[0].SetMetrics(scraped(2, 4, 0.40, "a1"))        // load max(2/5, 0.4/0.8) = 0.5
		eps[1].SetMetrics(scraped(10, 8, 0.90, "a1", "a2")) // saturated: 2.0 → spare 0
		eps[2].SetMetrics(scraped(0, 0, 0.00))              // idle: spare 1
		eps[3].SetReady(false)                              // counts in total only
		eps[3].SetMetrics(scraped(0, 0, 0.00))

		// Requests through the gateway: three succeed with TTFTs of 100,
		// 200 and 300 ms, one fails.
		dec := func() *gateway.Decision {
			d, err := gw.Decide(&request.Body{Model: "chat-model", Kind: request.Completion, Prompt: "hello"}, gateway.Meta{})
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		var open []*gateway.Attempt
		for i, ms := range []int{100, 200, 300} {
			d := dec()
			a := gw.Dispatch(d, eps[2])
			time.Sleep(time.Duration(ms) * time.Millisecond)
			a.FirstByte()
			if i < 2 {
				a.Done(200, false)
			} else {
				open = append(open, a) // still in flight
			}
		}
		failed := gw.Dispatch(dec(), eps[0])
		failed.Done(0, true)
		_ = open
		for _, ep := range eps[:3] {
			m := *ep.Metrics()
			m.ScrapedAt = time.Now()
			ep.SetMetrics(&m)
		}

		// One Standard request waits in the pool's Gate, which last saw
		// the pool saturated.
		gate := gw.Gate("chat")
		gate.Observe(priority.Saturation{Value: 2, PerRequest: 0.1, Fresh: 3})
		cancelWait := gate.Submit(priority.Request{Tenant: "t", Band: priority.Standard}, func(*priority.Ticket, error) {})
		defer cancelWait()

		pd := PoolDigest(gw.Pools()[0], time.Now(), Config{})
		checks := []struct {
			name      string
			got, want float64
		}{
			{"total pods", float64(pd.TotalPods), 4},
			{"ready pods", float64(pd.ReadyPods), 3},
			{"fresh pods", float64(pd.FreshPods), 3},
			{"stale pods", float64(pd.StalePods), 0},
			// eps[2] has one request in flight beyond its scrape (0+0).
			{"queue total", float64(pd.QueueTotal), 2 + 10 + 1},
			{"queue max", float64(pd.QueueMax), 10},
			{"queue min", float64(pd.QueueMin), 1},
			{"kv mean", pd.KvMean, (0.4 + 0.9 + 0) / 3},
			{"kv max", pd.KvMax, 0.9},
			{"running", float64(pd.Running), 12},
			{"in flight", float64(pd.InFlight), 1},
			{"ttft p50", pd.TtftP50Seconds, 0.2},
			{"ttft p99", pd.TtftP99Seconds, 0.2}, // index (n−1)·99/100 of three
			{"error rate", pd.ErrorRate, 1.0 / 3},
			// spare: 0.5 + 0 + (1 − 1/5) over 4 pods
			{"headroom", pd.Headroom, (0.5 + 0 + 0.8) / 4},
			{"saturation", pd.Saturation, (0.5 + 2 + 0.2) / 3},
			{"gate waiting", float64(pd.GateWaiting), 1},
			{"gate max queued", float64(pd.GateMaxQueued), 1000},
		}
		for _, c := range checks {
			if math.Abs(c.got-c.want) > 1e-9 {
				t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
			}
		}
		if !slices.Equal(pd.HotAdapters, []string{"a1", "a2"}) {
			t.Errorf("hot adapters %v, want [a1 a2]", pd.HotAdapters)
		}
		if pd.Pool != "chat" || pd.Model != "chat-model" || !slices.Equal(pd.Adapters, []string{"a1", "a2", "a3"}) {
			t.Errorf("identity: %q %q %v", pd.Pool, pd.Model, pd.Adapters)
		}
		for _, a := range open {
			a.Done(200, false)
		}
	})
}

// TestWatchAndSubscribe runs the feed on a real gRPC server on loopback:
// a subscriber gets a digest at once, and after the server restarts it
// reconnects by itself.
func TestWatchAndSubscribe(t *testing.T) {
	gw, eps := newGateway(t)
	for _, ep := range eps {
		ep.SetMetrics(scraped(1, 1, 0.1))
	}
	serve := func(l net.Listener) (stop func()) {
		p := NewPublisher(gw, Config{Region: "r1", Cluster: "c1", Replica: "tier1-0", Logger: quiet})
		g := grpc.NewServer()
		p.Register(g)
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan struct{})
		go func() { p.Run(ctx); close(ran) }()
		go g.Serve(l)
		return func() { g.Stop(); cancel(); <-ran }
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	stop := serve(l)

	got := make(chan *tier1v1.ClusterDigest, 64)
	ctx, cancel := context.WithCancel(t.Context())
	subscribed := make(chan error, 1)
	go func() {
		subscribed <- Subscribe(ctx, addr, func(d *tier1v1.ClusterDigest) {
			select {
			case got <- d:
			default:
			}
		}, WithSubscriber("test"), WithBackoff(5*time.Millisecond, 50*time.Millisecond))
	}()
	d := <-got
	if d.Region != "r1" || d.Cluster != "c1" || d.Replica != "tier1-0" || len(d.Pools) != 1 || d.Pools[0].ReadyPods != 4 {
		t.Fatalf("first digest: %v", d)
	}

	stop()
	l, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	eps[0].SetReady(false)
	stop = serve(l)
	defer stop()
	for d := range got {
		if d.Pools[0].ReadyPods == 3 {
			break // from the restarted server
		}
	}
	cancel()
	if err := <-subscribed; err != context.Canceled {
		t.Fatalf("Subscribe returned %v, want context.Canceled", err)
	}
}

func TestSubscribeBadAddress(t *testing.T) {
	if err := Subscribe(t.Context(), "%zz", func(*tier1v1.ClusterDigest) {}); err == nil {
		t.Fatal("no error for a malformed target")
	}
}

// TestPodPrefixRatio: with no index estimate, the digest carries the hit
// ratio the pods themselves count, over the publications in the window.
func TestPodPrefixRatio(t *testing.T) {
	pods := simtest.StartPods(t, sim.PodSpec{
		Pod: sim.PodConfig{Name: "chat", Profile: simtest.Profile(t, "h100"), Model: "chat-model"}, TimeScale: 100, DefaultMaxTokens: 2}, 2)
	var eps []testkit.Endpoint
	for _, lp := range pods {
		eps = append(eps, testkit.Endpoint{Name: lp.Name(), Address: lp.Addr(), Pool: "chat"})
	}
	snap := testkit.Snapshot(t, 1, testkit.ChatGateway+testkit.StaticEndpoints(eps...))
	gw, err := gateway.New(gateway.Config{Cluster: "c1", Logger: quiet, Scrape: scrape.Config{Interval: 10 * time.Millisecond}}, snap)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gw.Start(ctx, nil)
	podCounters := func() (h, q uint64) {
		for _, lp := range pods {
			m := lp.Metrics()
			h, q = h+m.PrefixCacheHits, q+m.PrefixCacheQueries
		}
		return h, q
	}
	scrapedAll := func() bool {
		h, q := podCounters()
		gh, gq := gw.Pools()[0].PodPrefix()
		return gh == h && gq == q
	}
	testkit.Eventually(t, "the pods' prefix counters scraped", scrapedAll)
	p := NewPublisher(gw, Config{Region: "r1", Cluster: "c1", Logger: quiet})
	p.publish(time.Now())
	h0, q0 := podCounters()

	body := `{"model":"chat-model","max_tokens":2,"prompt":"` + strings.Repeat("the same long preamble ", 200) + `"}`
	for range 4 {
		resp, err := http.Post("http://"+pods[0].Addr()+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	h1, q1 := podCounters()
	if h1 == h0 {
		t.Fatalf("the pods counted no prefix hits (%d/%d)", h1, q1)
	}
	testkit.Eventually(t, "the pods' prefix counters scraped", scrapedAll)
	p.publish(time.Now())
	want := float64(h1-h0) / float64(q1-q0)
	if got := p.Latest().Pools[0].PrefixHitRatio; math.Abs(got-want) > 1e-9 {
		t.Fatalf("prefix hit ratio %v, want the pods' %v", got, want)
	}
}

// counter reads one counter, by its reason label, from a registry.
func counter(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	return testkit.Metric(t, reg, name, map[string]string{"reason": reason})
}
