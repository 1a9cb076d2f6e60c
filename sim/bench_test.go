package sim

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
)

// BenchmarkMooncakeReplay replays the whole Mooncake conversation trace
// (12,031 requests, 59 minutes) on a virtual fleet, the way the replay tool
// drives the engine: metric snapshots of every pod every 50 ms of virtual
// time, and a pick at each arrival. It reports requests replayed per
// second of wall time.
func BenchmarkMooncakeReplay(b *testing.B) {
	reqs, at := loadMooncake(b, 0)
	for _, tc := range []struct {
		name  string
		pods  int
		picky bool // pick the least-loaded pod from the last scrape, else round-robin
	}{
		{"pods=8/round-robin", 8, false},
		{"pods=8/least-loaded", 8, true},
		{"pods=16/least-loaded", 16, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := testkit.CPUTime()
			for b.Loop() {
				e := NewEngine(1)
				for i := 0; i < tc.pods; i++ {
					prof := "h100"
					if i%2 == 1 {
						prof = "a100"
					}
					if _, err := e.AddPod(PodConfig{Name: fmt.Sprint(prof, i), Profile: mustProfile(b, prof)}); err != nil {
						b.Fatal(err)
					}
				}
				pods := e.Pods()
				snap := make([]Metrics, len(pods))
				e.Every(50*time.Millisecond, func() {
					for i, p := range pods {
						snap[i] = p.Metrics()
					}
				})
				failed := 0
				done := func(o Outcome) {
					if o.Err != nil {
						failed++
					}
				}
				for i := range reqs {
					e.At(at[i], func() {
						pick := i % len(pods)
						if tc.picky {
							for j := range snap {
								if snap[j].Waiting+snap[j].Running < snap[pick].Waiting+snap[pick].Running {
									pick = j
								}
							}
							snap[pick].Running++ // count in-flight work between scrapes
						}
						e.Submit(pods[pick], reqs[i], done)
					})
				}
				e.Run()
				if failed > 0 {
					b.Fatalf("%d requests failed", failed)
				}
			}
			b.ReportMetric(float64(len(reqs))*float64(b.N)/b.Elapsed().Seconds(), "req/s")
			// CPU time is steadier than wall time on a shared machine.
			b.ReportMetric((testkit.CPUTime()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
		})
	}
}

// BenchmarkLivePod measures one live pod's HTTP cost per request on
// loopback, with model time made negligible (time scale 10⁶): a 16-token
// chat completion, non-streaming, streamed with a usage chunk, and streamed
// with usage in every chunk too.
func BenchmarkLivePod(b *testing.B) {
	prof := mustProfile(b, "h100")
	pods, err := StartPods(context.Background(), PodSpec{Pod: PodConfig{Profile: prof}, TimeScale: 1e6}, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer pods[0].Close()
	url := pods[0].URL() + "/v1/chat/completions"
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	defer c.CloseIdleConnections()
	for _, tc := range []struct{ name, options string }{
		{"non-streaming", ""},
		{"streaming", `,"stream":true,"stream_options":{"include_usage":true}`},
		// What Tier-2 asks of every stream, to settle on what was relayed.
		{"streaming-continuous-usage", `,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`},
	} {
		body := `{"messages":[{"role":"user","content":"` + strings.Repeat("hello ", 100) + `"}],"max_tokens":16` + tc.options + "}"
		name := tc.name
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				resp, err := c.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || n == 0 {
					b.Fatalf("%s, %d bytes", resp.Status, n)
				}
			}
		})
	}
}
