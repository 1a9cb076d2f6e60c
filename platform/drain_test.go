package platform_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/platform"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/tier2"
)

// drainDoor is a front door as StartTier2 serves it (over a real
// router), in front of one simulated pod standing in for the cluster's
// Tier-1.
type drainDoor struct {
	addr   string
	url    string
	cancel context.CancelFunc // what SIGTERM/SIGINT do (main's NotifyContext)
	served <-chan error       // serve's result
}

func startDrainDoor(t *testing.T, pod string, drainAfter time.Duration) *drainDoor {
	t.Helper()
	snap := testkit.SnapshotFile(t, "drain.yaml", 1, testkit.Topology(testkit.Cluster{Region: "r1", Name: "c1", Tier1: pod})+
		testkit.Gateway("r1", "c1")+"  bbr: {enabled: true}\n"+testkit.ChatScheduler)
	fleet, err := regions.NewFleet(regions.Config{LocalRegion: "r1", Clusters: regions.ClustersFromTopology(snap.Topology),
		DigestMaxAge: time.Hour}) // one digest for the whole test
	if err != nil {
		t.Fatal(err)
	}
	fleet.Digests().Put(regions.Digest{Region: "r1", Cluster: "c1", Pool: "chat-model", Model: "chat-model", ReadyPods: 1, TotalPods: 1,
		Headroom: 1, Version: 1, Produced: time.Now()})
	log := slog.New(slog.DiscardHandler)
	r, err := tier2.NewRouter(tier2.Config{Region: "r1", Fleet: fleet, InsecureNoAuth: true, Logger: log}, snap)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr, served, closeNow, err := platform.ServeFrontDoor(ctx, r.Handler(), r.Abort, drainAfter, log)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	d := &drainDoor{addr: addr, url: "http://" + addr, cancel: cancel, served: served}
	t.Cleanup(func() {
		cancel()
		closeNow()
	})
	return d
}

// openStreams starts n streaming requests and returns once each has
// received its first event; their outcomes arrive on the channel.
func (d *drainDoor) openStreams(t *testing.T, n, maxTokens int) <-chan streamOutcome {
	t.Helper()
	out := make(chan streamOutcome, n)
	var started sync.WaitGroup
	started.Add(n)
	for i := range n {
		go func() {
			body := fmt.Sprintf(`{"model":"chat-model","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"drain %d"}]}`, maxTokens, i)
			resp, err := http.Post(d.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				started.Done()
				out <- streamOutcome{err: err}
				return
			}
			defer resp.Body.Close()
			o := streamOutcome{status: resp.StatusCode}
			sc := bufio.NewScanner(resp.Body)
			first := true
			for sc.Scan() {
				data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
				if !ok {
					continue
				}
				if first {
					first = false
					started.Done()
				}
				if bytes.Equal(data, []byte("[DONE]")) {
					o.done = true
					break
				}
				if bytes.HasPrefix(data, []byte(`{"error"`)) {
					o.errEvent = string(data)
					break
				}
				o.chunks++
			}
			if first {
				started.Done()
			}
			out <- o
		}()
	}
	started.Wait()
	return out
}

// refuses reports whether a new connection to the door is refused.
func (d *drainDoor) refuses() bool {
	c, err := net.Dial("tcp", d.addr)
	if err == nil {
		c.Close()
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// SIGTERM/SIGINT under load (the run context ends, as main's
// NotifyContext ends it): Tier-2 stops accepting at once, lets the open
// streams finish, and returns nil (exit 0). Streams still open at the
// drain deadline end with a shutting_down error event, never cut silently.
func TestTier2DrainUnderLoad(t *testing.T) {
	prof, err := sim.LookupProfile("h100")
	if err != nil {
		t.Fatal(err)
	}
	pods, err := sim.StartPods(t.Context(), sim.PodSpec{Pod: sim.PodConfig{Name: "p", Profile: prof, Model: "chat-model"}, TimeScale: 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pods[0].Close() })
	const streams = 16

	t.Run("streams finish within the deadline", func(t *testing.T) {
		d := startDrainDoor(t, pods[0].URL(), 0) // the shipped 30 s
		outcomes := d.openStreams(t, streams, 200)
		d.cancel()
		testkit.Eventually(t, "new connections refused while draining", d.refuses)
		for range streams {
			if o := <-outcomes; !o.done || o.chunks == 0 {
				t.Errorf("in-flight stream did not finish with [DONE] during the drain: %+v", o)
			}
		}
		if err := <-d.served; err != nil {
			t.Fatalf("serve after the drain: %v, want nil (exit 0)", err)
		}
	})

	t.Run("streams open at the deadline get an error event", func(t *testing.T) {
		d := startDrainDoor(t, pods[0].URL(), 100*time.Millisecond)
		outcomes := d.openStreams(t, streams, 100000) // far longer than the drain
		d.cancel()
		for range streams {
			o := <-outcomes
			if o.cutSilently() || !strings.Contains(o.errEvent, `"code":"shutting_down"`) {
				t.Errorf("stream at the drain deadline: %+v, want a shutting_down error event", o)
			}
		}
		if err := <-d.served; err != nil {
			t.Fatalf("serve after the drain: %v, want nil (exit 0)", err)
		}
	})
}
