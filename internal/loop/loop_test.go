package loop

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestEveryRunsUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		Every(ctx, time.Millisecond, func() {
			if n.Add(1) == 3 {
				cancel()
			}
		})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Every did not return after its context was cancelled")
	}
	if got := n.Load(); got < 3 {
		t.Fatalf("f ran %d times, want at least 3", got)
	}
}

func TestEveryReturnsAtOnceWhenDone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Every(ctx, time.Hour, func() { t.Error("f ran after the context was done") })
}

func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep without cancellation reported it was cut short")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep on a done context reported it waited")
	}
}

func TestEachStopsWhenTheChannelCloses(t *testing.T) {
	ch := make(chan int, 3)
	ch <- 1
	ch <- 2
	close(ch)
	var got []int
	Each(context.Background(), ch, func(v int) { got = append(got, v) })
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("Each saw %v, want [1 2]", got)
	}
}

func TestEachStopsWhenDone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	Each(ctx, make(chan int), func(int) { t.Error("f ran without a value") })
}
