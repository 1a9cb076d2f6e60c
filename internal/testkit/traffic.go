package testkit

import (
	"fmt"
	"sync"
	"testing"
)

// Loop starts workers goroutines, each calling f(worker, i) for i = 0, 1,
// 2, … until stop is called; stop waits for every goroutine to return, so
// no call of f runs once it has returned.
func Loop(workers int, f func(worker, i int)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				f(w, i)
			}
		}()
	}
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}

// UnderTraffic runs change while clients goroutines call send in a loop
// (client, request number; a non-empty return is a failure), waits until
// applied reports the change in force and at least 8 more requests have
// gone out under it, stops the clients and fails the test if any request
// failed. Every client sends at least one request.
func UnderTraffic(t *testing.T, clients int, send func(client, n int) (failure string), change func() string, applied func() bool) {
	t.Helper()
	var mu sync.Mutex
	var failures []string
	sent, silent := 0, clients // silent: clients yet to send a request
	stop := Loop(clients, func(c, n int) {
		f := send(c, n)
		mu.Lock()
		sent++
		if n == 0 {
			silent--
		}
		if f != "" {
			failures = append(failures, f)
		}
		mu.Unlock()
	})
	what := change()
	Eventually(t, what+" applied", applied)
	mu.Lock()
	after := sent
	mu.Unlock()
	Eventually(t, "requests after "+what+" and from every client", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return sent >= after+8 && silent == 0
	})
	stop()
	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed across %s; first: %s", len(failures), sent, what, failures[0])
	}
}

// Failure is the failure UnderTraffic's send reports for a response: ""
// for a 200 without error.
func Failure(code int, err error, detail string) string {
	if err == nil && code == 200 {
		return ""
	}
	return fmt.Sprintf("status %d, %v: %.200s", code, err, detail)
}
