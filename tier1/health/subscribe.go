package health

import (
	"context"
	"fmt"
	"time"

	expbackoff "github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc"

	tier1v1 "github.com/meridian-router/meridian/api/tier1/v1"
	"github.com/meridian-router/meridian/internal/loop"
	"github.com/meridian-router/meridian/internal/redial"
)

// SubscribeOption tunes Subscribe.
type SubscribeOption func(*subscribeConfig)

type subscribeConfig struct {
	name        string
	minBackoff  time.Duration
	maxBackoff  time.Duration
	dialOptions []grpc.DialOption
	onError     func(error)
}

// WithSubscriber names the subscriber in the Tier-1's logs.
func WithSubscriber(name string) SubscribeOption {
	return func(c *subscribeConfig) { c.name = name }
}

// WithBackoff bounds the wait before reconnecting: it starts at min,
// doubles per failed attempt up to max, with ±50% jitter, and returns to
// min once a stream delivered a digest. Defaults: 100 ms and 5 s.
func WithBackoff(min, max time.Duration) SubscribeOption {
	return func(c *subscribeConfig) { c.minBackoff, c.maxBackoff = min, max }
}

// WithDialOptions replaces the dial options; the default is plaintext.
func WithDialOptions(opts ...grpc.DialOption) SubscribeOption {
	return func(c *subscribeConfig) { c.dialOptions = opts }
}

// WithErrorHandler is called (from Subscribe's goroutine) with each
// error that ended a stream, before the backoff.
func WithErrorHandler(f func(error)) SubscribeOption {
	return func(c *subscribeConfig) { c.onError = f }
}

// Subscribe follows the pool-health feed of the Tier-1 at addr until ctx
// ends, calling fn with every digest, from one goroutine, in order. A
// broken stream is reopened with jittered exponential backoff; fn sees
// the newest digest again at once after a reconnect. fn should return
// quickly: the Tier-1 skips digests a slow subscriber has not read.
// Subscribe returns ctx's error, or an error at once if addr cannot be a
// gRPC target.
func Subscribe(ctx context.Context, addr string, fn func(*tier1v1.ClusterDigest), opts ...SubscribeOption) error {
	c := subscribeConfig{minBackoff: 100 * time.Millisecond, maxBackoff: 5 * time.Second}
	for _, o := range opts {
		o(&c)
	}
	if c.minBackoff <= 0 {
		c.minBackoff = 100 * time.Millisecond
	}
	c.maxBackoff = max(c.maxBackoff, c.minBackoff)
	c.dialOptions = redial.Options(c.minBackoff, c.maxBackoff, c.dialOptions)
	conn, err := grpc.NewClient(addr, c.dialOptions...)
	if err != nil {
		return fmt.Errorf("health: subscribing to %q: %w", addr, err)
	}
	defer conn.Close()
	client := tier1v1.NewPoolHealthClient(conn)
	// Jittered ([d/2, 3d/2]) exponential backoff, from the start again
	// after a stream that delivered.
	retry := &expbackoff.ExponentialBackOff{InitialInterval: c.minBackoff, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: c.maxBackoff}
	for {
		got, err := watchOnce(ctx, client, c.name, fn)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if c.onError != nil {
			c.onError(err)
		}
		if got {
			retry.Reset()
		}
		if !loop.Sleep(ctx, retry.NextBackOff()) {
			return ctx.Err()
		}
	}
}

// watchOnce runs one stream; it reports whether it delivered a digest.
func watchOnce(ctx context.Context, client tier1v1.PoolHealthClient, name string, fn func(*tier1v1.ClusterDigest)) (bool, error) {
	st, err := client.Watch(ctx, &tier1v1.WatchRequest{Subscriber: name})
	if err != nil {
		return false, fmt.Errorf("health: opening the feed: %w", err)
	}
	got := false
	for {
		d, err := st.Recv()
		if err != nil {
			return got, fmt.Errorf("health: feed ended: %w", err)
		}
		got = true
		fn(d)
	}
}
