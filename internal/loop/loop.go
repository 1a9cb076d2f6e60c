// Package loop holds what long-running goroutines share: doing something
// on every tick of an interval (Every) or on every value from a channel
// (Each) until the context ends, and waiting that the context may cut
// short (Sleep).
package loop

import (
	"context"
	"time"
)

// Every calls f on every tick of a ticker with period d until ctx is done
// (the first call comes after d, not at once). It returns when ctx is done;
// f runs on the caller's goroutine, so a slow f delays the next tick.
func Every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f()
	}
}

// Each calls f with every value received from ch until ctx is done or ch
// is closed.
func Each[T any](ctx context.Context, ch <-chan T, f func(T)) {
	for {
		select {
		case <-ctx.Done():
			return
		case v, ok := <-ch:
			if !ok {
				return
			}
			f(v)
		}
	}
}

// Sleep waits d or until ctx is done, and reports whether it waited d.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
