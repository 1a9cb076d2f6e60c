package gossip_test

import (
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/tier2/gossip/faultnet"
)

// watchedStore is a regions.DigestStore registered as a gossip channel, as
// Tier-2 registers it, which also reports when a wanted digest version has
// arrived.
type watchedStore struct {
	*regions.DigestStore
	mu      sync.Mutex
	want    regions.Key
	version uint64
	arrived chan time.Time
}

func (w *watchedStore) Merge(from string, payload []byte) {
	w.DigestStore.Merge(from, payload)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.arrived == nil {
		return
	}
	if d, ok := w.Get(w.want); ok && d.Version >= w.version {
		w.arrived <- time.Now()
		w.arrived = nil
	}
}

func (w *watchedStore) expect(k regions.Key, version uint64) <-chan time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan time.Time, 1)
	w.want, w.version, w.arrived = k, version, ch
	if d, ok := w.Get(k); ok && d.Version >= version {
		ch <- time.Now()
		w.arrived = nil
	}
	return ch
}

// spreadDigest has node src accept a new digest version from its (pretend)
// Tier-1 feed and returns how long until every other node held it.
func (c *cluster) spreadDigest(t testing.TB, src int, version uint64) time.Duration {
	t.Helper()
	d := regions.Digest{Region: c.nodes[src].Region(), Cluster: "c1", Pool: "llama", Model: "llama",
		ReadyPods: 3, TotalPods: 3, Headroom: 0.5, Version: version, Produced: time.Now()}
	waits := make([]<-chan time.Time, len(c.stores))
	for i, s := range c.stores {
		if i != src {
			waits[i] = s.expect(d.Key(), version)
		}
	}
	start := time.Now()
	if ok, err := c.stores[src].Put(d); !ok || err != nil {
		t.Fatalf("Put = %v, %v", ok, err)
	}
	var last time.Time
	for i, w := range waits {
		if w == nil {
			continue
		}
		select {
		case at := <-w:
			if at.After(last) {
				last = at
			}
		case <-time.After(bound):
			t.Fatalf("%s never received digest version %d", c.names[i], version)
		}
	}
	return last.Sub(start)
}

func TestDigestSurvivesPartition(t *testing.T) {
	// A digest published on one side of a partition reaches the other side
	// after the heal through push/pull, while it is still fresh.
	c := startCluster(t, 4, []string{"a", "b"}, healsFast(200*time.Millisecond))
	c.net.Partition(faultnet.Region("a"), faultnet.Region("b"))
	for _, i := range []int{0, 2} { // side a
		await(t, c.sets[i].WaitMembers(gone(c.names[1], c.names[3])), c.names[i]+" to declare side b dead")
	}
	key := regions.Key{Region: "a", Cluster: "c1", Pool: "llama"}
	wait := c.stores[1].expect(key, 7)
	sameSide := c.stores[2].expect(key, 7)
	d := regions.Digest{Region: "a", Cluster: "c1", Pool: "llama", Model: "llama", ReadyPods: 1, Version: 7, Produced: time.Now()}
	if ok, err := c.stores[0].Put(d); !ok || err != nil {
		t.Fatal(ok, err)
	}
	select {
	case <-sameSide:
	case <-time.After(bound):
		t.Fatal("digest did not reach its own side")
	}
	select {
	case <-wait:
		t.Fatal("digest crossed the partition")
	default:
	}
	c.net.Heal()
	select {
	case <-wait:
	case <-time.After(bound):
		t.Fatal("digest did not reach the other side after the heal")
	}
}
