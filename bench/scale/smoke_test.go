package main

import (
	"context"
	"io"
	"testing"
	"time"
)

// TestSmoke runs the harness at its smallest: two instances, a few
// tenants and pools, one short window, no cut. It checks that the run
// completes and counts traffic, not any figure.
func TestSmoke(t *testing.T) {
	o := options{Instances: 2, Regions: 1, Tenants: 20, ActiveLimits: 10, Clusters: 2, PoolsPer: 1,
		Profile: "local", Sync: 100 * time.Millisecond, DigestInterval: 500 * time.Millisecond,
		Warmup: time.Second, Window: time.Second, Windows: 1}
	r, err := run(context.Background(), o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if r.ActiveLimitsReal < 10 || r.ActiveTenants == 0 {
		t.Errorf("%d active limits of %d tenants, want at least 10", r.ActiveLimitsReal, r.ActiveTenants)
	}
	if r.BytesOutPerS <= 0 || r.BytesInPerS <= 0 {
		t.Errorf("no gossip traffic counted: out %v B/s, in %v B/s", r.BytesOutPerS, r.BytesInPerS)
	}
}
