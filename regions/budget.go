package regions

import (
	"sync"
	"time"
)

// RetryBudget caps retries at a share of requests over a sliding window, so
// that when clusters fail, retries add a bounded load (Ratio) instead of
// multiplying it. The window is kept in ten buckets.
type RetryBudget struct {
	now func() time.Time

	mu      sync.Mutex
	cfg     RetryConfig
	width   int64 // bucket width, ns
	buckets [10]budgetBucket
}

type budgetBucket struct {
	epoch   int64 // now / width when the bucket was last reset
	reqs    int64
	retries int64
}

func newRetryBudget(cfg RetryConfig, now func() time.Time) *RetryBudget {
	b := &RetryBudget{now: now}
	b.setConfig(cfg)
	return b
}

func (b *RetryBudget) setConfig(cfg RetryConfig) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// Counts survive a reload unless the window (and so the buckets'
	// meaning) changed.
	if cfg.Window != b.cfg.Window {
		b.width = max(1, int64(cfg.Window)/int64(len(b.buckets)))
		b.buckets = [10]budgetBucket{}
	}
	b.cfg = cfg
}

// bucket returns the current bucket, reset if it is from an older epoch.
func (b *RetryBudget) bucket(epoch int64) *budgetBucket {
	k := &b.buckets[epoch%int64(len(b.buckets))]
	if k.epoch != epoch {
		*k = budgetBucket{epoch: epoch}
	}
	return k
}

func (b *RetryBudget) totals(epoch int64) (reqs, retries int64) {
	for i := range b.buckets {
		k := &b.buckets[i]
		if k.epoch > epoch-int64(len(b.buckets)) && k.epoch <= epoch {
			reqs += k.reqs
			retries += k.retries
		}
	}
	return reqs, retries
}

// Request counts one incoming request (its first attempt).
func (b *RetryBudget) Request() {
	now := b.now().UnixNano()
	b.mu.Lock()
	b.bucket(now/b.width).reqs++ // width changes with the window on reload: read under mu
	b.mu.Unlock()
}

// Retry reports whether one more attempt fits the budget, and counts it if
// so: retries over the window stay within Ratio × requests + MinRetries.
func (b *RetryBudget) Retry() bool {
	now := b.now().UnixNano()
	b.mu.Lock()
	defer b.mu.Unlock()
	epoch := now / b.width
	reqs, retries := b.totals(epoch)
	allowed := b.cfg.Ratio*float64(reqs) + float64(max(0, b.cfg.MinRetries))
	if float64(retries+1) > allowed {
		return false
	}
	b.bucket(epoch).retries++
	return true
}
