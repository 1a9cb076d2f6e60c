package peers_test

import (
	"context"
	"testing"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/peers"
)

// BenchmarkExchange measures how many prefix events of a full-length
// prompt (256 blocks, 2 KB of hashes) one replica delivers to a peer over
// loopback gRPC and the peer applies to a gateway's index: ns/op is per
// event, end to end (publish → batch → stream → apply).
func BenchmarkExchange(b *testing.B) {
	recv, addr := serveReceiver(b, idleGateway(b))
	ctx, cancel := context.WithCancel(context.Background())
	send, err := peers.New(peers.Config{Replica: "a", Peers: []string{addr}, QueueSize: 1 << 16, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	aran := send.Start(ctx, idleGateway(b))
	defer func() { cancel(); <-aran }()
	testkit.Eventually(b, "connected", func() bool { return send.Stats().Connected == 1 })

	hashes := make([]uint64, 256)
	for i := range hashes {
		hashes[i] = uint64(i) * 0x9E3779B97F4A7C15
	}
	b.SetBytes(int64(len(hashes) * 8))
	b.ReportAllocs()
	// A classic b.N loop, not b.Loop: the wait for the last events to be
	// applied must be timed too, and b.Loop stops the timer when the loop
	// ends (with it, a short run timed only the publishing: ~50 ns).
	var n int64
	b.ResetTimer()
	for range b.N {
		n++
		send.Publish("chat", tier1.PrefixEvent{Endpoint: "pod-a", Stamp: n, Hashes: hashes})
		if n%(1<<14) == 0 { // keep the queue from overflowing
			testkit.Eventually(b, "caught up", func() bool { return recv.Stats().Received+send.Stats().Dropped >= n })
		}
	}
	testkit.Eventually(b, "every event delivered", func() bool { return recv.Stats().Received+send.Stats().Dropped >= n })
	b.StopTimer()
	if d := send.Stats().Dropped; d > 0 {
		b.Fatalf("%d of %d events dropped", d, n)
	}
}
