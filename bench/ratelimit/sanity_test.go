package main

import (
	"testing"
	"time"

	gubernator "github.com/gubernator-io/gubernator/v2"
)

// TestGubernatorAloneLimits checks the harness: one Gubernator peer that
// owns the key admits a burst's worth of a flood and no more.
func TestGubernatorAloneLimits(t *testing.T) {
	topo := topology{regions: []string{"a"}, perRegion: 1, rate: 100, oneWay: 0}
	s, err := startGubernator(topo, 100*time.Millisecond, gubernator.Algorithm_LEAKY_BUCKET)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	admitted := 0
	for range 1000 {
		if s.decide(0) {
			admitted++
		}
	}
	if admitted < 100 || admitted > 110 {
		t.Fatalf("admitted %d of a flood of 1000, want the burst of 100", admitted)
	}
}
