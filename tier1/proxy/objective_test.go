package proxy_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/scrape"
)

// objectiveDocs configure two InferenceObjectives (GIE's shape) and a
// tenant that may claim Critical.
const objectiveDocs = `---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: checkout}
spec: {priority: 10}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: nightly-batch}
spec: {priority: -5}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: plain}
spec: {}
---
apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: payments}
spec: {maxBand: Critical}
`

// TestObjectiveByNameOverHTTP: a request to the Tier-1 proxy carrying
// x-gateway-inference-objective: <name> is admitted in the band of the
// configured InferenceObjective (counted by band in
// meridian_priority_decisions_total), and a name that is neither a
// configured objective nor an integer is a 400 in OpenAI's error shape
// that reaches no pod.
func TestObjectiveByNameOverHTTP(t *testing.T) {
	pods := map[string][]*sim.LivePod{
		"chat": startPods(t, "h100", "chat-model", nil, 2),
		"lora": startPods(t, "a10g", "base-8b", []string{"adapter-a", "adapter-b"}, 1),
	}
	reg := prometheus.NewRegistry()
	gw, err := gateway.New(gateway.Config{
		Cluster: "c1", Logger: quiet, Registerer: reg,
		Scrape:  scrape.Config{Interval: 20 * time.Millisecond},
		Options: tier1.Options{MaxMetricsAge: 300 * time.Millisecond},
	}, snapshotWith(t, "{queue: 2, kvCache: 2, prefix: 3}", pods, 1, objectiveDocs))
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, gw)
	(&platform{gw: gw}).waitScraped(t)
	// The Gates judge saturation from their last observation, made every
	// scrape interval: one made before the first scrape says the load is
	// unknown, and a Sheddable request is shed on it (no_metrics). Observe
	// the scraped pods now instead of waiting for the next tick.
	gw.ObservePools()

	decisions := func() map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "meridian_priority_decisions_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				var pool, band string
				for _, lp := range m.GetLabel() {
					switch lp.GetName() {
					case "pool":
						pool = lp.GetValue()
					case "band":
						band = lp.GetValue()
					}
				}
				if pool == "chat" {
					out[band] += m.GetCounter().GetValue()
				}
			}
		}
		return out
	}
	send := func(objective string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chat("chat-model", "hello", false)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(gateway.HeaderFairnessID, "payments")
		req.Header.Set(gateway.HeaderObjective, objective)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for _, tc := range []struct{ objective, band string }{
		{"checkout", "Critical"},
		{"nightly-batch", "Sheddable"},
		{"plain", "Standard"},
	} {
		before := decisions()
		if status, b := send(tc.objective); status != http.StatusOK {
			t.Fatalf("objective %s: status %d: %s", tc.objective, status, b)
		}
		after := decisions()
		for _, band := range []string{"Critical", "Standard", "Sheddable"} {
			want := before[band]
			if band == tc.band {
				want++
			}
			if after[band] != want {
				t.Fatalf("objective %s: %s decisions %v → %v; want the request admitted as %s", tc.objective, band, before[band], after[band], tc.band)
			}
		}
	}

	before := decisions()
	status, b := send("vip")
	var e testkit.OpenAIError
	if status != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || e.Error.Code == "" || !strings.Contains(e.Error.Message, "vip") {
		t.Fatalf("unknown objective: status %d: %s; want a 400 in OpenAI's error shape naming the value", status, b)
	}
	after := decisions()
	for band, n := range after {
		if n != before[band] {
			t.Fatalf("unknown objective admitted as %s", band)
		}
	}
}
