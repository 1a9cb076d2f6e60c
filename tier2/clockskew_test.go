package tier2

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	tier1v1 "github.com/meridian-router/meridian/api/tier1/v1"
	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/tier2/gossip/faultnet"
)

// skewedFeed is a Tier-1's pool-health feed whose clock is skew off the
// true time: every digest it sends is dated by that clock. It publishes one
// pool (serving model) with one ready, idle pod.
type skewedFeed struct {
	tier1v1.UnimplementedPoolHealthServer
	region, cluster, model string
	skew                   time.Duration
}

func (f *skewedFeed) Watch(_ *tier1v1.WatchRequest, stream tier1v1.PoolHealth_WatchServer) error {
	tick := time.NewTicker(50 * time.Millisecond) // the feed's publication interval
	defer tick.Stop()
	for v := uint64(1); ; v++ {
		err := stream.Send(&tier1v1.ClusterDigest{Region: f.region, Cluster: f.cluster, Replica: f.cluster + "-0",
			Pools: []*tier1v1.PoolDigest{{Pool: f.model, Model: f.model, ReadyPods: 1, TotalPods: 1, Headroom: 1,
				FreshPods: 1, Version: v, ProducedUnixNano: time.Now().Add(f.skew).UnixNano()}}})
		if err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-tick.C:
		}
	}
}

// TestClockSkewBetweenInstances checks the reliability row "clock skew
// between instances" end to end: two Tier-2 instances (Regions r1 and r2)
// gossiping over loopback, each subscribed to its own Region's Tier-1
// feeds, with clocks a minute apart (r1's Tier-2 30 s ahead, r2's 30 s
// behind) and Tier-1 clocks off as well:
//
//	feed   model        its clock  off from Tier-2 r1  off from Tier-2 r2
//	c1/r1  chat-model   −30 s      −60 s (its feed)    0 (gossip)
//	c2/r2  other-model  +30 s      0 (gossip)          +60 s (its feed)
//	c3/r1  far-model    +90 s      +60 s (its feed)    +120 s (gossip)
//
// Up to a minute off, nothing changes: both Tier-2s route every model to
// the one cluster serving it, in their own Region and across, although
// every digest is dated far outside the 5 s digest age bound by the
// receiver's clock (freshness counts from arrival). Further off than the
// age bound plus regions.MaxClockSkew (65 s), digests are refused: Tier-2
// r2 refuses c3's as they arrive by gossip, so far-model is 503 there
// while Tier-2 r1 keeps serving it.
func TestClockSkewBetweenInstances(t *testing.T) {
	clusters := []struct {
		name, region, model string
		skew                time.Duration
	}{
		{"c1", "r1", "chat-model", -30 * time.Second},
		{"c2", "r2", "other-model", 30 * time.Second},
		{"c3", "r1", "far-model", 90 * time.Second},
	}
	// The skews straddle the bound: 60 s is within, 120 s beyond.
	if bound := 5*time.Second + regions.MaxClockSkew; 60*time.Second >= bound || 120*time.Second <= bound {
		t.Fatalf("the test's skews do not straddle the %s bound", bound)
	}
	quiet := slog.New(slog.DiscardHandler)
	// Each cluster's Tier-1: an HTTP server answering completions and
	// its skewed pool-health feed.
	tier1 := map[string]string{}
	health := map[string]string{}
	for _, c := range clusters {
		up := httptest.NewServer(&recorder{})
		t.Cleanup(up.Close)
		tier1[c.name] = up.URL
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		tier1v1.RegisterPoolHealthServer(gs, &skewedFeed{region: c.region, cluster: c.name, model: c.model, skew: c.skew})
		go gs.Serve(ln)
		t.Cleanup(gs.Stop)
		health[c.name] = ln.Addr().String()
	}
	var topology []testkit.Cluster
	for _, c := range clusters {
		topology = append(topology, testkit.Cluster{Region: c.region, Name: c.name, Tier1: tier1[c.name], Health: health[c.name]})
	}
	var b strings.Builder
	b.WriteString(testkit.Topology(topology...))
	for _, c := range clusters {
		b.WriteString(testkit.Gateway(c.region, c.name))
		fmt.Fprintf(&b, "  schedulers:\n  - {name: %[1]s, modelName: %[1]s, modelSelector: {matchLabels: {pool: %[1]s}}}\n", c.model)
	}
	docs, errs := config.Decode("skew.yaml", []byte(b.String()))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	snap, err := config.Build(docs, 1)
	if err != nil {
		t.Fatal(err)
	}

	netw := faultnet.NewNetwork()
	tier2s := map[string]*Instance{}
	url := map[string]string{}
	var join []string
	for _, r := range []struct {
		region string
		skew   time.Duration
	}{{"r1", 30 * time.Second}, {"r2", -30 * time.Second}} {
		name := "t2-" + r.region
		gt, err := netw.Transport(name, r.region)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		in, err := NewInstance(ctx, InstanceConfig{Region: r.region, Name: name, GossipBind: "127.0.0.1:0", GossipJoin: join,
			GossipProfile: "local", GossipTransport: gt, InsecureNoAuth: true, Logger: quiet,
			Now: func() time.Time { return time.Now().Add(r.skew) }}, snap)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { in.Run(ctx, nil); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		join = append(join, in.Node.Addr())
		tier2s[r.region], url[r.region] = in, serveFront(t, in.Handler(), nil)
	}

	// servedBy sends a completion for model through the Tier-2 of region
	// and returns the status and the cluster that answered.
	servedBy := func(region, model string) (int, string) {
		resp, err := http.Post(url[region]+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":1}`, model)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("X-Meridian-Cluster")
	}
	routes := func(region, model, cluster string) bool {
		code, got := servedBy(region, model)
		return code == http.StatusOK && got == cluster
	}
	for _, region := range []string{"r1", "r2"} {
		testkit.Eventually(t, "Tier-2 "+region+" routes chat-model to c1 and other-model to c2", func() bool {
			return routes(region, "chat-model", "c1") && routes(region, "other-model", "c2")
		})
	}
	testkit.Eventually(t, "Tier-2 r1 routes far-model to c3 (its feed 60 s ahead of r1's clock)", func() bool {
		return routes("r1", "far-model", "c3")
	})

	// c3's digests reach Tier-2 r2 by gossip (r1 accepted them) and are
	// refused there: dated 120 s ahead of its clock.
	r2 := tier2s["r2"].Fleet.Digests()
	testkit.Eventually(t, "Tier-2 r2 refuses c3's digests as they arrive", func() bool {
		return r2.Stats().Implausible >= 3
	})
	for _, d := range r2.Digests() {
		if d.Cluster == "c3" {
			t.Fatalf("Tier-2 r2 holds c3's digest dated %s ahead of its clock: %+v", d.Produced.Sub(tier2s["r2"].cfg.Now()).Round(time.Second), d)
		}
	}
	if code, got := servedBy("r2", "far-model"); code != http.StatusServiceUnavailable {
		t.Fatalf("far-model at Tier-2 r2: %d from %q, want 503: c3's digests are dated beyond the skew bound", code, got)
	}
	// Nothing else was refused anywhere: every other pair of clocks is at
	// most a minute apart.
	if st := tier2s["r1"].Fleet.Digests().Stats(); st.Implausible != 0 || st.Rejected != 0 {
		t.Fatalf("Tier-2 r1 refused digests: %+v", st)
	}
}
