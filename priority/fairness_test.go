package priority

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// jain is Jain's fairness index of xs: 1 when all are equal, 1/n when one
// has everything.
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 1
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// skewScenario runs, in virtual time, ten equal-weight Standard tenants
// against a pool that serves 8 requests at once for 1 s each (8 req/s).
// Tenant t0 sends ten times what each other tenant sends; together they
// offer three times the pool's capacity, so every tenant wants more than
// its fair share (0.8 req/s). It returns each tenant's served requests over
// the measured window. flowOf maps a tenant to the fairness key the Gate
// sees; mapping all to one key turns the Gate into a FIFO.
func skewScenario(t *testing.T, flowOf func(tenant string) string) []float64 {
	const (
		tenants  = 10
		capacity = 8
		service  = time.Second
		warmup   = 30 * time.Second
		run      = 330 * time.Second
	)
	// Offered load: 3 × 8 req/s split 10:1:…:1 (19 parts).
	light := time.Second * 19 / (3 * capacity) // 791.666666ms
	heavy := light / 10

	served := make([]float64, tenants)
	synctest.Test(t, func(t *testing.T) {
		g := &Gate{}
		// No Critical traffic here, so no reserve: every slot is Standard's.
		g.SetConfig(Config{MaxQueued: 200, StandardMaxWait: 10 * time.Second, CriticalReserve: -1})
		g.Observe(slots(capacity))
		var (
			mu sync.Mutex
			wg sync.WaitGroup
		)
		begin := time.Now()
		for i := 0; i < tenants; i++ {
			every := light
			if i == 0 {
				every = heavy
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				name := fmt.Sprint("t", i)
				// Stagger the tenants so arrivals do not all coincide.
				time.Sleep(time.Duration(i) * every / tenants)
				for time.Since(begin) < run {
					wg.Add(1)
					go func() {
						defer wg.Done()
						tk, err := g.Admit(context.Background(), Request{Tenant: flowOf(name), Band: Standard})
						if err != nil {
							return
						}
						admitted := time.Since(begin)
						time.Sleep(service)
						tk.Done()
						if admitted >= warmup && admitted < run {
							mu.Lock()
							served[i]++
							mu.Unlock()
						}
					}()
					time.Sleep(every)
				}
			}()
		}
		wg.Wait()
	})
	return served
}

func TestFairnessUnderSkew(t *testing.T) {
	served := skewScenario(t, func(tenant string) string { return tenant })
	total := 0.0
	for _, s := range served {
		total += s
	}
	idx := jain(served)
	t.Logf("fair queueing: served %v (total %.0f), Jain %.4f", served, total, idx)
	if idx < 0.95 {
		t.Errorf("Jain's index %.4f < 0.95 with fair queueing; served %v", idx, served)
	}
	// The pool stays busy: about 8 req/s over the 300 s window.
	if total < 0.95*8*300 {
		t.Errorf("served %.0f requests; want about %d (pool left idle)", total, 8*300)
	}

	// The same load through one flow (plain FIFO, what GIE does within a
	// priority) gives the heavy tenant about half the pool: the test tells
	// fair from unfair.
	fifo := skewScenario(t, func(string) string { return "everyone" })
	t.Logf("FIFO: served %v, Jain %.4f", fifo, jain(fifo))
	if j := jain(fifo); j > 0.6 {
		t.Errorf("FIFO Jain %.4f; the scenario should be unfair without fair queueing", j)
	}
}
