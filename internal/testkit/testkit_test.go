package testkit

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeTB records Fatalf instead of failing the test.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func run(cond func() bool) (failed string, took time.Duration) {
	tb := &fakeTB{}
	start := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); Eventually(tb, "the thing", cond) }()
	<-done
	return tb.failed, time.Since(start)
}

func TestEventually(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		if failed, _ := run(func() bool { n++; return n == 3 }); failed != "" {
			t.Errorf("a condition that comes to hold failed: %s", failed)
		}
		failed, took := run(func() bool { return false })
		if failed != "timed out after "+EventuallyTimeout.String()+" waiting for: the thing" {
			t.Errorf("a condition that never holds: %q", failed)
		}
		if took < EventuallyTimeout {
			t.Errorf("gave up after %s, before the %s bound", took, EventuallyTimeout)
		}
	})
}

func TestCPUClock(t *testing.T) {
	c := StartCPU()
	x := 0
	for i := 0; c.Elapsed() <= 0 && i < 1e9; i++ {
		x += i % 7 // burn CPU until getrusage moves
	}
	if c.Elapsed() <= 0 {
		t.Fatalf("CPU time did not grow over a busy loop (%d)", x)
	}
	if CPUTime() < c.Elapsed() {
		t.Errorf("CPUTime %s below the clock's elapsed %s", CPUTime(), c.Elapsed())
	}
}

func TestLoop(t *testing.T) {
	var mu sync.Mutex
	calls := map[int]int{}
	stop := Loop(3, func(w, i int) {
		mu.Lock()
		defer mu.Unlock()
		if i != calls[w] {
			t.Errorf("worker %d: call %d, want %d", w, i, calls[w])
		}
		calls[w]++
	})
	Eventually(t, "every worker called", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) == 3
	})
	stop()
	mu.Lock()
	after := fmt.Sprint(calls)
	mu.Unlock()
	time.Sleep(10 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if got := fmt.Sprint(calls); got != after {
		t.Fatalf("calls after stop returned: %s, then %s", after, got)
	}
}
