package platform

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/regions"
)

// Ready waits for every Region's Tier-2 to hold every pool with all its
// pods ready: while one Region's view has one of a pool's two pods ready,
// the platform is not ready, whatever the other Region's view says.
func TestReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Two Regions; pool chat of cluster c1 has two pods.
		snap := testkit.Snapshot(t, 1, `{apiVersion: meridian.dev/v1alpha1, kind: Topology, metadata: {name: t}, spec: {regions: [
  {name: r1, clusters: [{name: c1, tier1: "http://127.0.0.1:1"}]}, {name: r2, clusters: [{name: c2, tier1: "http://127.0.0.1:2"}]}]}}
---
{apiVersion: meridian.dev/v1alpha1, kind: InferenceGatewayConfig, metadata: {name: c1}, spec: {region: r1, cluster: c1,
  schedulers: [{name: chat, modelName: chat, modelSelector: {matchLabels: {pool: chat}}}]}}
---
{apiVersion: meridian.dev/v1alpha1, kind: StaticEndpoints, metadata: {name: pods}, spec: {cluster: c1, endpoints: [
  {name: p0, address: "127.0.0.1:3", labels: {pool: chat}}, {name: p1, address: "127.0.0.1:4", labels: {pool: chat}}]}}
`)
		p := &Platform{snap: snap, Regions: []string{"r1", "r2"}, fleets: map[string]*regions.Fleet{}}
		for _, r := range p.Regions {
			f, err := regions.NewFleet(regions.Config{LocalRegion: r, Clusters: regions.ClustersFromTopology(snap.Topology), DigestMaxAge: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			p.fleets[r] = f
		}
		put := func(region string, ready int) {
			p.fleets[region].Digests().Put(regions.Digest{Region: "r1", Cluster: "c1", Pool: "chat", Model: "chat",
				ReadyPods: ready, TotalPods: 2, Version: uint64(ready), Produced: time.Now()})
		}
		notYet := func(what string) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if err := p.Ready(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s: Ready %v, want it still waiting", what, err)
			}
		}
		notYet("no digest")
		put("r1", 1)
		put("r2", 2)
		notYet("one of r1's two pods ready")
		put("r1", 2)
		if err := p.Ready(context.Background()); err != nil {
			t.Fatalf("every pool ready in both Regions: %v", err)
		}
	})
}
