package peers_test

import (
	"context"
	"log"
	"net"

	"google.golang.org/grpc"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/peers"
)

// The wiring of one replica: the exchange exists before the gateway,
// whose dispatches it publishes, and starts before its gRPC server serves.
func Example() {
	var snap *config.Snapshot // the cluster's configuration
	ctx := context.Background()

	x, err := peers.New(peers.Config{
		Replica: "tier1-0",
		Peers:   []string{"tier1-1.tier1:9004", "tier1-2.tier1:9004"},
	})
	if err != nil {
		log.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{Cluster: "us-east-1a", Replica: "tier1-0", OnDispatch: x.Publish}, snap)
	if err != nil {
		log.Fatal(err)
	}
	gw.Start(ctx, nil)

	lis, err := net.Listen("tcp", ":9004")
	if err != nil {
		log.Fatal(err)
	}
	g := grpc.NewServer()
	x.Register(g) // beside the pool-health feed
	x.Start(ctx, gw)
	log.Fatal(g.Serve(lis))
}
