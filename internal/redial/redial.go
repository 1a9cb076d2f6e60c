// Package redial holds the gRPC dial options of Tier-1's long-lived
// client streams (the pool-health subscription, the replica exchange):
// plaintext unless the caller says otherwise, and gRPC's reconnect backoff
// bounded by the caller's own.
package redial

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// Options are opts (nil: plaintext) after a connection backoff growing
// from minBackoff, doubling with jitter, to maxBackoff. gRPC's own
// reconnect backoff (1 s growing to 120 s by default) would otherwise
// outlast the caller's; opts come later and win.
func Options(minBackoff, maxBackoff time.Duration, opts []grpc.DialOption) []grpc.DialOption {
	if opts == nil {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return append([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: minBackoff, Multiplier: 2, Jitter: 0.5, MaxDelay: maxBackoff},
		MinConnectTimeout: 2 * time.Second,
	})}, opts...)
}
