package main

import (
	"net/http"
	"slices"
	"testing"
	"time"
)

// BenchmarkShed429 measures what a Sheddable caller waits for its 429 at a
// saturated pool, over loopback HTTP with keep-alive connections, from
// the client's side: at Tier-1 (the proxy, GIE's negative priority) and at
// Tier-2 (JWT claim Sheddable, home saturated according to Tier-1's
// digest). p99-ms is the 99th percentile of the iterations.
func BenchmarkShed429(b *testing.B) {
	p := newPlatform(b)
	heal := p.overload(b)
	defer heal()
	cases := []struct {
		name   string
		url    string
		header map[string]string
	}{
		{"tier1", p.t1["home"].url, map[string]string{"x-gateway-inference-objective": "-1", "x-gateway-inference-fairness-id": "batch"}},
		{"tier2", p.t2url, map[string]string{"Authorization": p.token("batch", "Sheddable")}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			var took []time.Duration
			for b.Loop() {
				r := post(tc.url, tc.header)
				if r.status != http.StatusTooManyRequests {
					b.Fatalf("%d %s %v", r.status, r.body, r.err)
				}
				took = append(took, r.took)
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)*99/100])/float64(time.Millisecond), "p99-ms")
		})
	}
}
