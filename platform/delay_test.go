package platform

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// sent counts the requests that reached the inner transport.
type sent struct{ n atomic.Int32 }

func (s *sent) RoundTrip(*http.Request) (*http.Response, error) {
	s.n.Add(1)
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
}

// A request to another Region's Tier-1 leaves after the round trip (2·d),
// not before; one to the own Region's at once; one whose caller gives up
// while it waits never leaves.
func TestDelayedCrossRegion(t *testing.T) {
	const d = 40 * time.Millisecond
	for _, c := range []struct {
		name  string
		host  string
		wait  time.Duration // when the request leaves
		abort bool          // the caller cancels halfway
	}{
		{"own Region at once", "near:1", 0, false},
		{"other Region after the round trip", "far:1", 2 * d, false},
		{"cancelled while delayed", "far:1", 2 * d, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				inner := &sent{}
				tr := &delayed{inner: inner, far: map[string]bool{"far:1": true}, d: d}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.host+"/v1/completions", nil)
				errc := make(chan error, 1)
				go func() {
					resp, err := tr.RoundTrip(req)
					if err == nil {
						resp.Body.Close()
					}
					errc <- err
				}()
				if c.wait > 0 {
					time.Sleep(c.wait / 2)
					synctest.Wait()
					if c.abort {
						cancel()
						if err := <-errc; !errors.Is(err, context.Canceled) || inner.n.Load() != 0 {
							t.Fatalf("cancelled while delayed: err %v, %d sent; want context.Canceled and none", err, inner.n.Load())
						}
						return
					}
					time.Sleep(c.wait/2 - time.Nanosecond)
					synctest.Wait()
					if n := inner.n.Load(); n != 0 {
						t.Fatalf("sent %d before the round trip of %s", n, c.wait)
					}
					time.Sleep(time.Nanosecond)
				}
				if err := <-errc; err != nil || inner.n.Load() != 1 {
					t.Fatalf("after %s: err %v, %d sent; want one", c.wait, err, inner.n.Load())
				}
			})
		})
	}
}
