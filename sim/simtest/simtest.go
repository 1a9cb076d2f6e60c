// Package simtest starts simulated model-server pods for tests: live on
// loopback, closed when the test ends. It is imported only by test files
// (docs/architecture.md, rule 2).
package simtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/sim"
)

// Profile is the named hardware profile ("h100", "a10g", …), failing tb
// when there is none of that name.
func Profile(tb testing.TB, name string) sim.Profile {
	tb.Helper()
	p, err := sim.LookupProfile(name)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// StartPods starts k live pods of spec on loopback (sim.StartPods), failing
// tb when they do not start, and closes them when tb's test ends, after
// the cleanups registered later.
func StartPods(tb testing.TB, spec sim.PodSpec, k int) []*sim.LivePod {
	tb.Helper()
	pods, err := sim.StartPods(context.Background(), spec, k)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		for _, lp := range pods {
			lp.Close()
		}
	})
	return pods
}

// HangUp posts body to url (with header) as a caller that hangs up once
// pod is generating the answer, before any of it arrives, and returns the
// pod's metrics once it is idle again. Its GenerationTokens say how far
// the pod went for a caller that had left. It fails tb when the request
// is answered first or the pod does not get there within 30 s each (real
// sockets and the pod's wall clock: waited on observable states).
func HangUp(tb testing.TB, pod *sim.LivePod, url string, header http.Header, body string) sim.Metrics {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sent := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			sent <- err
			return
		}
		maps.Copy(req.Header, header)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			err = fmt.Errorf("the request was answered (%d: %.200s) before the caller hung up", resp.StatusCode, b)
		}
		sent <- err
	}()
	wait := func(what string, cond func(sim.Metrics) bool) sim.Metrics {
		tb.Helper()
		wctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
		defer stop()
		m, err := pod.WaitFor(wctx, cond)
		if err != nil {
			tb.Fatalf("waiting for %s: %v (pod: %+v)", what, err, m)
		}
		return m
	}
	wait("the request to be generating", func(m sim.Metrics) bool { return m.Running == 1 && m.GenerationTokens > 0 })
	cancel()
	if err := <-sent; !errors.Is(err, context.Canceled) {
		tb.Fatalf("the caller's request ended with %v, want its own cancellation", err)
	}
	return wait("the pod to be idle", func(m sim.Metrics) bool { return m.Running == 0 && m.Waiting == 0 })
}
