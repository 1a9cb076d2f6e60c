package gossip_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestCloseLeavesNoGoroutines: after Leave and Close nothing of the node
// keeps running (the reconnect loop, memberlist's schedulers and listeners,
// the transports). memberlist lets a probe already in flight finish by its
// own timeout after Shutdown; that one goroutine is ignored.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
	c := startCluster(t, 3, []string{"a"}, nil)
	c.spread(t, 0, "x")
	for _, n := range c.nodes {
		must(t, n.Leave(time.Second))
		must(t, n.Close())
	}
}
