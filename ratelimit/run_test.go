package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
)

func TestRunSyncsEveryIntervalAndLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, err := New(DefaultConfig("a"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := New(DefaultConfig("b"))
		if err != nil {
			t.Fatal(err)
		}
		tenants := map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{Requests: rate(600, time.Second, 0)})}
		for _, l := range []*Limiter{a, b} {
			if err := l.Update(tenants); err != nil {
				t.Fatal(err)
			}
		}
		var mu sync.Mutex
		var published int
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() {
			done <- a.Run(ctx, func(_ string, p []byte) {
				mu.Lock()
				published++
				mu.Unlock()
				b.Merge("a", p)
			})
		}()

		time.Sleep(350 * time.Millisecond)
		synctest.Wait()
		mu.Lock()
		if published != 3 {
			t.Errorf("published %d payloads in 350ms at a 100ms interval, want 3", published)
		}
		mu.Unlock()
		if ps := b.Peers(); len(ps) != 1 || ps[0].Instance != "a" || !ps[0].Live {
			t.Fatalf("b's peers %+v, want a, live", ps)
		}

		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run returned %v, want context.Canceled", err)
		}
		if ps := b.Peers(); len(ps) != 1 || !ps[0].Leaving || ps[0].Live {
			t.Fatalf("after a's Run ended, b's peers %+v, want a leaving", ps)
		}
	})
}

func TestStaleAndExpiredPeers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig("a")
		a, errA := New(cfg)
		b, errB := New(DefaultConfig("b"))
		if err := errors.Join(errA, errB); err != nil {
			t.Fatal(err)
		}
		tenants := map[string]*config.Tenant{"acme": tenantWith(config.TenantLimit{Requests: rate(100, time.Second, 0)})}
		if err := errors.Join(a.Update(tenants), b.Update(tenants)); err != nil {
			t.Fatal(err)
		}
		// b has all the demand; a none.
		for range 50 {
			b.Allow(Request{Tenant: "acme"})
		}
		b.Merge("a", a.Sync()[0])
		a.Merge("b", b.Sync()[0])
		a.Sync()
		share := func() float64 {
			t := (*a.tenants.Load())["acme"]
			t.mu.Lock()
			defer t.mu.Unlock()
			return t.all[0].share
		}
		fresh := share()
		cases := []struct {
			after     time.Duration
			wantHeld  bool
			wantLive  bool
			wantShare func(float64) bool
		}{
			{cfg.StaleAfter / 2, false, true, func(s float64) bool { return s == fresh }},
			// Held: b keeps the share it had, so a's stays what it was
			// (never below MinShare).
			{cfg.StaleAfter, true, true, func(s float64) bool { return math.Abs(s-math.Max(fresh, cfg.MinShare)) < 1e-12 }},
			// Expired: a is alone.
			{cfg.PeerTimeout, false, false, func(s float64) bool { return s == 1 }},
		}
		start := time.Now()
		for _, tc := range cases {
			time.Sleep(time.Until(start.Add(tc.after)) + time.Millisecond)
			a.Sync()
			ps := a.Peers()
			if len(ps) != 1 || ps[0].Held != tc.wantHeld || ps[0].Live != tc.wantLive {
				t.Fatalf("after %v: peers %+v, want held=%v live=%v", tc.after, ps, tc.wantHeld, tc.wantLive)
			}
			if s := share(); !tc.wantShare(s) {
				t.Fatalf("after %v: a's share %v (fresh: %v)", tc.after, s, fresh)
			}
		}
	})
}

func TestReportSplitsIntoParts(t *testing.T) {
	c := &clock{now: epoch}
	tenants := map[string]*config.Tenant{}
	for i := range 40 {
		tenants[fmt.Sprintf("t%02d", i)] = tenantWith(config.TenantLimit{Requests: rate(100, time.Second, 0)})
	}
	newLimiter := func(name string, maxPayload int) *Limiter {
		cfg := DefaultConfig(name)
		cfg.Now, cfg.MaxPayload = c.Now, maxPayload
		return newWith(t, cfg, tenants)
	}
	a, b, relay := newLimiter("a", 300), newLimiter("b", 0), newLimiter("c", 0)
	offer := func(n int) {
		for i := range n {
			a.Allow(Request{Tenant: fmt.Sprintf("t%02d", i)})
		}
	}
	deliver := func(payloads [][]byte) {
		for _, p := range payloads {
			b.Merge("a", p)
		}
	}

	offer(40)
	c.Advance(100 * time.Millisecond)
	parts := a.Sync()
	if len(parts) < 2 {
		t.Fatalf("40 limits in %d payload, want several of ≤300 bytes", len(parts))
	}
	for k, p := range parts {
		if len(p) > 300 {
			t.Errorf("part %d is %d bytes, over MaxPayload 300", k, len(p))
		}
	}
	deliver(parts)
	if got := len(b.peers["a"].limits); got != 40 {
		t.Fatalf("b holds %d of a's limits, want 40", got)
	}

	// Demand stops on half the tenants; once it has decayed, each part
	// drops the limits of its class that are gone.
	for range 300 {
		offer(20)
		c.Advance(100 * time.Millisecond)
		deliver(a.Sync())
	}
	if got := len(b.peers["a"].limits); got != 20 {
		t.Fatalf("b holds %d of a's limits after half went idle, want 20", got)
	}
	// A third instance hears a only through b's push/pull state.
	relay.Merge("b", b.LocalState())
	if got := len(relay.peers["a"].limits); got != 20 {
		t.Fatalf("relayed: c holds %d of a's limits, want 20", got)
	}
}

// TestConcurrentUse runs decisions, settlements, syncs, merges, push/pull
// and config updates at once; with -race it checks the locking.
func TestConcurrentUse(t *testing.T) {
	cfg := DefaultConfig("a")
	a, errA := New(cfg)
	b, errB := New(DefaultConfig("b"))
	if err := errors.Join(errA, errB); err != nil {
		t.Fatal(err)
	}
	small, big := benchTenants(), benchTenants()
	delete(small, "acme")
	big["acme"].Spec.Limits.Requests = rate(1200, time.Minute, 0)
	if err := errors.Join(a.Update(big), b.Update(big)); err != nil {
		t.Fatal(err)
	}
	stop := testkit.Loop(4, func(w, i int) {
		d := a.Allow(Request{Tenant: []string{"acme", "globex", "hooli"}[(i+w)%3], Model: "m1", Band: config.BandStandard, Tokens: 100})
		if d.Allowed {
			a.Settle(d.Ticket, 40)
		}
	})
	for i := range 200 {
		if err := a.Update([]map[string]*config.Tenant{small, big}[i%2]); err != nil {
			t.Fatal(err)
		}
		for _, p := range a.Sync() {
			b.Merge("a", p)
		}
		for _, p := range b.Sync() {
			a.Merge("b", p)
		}
		a.Merge("b", b.LocalState())
		a.Peers()
	}
	stop()
}
