package platform

import (
	"context"
	"net"
	"testing"
)

// TestPortsAutoMovesEverything checks the plan of PortsAuto (--ports auto), and that a
// taken port is moved in the default mode while a free one stays.
func TestPortsAutoMovesEverything(t *testing.T) {
	snap, _, _, err := loadConfig(context.Background(), Config{Ports: PortsAuto})
	if err != nil {
		t.Fatal(err)
	}
	want := len(upListeners(snap, ""))
	moves, err := planPorts(snap, "", PortsAuto)
	if err != nil {
		t.Fatal(err)
	}
	if len(moves) != want {
		t.Fatalf("--ports auto moved %d of %d listeners", len(moves), want)
	}
	seen := map[string]bool{}
	for _, m := range moves {
		if seen[m.To] {
			t.Fatalf("port %s handed out twice", m.To)
		}
		seen[m.To] = true
	}

	// Default mode: hold the first Region's Tier-2 address; only it moves
	// (unless some other process holds more of the example's ports).
	tier2 := snap.Topology.Spec.Regions[0].Tier2[0]
	l, err := net.Listen("tcp", tier2)
	if err != nil {
		t.Fatalf("the auto-moved address %s should be free: %v", tier2, err)
	}
	defer l.Close()
	moves, err = planPorts(snap, "", PortsConfig)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range moves {
		found = found || m.From == tier2
	}
	if !found {
		t.Fatalf("the taken address %s was not moved: %+v", tier2, moves)
	}
	if _, err := planPorts(snap, "", "fixed"); err == nil {
		t.Fatal("--ports fixed accepted")
	}
}
