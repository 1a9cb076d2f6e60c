package platform_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/platform"
	"github.com/meridian-router/meridian/platform/platformtest"
)

// Stopping meridian up (SIGTERM: Run's context ends) with streams open
// ends each with [DONE] or the documented shutting_down event: the Tier-2s
// drain first while the Tier-1s and pods behind them still serve, so no
// stream is cut or told upstream_failed. Before the stop drained front to
// back, every component stopped at once.
func TestUpDrainsFrontToBack(t *testing.T) {
	p, stop := platformtest.StartStoppable(t, func(c *platform.Config) {
		c.TimeScale = 1                  // long streams: still open at the drain's deadline
		c.DrainTimeout = 2 * time.Second // then each gets shutting_down
	})
	token := platformtest.Token(t, p, "team-a")
	type outcome struct {
		name, last string
		err        error
	}
	var (
		wg      sync.WaitGroup
		results = make(chan outcome, 16)
		opened  sync.WaitGroup
	)
	stream := func(name string, maxTokens int) {
		defer wg.Done()
		body := fmt.Sprintf(`{"model":"fast","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"tell me a story"}]}`, maxTokens)
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, p.Endpoints["us-east-1"]+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			opened.Done()
			results <- outcome{name: name, err: err}
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		last, first := "", true
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "data: ") {
				last = line
				if first {
					first = false
					opened.Done()
				}
			}
		}
		if first {
			opened.Done()
		}
		results <- outcome{name: name, last: last, err: sc.Err()}
	}
	for i := range 6 {
		wg.Add(1)
		opened.Add(1)
		go stream(fmt.Sprintf("long-%d", i), 20000)
	}
	for i := range 2 {
		wg.Add(1)
		opened.Add(1)
		go stream(fmt.Sprintf("short-%d", i), 3)
	}
	opened.Wait() // every stream has its first event (or failed)
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	wg.Wait()
	close(results)
	for r := range results {
		switch {
		case r.err != nil:
			t.Errorf("%s: %v", r.name, r.err)
		case r.last == "data: [DONE]":
		case strings.Contains(r.last, `"code":"shutting_down"`):
			if strings.HasPrefix(r.name, "short") {
				t.Errorf("%s: a 3-token stream was still open at the drain's deadline: %s", r.name, r.last)
			}
		default:
			t.Errorf("%s ended with %q, want [DONE] or a shutting_down event", r.name, r.last)
		}
	}
	if err := <-stopped; err != nil {
		t.Errorf("stop: %v", err)
	}
}
