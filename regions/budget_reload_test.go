package regions

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
)

// A reload that changes the retry window (Fleet.Update) while requests
// count against the budget is safe (go test -race: the bucket width was
// read without the lock), and the new window applies: counts restart.
func TestRetryBudgetWindowReloadsUnderTraffic(t *testing.T) {
	cfg := Config{LocalRegion: "r", Clusters: []Cluster{{Region: "r", Name: "c", Tier1: "http://c"}},
		Retry: RetryConfig{Ratio: 0.0001, MinRetries: 1, Window: time.Hour}}
	f, err := NewFleet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var counted atomic.Int64
	stop := testkit.Loop(4, func(_, _ int) {
		f.Retries().Request()
		f.Retries().Retry()
		counted.Add(1)
	})
	for i := range 50 {
		c := cfg
		c.Retry.Window = time.Hour + time.Duration(i)*time.Minute
		if err := f.Update(c); err != nil {
			t.Fatal(err)
		}
		n := counted.Load()
		testkit.Eventually(t, "requests counted after the update", func() bool { return counted.Load() > n })
	}
	stop()
	// The last window is new: nothing counted in it, one retry allowed.
	cfg.Retry.Window = 3 * time.Hour
	if err := f.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if !f.Retries().Retry() || f.Retries().Retry() {
		t.Fatal("after a window change, want exactly the one retry minRetries allows")
	}
}
