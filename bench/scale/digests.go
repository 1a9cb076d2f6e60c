package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/meridian-router/meridian/regions"
)

// trackedPools is how many pools' digests are followed to every instance
// (spread over the Regions); every pool is published.
const trackedPools = 40

// sampleEvery is how often the tracked pools are looked up at every
// instance: the resolution of the convergence times.
const sampleEvery = 100 * time.Millisecond

// digestTracker plays every cluster's Tier-1 (a digest of each pool every
// DigestInterval, put into the store of every instance of the cluster's
// Region, as each Tier-2 follows its Region's Tier-1s) and measures how
// long each tracked digest takes to be held everywhere.
type digestTracker struct {
	o     options
	insts []*instance
	pools []regions.Key
	byReg map[string][]*instance

	mu        sync.Mutex
	versions  map[regions.Key]uint64
	pending   map[regions.Key][]version // tracked pools' versions not yet everywhere
	recording bool
	times     []time.Duration
	healed    time.Time
	afterHeal map[regions.Key]bool // tracked pools held everywhere in a version produced after the heal
}

type version struct {
	v        uint64
	produced time.Time
}

func newDigestTracker(o options, insts []*instance, regionName func(int) string) *digestTracker {
	t := &digestTracker{o: o, insts: insts, byReg: map[string][]*instance{},
		versions: map[regions.Key]uint64{}, pending: map[regions.Key][]version{}}
	for _, in := range insts {
		t.byReg[in.region] = append(t.byReg[in.region], in)
	}
	for c := range o.Clusters {
		for p := range o.PoolsPer {
			t.pools = append(t.pools, regions.Key{Region: regionName(c % o.Regions), Cluster: fmt.Sprintf("c%03d", c), Pool: fmt.Sprintf("pool-%d", p)})
		}
	}
	return t
}

func (t *digestTracker) tracked(i int) bool {
	return len(t.pools) <= trackedPools || i%(len(t.pools)/trackedPools) == 0
}

func (t *digestTracker) produce(ctx context.Context) {
	tick := time.NewTicker(t.o.DigestInterval)
	defer tick.Stop()
	for {
		for i, k := range t.pools {
			now := time.Now()
			t.mu.Lock()
			t.versions[k]++
			v := t.versions[k]
			if t.tracked(i) {
				t.pending[k] = append(t.pending[k], version{v, now})
			}
			t.mu.Unlock()
			d := regions.Digest{Region: k.Region, Cluster: k.Cluster, Pool: k.Pool, Model: "llama-70b",
				Adapters: []string{"sql-lora", "chat-lora"}, HotAdapters: []string{"sql-lora"},
				ReadyPods: 8, TotalPods: 8, QueueTotal: 3, QueueMax: 2, KVMean: 0.4, KVMax: 0.6, Running: 20,
				TTFTP50: 120 * time.Millisecond, TTFTP99: 900 * time.Millisecond, Headroom: 0.5, PrefixHitRatio: 0.3,
				Saturation: 0.5, FreshPods: 8, MaxModelLen: 32768, Version: v, Produced: now}
			for _, in := range t.byReg[k.Region] {
				_, _ = in.store.Put(d)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (t *digestTracker) sample(ctx context.Context) {
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.mu.Lock()
		keys := make([]regions.Key, 0, len(t.pending))
		for k := range t.pending {
			keys = append(keys, k)
		}
		t.mu.Unlock()
		for _, k := range keys {
			oldest := ^uint64(0)
			for _, in := range t.insts {
				d, ok := in.store.Get(k)
				if !ok {
					oldest = 0
					break
				}
				oldest = min(oldest, d.Version)
			}
			now := time.Now()
			t.mu.Lock()
			p := t.pending[k]
			for len(p) > 0 && p[0].v <= oldest {
				if t.recording {
					t.times = append(t.times, now.Sub(p[0].produced))
				}
				if !t.healed.IsZero() && p[0].produced.After(t.healed) {
					t.afterHeal[k] = true
				}
				p = p[1:]
			}
			// A version everyone skipped for a newer one is not a sample.
			t.pending[k] = p
			t.mu.Unlock()
		}
	}
}

// record starts or stops collecting convergence times.
func (t *digestTracker) record(on bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.recording = on
}

func (t *digestTracker) healedAt(at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.healed, t.afterHeal = at, map[regions.Key]bool{}
}

// caughtUp reports whether every tracked pool is held everywhere in a
// version produced after the heal.
func (t *digestTracker) caughtUp() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.afterHeal) == len(t.pending)
}

// quantiles returns the P50 and P99 convergence times in seconds, the
// samples behind them, and how many tracked versions produced while
// recording were still not everywhere when it stopped.
func (t *digestTracker) quantiles() (p50, p99 float64, n, unconverged int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.pending {
		unconverged += len(p)
	}
	ts := slices.Clone(t.times)
	slices.Sort(ts)
	if len(ts) == 0 {
		return -1, -1, 0, unconverged
	}
	return ts[len(ts)/2].Seconds(), ts[len(ts)*99/100].Seconds(), len(ts), unconverged
}
