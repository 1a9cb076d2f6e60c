package priority

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// check verifies the Gate's internal bookkeeping.
func (g *Gate) check(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	total, bytes := 0, int64(0)
	for b := range g.bands {
		q := &g.bands[b]
		n := 0
		if len(q.heap) != len(q.flows) {
			t.Fatalf("band %d: %d flows in the heap, %d in the map", b, len(q.heap), len(q.flows))
		}
		for i, f := range q.heap {
			if f.hidx != i || q.flows[f.tenant] != f {
				t.Fatalf("band %d: heap slot %d holds flow %q with index %d", b, i, f.tenant, f.hidx)
			}
			if i > 0 && q.less(i, (i-1)/2) {
				t.Fatalf("band %d: heap order broken at %d", b, i)
			}
			k := 0
			for w := f.head; w != nil; w = w.next {
				if !w.queued || w.flow != f || (w.next != nil && w.next.prev != w) {
					t.Fatalf("band %d: flow %q list broken", b, f.tenant)
				}
				k++
				bytes += w.req.Bytes
			}
			if k != f.n || k == 0 {
				t.Fatalf("band %d: flow %q counts %d, holds %d", b, f.tenant, f.n, k)
			}
			n += k
		}
		if n != q.n {
			t.Fatalf("band %d: counts %d, holds %d", b, q.n, n)
		}
		total += n
	}
	if total != g.queued || bytes != g.bytes {
		t.Fatalf("gate counts %d requests / %d bytes, holds %d / %d", g.queued, g.bytes, total, bytes)
	}
}

// TestStress drives many concurrent requests of every band through a small
// pool with cancellations, timeouts, evictions and live reconfiguration,
// then checks that every request got exactly one outcome and that the
// Gate's books balance.
func TestStress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &Gate{}
		g.SetConfig(Config{MaxQueued: 40, MaxQueuedBytes: 40 << 10, StandardMaxWait: 2 * time.Second, CriticalMaxWait: 4 * time.Second})
		g.Observe(slots(4))
		rng := rand.New(rand.NewPCG(1, 2))
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			outcomes = map[string]int{}
		)
		for i := 0; i < 2000; i++ {
			band := Band(rng.IntN(3))
			tenant := fmt.Sprint("t", rng.IntN(7))
			bytes := int64(rng.IntN(4 << 10))
			patience := time.Duration(rng.IntN(3000)) * time.Millisecond
			service := time.Duration(100+rng.IntN(900)) * time.Millisecond
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), patience)
				defer cancel()
				tk, err := g.Admit(ctx, Request{Tenant: tenant, Band: band, Bytes: bytes})
				key := "admitted"
				if err != nil {
					key = err.Error()
					if len(key) > 40 {
						key = key[:40]
					}
				} else {
					time.Sleep(service)
					tk.Done()
				}
				mu.Lock()
				outcomes[key]++
				mu.Unlock()
			}()
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
			if i%500 == 250 {
				g.SetConfig(Config{MaxQueued: 10 + rng.IntN(40), StandardMaxWait: time.Second})
				g.check(t)
			}
		}
		wg.Wait()
		g.check(t)
		n := 0
		for _, c := range outcomes {
			n += c
		}
		if n != 2000 || g.Len() != 0 {
			t.Fatalf("%d outcomes for 2000 requests, %d still queued: %v", n, g.Len(), outcomes)
		}
		g.mu.Lock()
		inflight := g.inflight
		g.mu.Unlock()
		if inflight != 0 {
			t.Fatalf("in-flight count %d after every ticket is done", inflight)
		}
		t.Logf("outcomes: %v", outcomes)
	})
}
