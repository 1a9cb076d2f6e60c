package priority_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/priority"
)

// A Tier-1 pool: saturation from live pod metrics after each scrape, then
// admission per request; the pod is picked only once Admit returns.
func Example() {
	m, _ := priority.NewMetrics(prometheus.NewRegistry())
	tenants, _ := priority.NewTenants(map[string]*config.Tenant{
		"search": {Metadata: config.Metadata{Name: "search"}, Spec: config.TenantSpec{MaxBand: config.BandCritical}},
	}, m)
	gate := &priority.Gate{Pool: "llama-8b", Tenants: tenants, Metrics: m}

	// After each scrape (Age is time since that pod's scrape).
	th := priority.DefaultThresholds()
	gate.Observe(th.Pool([]priority.PodLoad{
		{Queue: 6, KVCache: 0.7, Age: 40 * time.Millisecond},
		{Queue: 5, KVCache: 0.9, Age: 30 * time.Millisecond},
	}))

	// Per request: band from x-gateway-inference-objective, capped by policy.
	claimed, _ := priority.ParseObjective("-1", nil)
	band := tenants.Band("search", claimed)
	_, err := gate.Admit(context.Background(), priority.Request{Tenant: "search", Band: band, Bytes: 2048})
	var rej *priority.Rejection
	if errors.As(err, &rej) {
		fmt.Printf("429 Retry-After %.0f (%s, %s)\n", rej.RetryAfter.Seconds(), rej.Band, rej.Reason)
	}
	// Output: 429 Retry-After 1 (Sheddable, saturated)
}

// Tier-2: clusters that can serve the model are combined; a Critical
// request spills to another Region rather than wait when one has headroom.
func ExampleErrSpill() {
	gate := &priority.Gate{Pool: "support-agent-v3@eu-west-1"}
	gate.Observe(priority.Combine(
		priority.Saturation{Value: 1.4, PerRequest: 0.05, Fresh: 4}, // cluster eu-west-1a
		priority.Saturation{Value: 1.1, PerRequest: 0.1, Fresh: 2},  // cluster eu-west-1b
	))
	remoteHasHeadroom := true // from the other Regions' digests
	_, err := gate.Admit(context.Background(), priority.Request{Tenant: "payments", Band: priority.Critical, MaySpill: remoteHasHeadroom})
	fmt.Println(errors.Is(err, priority.ErrSpill))
	// Output: true
}
