package extproc_test

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// prompt220KB is a chat body of about 220 KB, the prompt size that took
// GIE's picker from ~0.16 s to ~1.1 s TTFT at 150 concurrent.
func prompt220KB(tb testing.TB) []byte {
	body := chat("chat-model", strings.Repeat("Clause 14.2 of the master services agreement applies. ", 4075), false)
	if n := len(body); n < 218_000 || n > 222_000 {
		tb.Fatalf("body is %d bytes, want about 220 KB", n)
	}
	return body
}

// BenchmarkPrompt220KB compares a request with a 220 KB prompt sent to a
// pod directly with the same request carried through the ext_proc picker
// as Envoy would: request headers and the body in 16 KiB chunks in, the
// destination and the body (≤ 62,000-byte chunks) back, the request to
// the picked pod, then the response headers and body through the picker.
// Each iteration does both, on the same pod, in alternating order, so
// load from other processes hits both alike; it reports the medians of
// each and of the per-iteration difference (added-ms). The pods run at
// 1000× model speed and the prompt is cached after the first request, so
// the pod's share is small and steady. Envoy's own forwarding is in
// neither path: what is added is the picker's work and its gRPC hops.
func BenchmarkPrompt220KB(b *testing.B) {
	p := newPlatform(b, nil, 1000)
	body := prompt220KB(b)
	direct := func(addr string) time.Duration {
		start := time.Now()
		resp, err := p.http.Post("http://"+addr+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	picked := p.pods["chat"][0].Addr()
	viaPicker := func() time.Duration {
		start := time.Now()
		pk := p.request(b, b.Context(), call{body: body})
		if pk.immediate != nil {
			b.Fatalf("immediate %d", pk.immediate.GetStatus().GetCode())
		}
		picked = pk.primary()
		if code, _ := p.respond(b, pk, "", body, picked, ""); code != 200 {
			b.Fatalf("status %d", code)
		}
		return time.Since(start)
	}
	// Warm every pod's prefix cache and the connections.
	viaPicker()
	for _, lp := range p.pods["chat"] {
		direct(lp.Addr())
	}
	var ds, xs, added []float64
	b.SetBytes(int64(len(body)))
	i := 0
	for b.Loop() {
		var d, x time.Duration
		if i%2 == 0 {
			x = viaPicker()
			d = direct(picked)
		} else {
			d = direct(picked)
			x = viaPicker()
		}
		i++
		ds, xs, added = append(ds, ms(d)), append(xs, ms(x)), append(added, ms(x-d))
	}
	b.ReportMetric(median(ds), "direct-ms")
	b.ReportMetric(median(xs), "extproc-ms")
	b.ReportMetric(median(added), "added-ms")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// BenchmarkDecide220KB is the picker's request phase alone for a 220 KB
// prompt: headers and body in, destination and body back, over loopback
// gRPC (ns/op, including the Go client playing Envoy). decided-ms is the
// median time from sending the body's last chunk to receiving the
// destination, tail-ms to receiving the body's last chunk back: what the
// picker adds to the critical path when Envoy streams the body to it as
// the client uploads (Envoy opens the upstream request at the
// destination and forwards the body as it comes back).
func BenchmarkDecide220KB(b *testing.B) {
	b.Run("burst", func(b *testing.B) { benchmarkDecide(b, 0) })
	// Envoy receives a caller's upload at network speed: 16 KiB chunks at
	// 1 Gbit/s are 131 µs apart (more here: a sleep's resolution). The
	// picker's work on the chunks before the last then overlaps the
	// upload, and what counts is its work after the last.
	b.Run("1Gbps", func(b *testing.B) { benchmarkDecide(b, 131*time.Microsecond) })
}

func benchmarkDecide(b *testing.B, pace time.Duration) {
	p := newPlatform(b, nil, 1000)
	body := prompt220KB(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var decided, tails []float64
	for b.Loop() {
		pk := p.request(b, b.Context(), call{body: body, pace: pace})
		if pk.immediate != nil {
			b.Fatalf("immediate %d", pk.immediate.GetStatus().GetCode())
		}
		decided, tails = append(decided, ms(pk.decided)), append(tails, ms(pk.tail))
		pk.stream.CloseSend()
		if _, err := pk.stream.Recv(); err != io.EOF {
			b.Fatalf("stream end: %v", err)
		}
	}
	b.ReportMetric(median(decided), "decided-ms")
	b.ReportMetric(median(tails), "tail-ms")
}
