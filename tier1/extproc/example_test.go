package extproc_test

import (
	"context"
	"log"
	"net"
	"os/signal"
	"syscall"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/tier1/extproc"
	"github.com/meridian-router/meridian/tier1/gateway"
)

// Serving the picker where GIE's would run: ext_proc and gRPC health on
// 9002, drained on SIGTERM.
func Example() {
	var snap *config.Snapshot // the cluster's configuration
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()

	gw, err := gateway.New(gateway.Config{Cluster: "us-east-1a"}, snap)
	if err != nil {
		log.Fatal(err)
	}
	gw.Start(ctx, nil)
	lis, err := net.Listen("tcp", ":9002")
	if err != nil {
		log.Fatal(err)
	}
	srv := &extproc.Server{Gateway: gw}
	if err := srv.Serve(ctx, lis, 30*time.Second); err != nil {
		log.Fatal(err)
	}
}
