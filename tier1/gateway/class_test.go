package gateway_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/tier1/gateway"
)

// labelledPods are pool chat's pods with a gpu and an accel label.
const labelledPods = `---
apiVersion: meridian.dev/v1alpha1
kind: StaticEndpoints
metadata: {name: pods}
spec:
  endpoints:
  - {name: a, address: "10.0.0.1:8000", labels: {pool: chat, gpu: h100, accel: fast}}
  - {name: b, address: "10.0.0.2:8000", labels: {pool: chat, gpu: h100, accel: fast}}
  - {name: c, address: "10.0.0.3:8000", labels: {pool: chat, gpu: a10g}}
`

// TestLatencyClassFromLabels: by default a pod's gpu label names its
// latency class; latencyClassLabel names another label, and "-" turns
// classes off. A reload that changes the label moves the pods.
func TestLatencyClassFromLabels(t *testing.T) {
	classes := func(gw *gateway.Gateway) map[string]string {
		out := map[string]string{}
		pv := gw.Pools()[0]
		for _, ep := range pv.Pool.Endpoints() {
			out[endpointName(ep.ID)] = pv.Pool.Class(ep)
		}
		return out
	}
	yaml := func(options string) string {
		y := testkit.ChatGateway
		if options != "" {
			y += "    options: " + options + "\n"
		}
		return y + labelledPods
	}
	gw, err := gateway.New(gateway.Config{Cluster: "c1", Logger: quiet, Registerer: prometheus.NewRegistry()}, testkit.Snapshot(t, 1, yaml("")))
	if err != nil {
		t.Fatal(err)
	}
	want := func(rev int64, options string, w map[string]string) {
		t.Helper()
		if rev > 1 {
			if err := gw.Apply(testkit.Snapshot(t, rev, yaml(options))); err != nil {
				t.Fatal(err)
			}
		}
		if got := classes(gw); len(got) != 3 || got["a"] != w["a"] || got["b"] != w["b"] || got["c"] != w["c"] {
			t.Fatalf("options %q: classes %v, want %v", options, got, w)
		}
	}
	want(1, "", map[string]string{"a": "h100", "b": "h100", "c": "a10g"})
	want(2, "{latencyClassLabel: accel}", map[string]string{"a": "fast", "b": "fast", "c": ""})
	want(3, `{latencyClassLabel: "-"}`, map[string]string{})
}
