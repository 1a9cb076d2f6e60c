package gateway_test

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/request"
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

// TestNonStreamedAnswerIsNotAFirstToken: a non-streamed response's first
// byte comes with its last token. Once the pod's model has seen a
// streamed first token, such an answer, however slow, does not move it:
// gw.PrefillSeconds (the model's prefill price) stays where the streamed
// first tokens put it, while another streamed one still moves it.
func TestNonStreamedAnswerIsNotAFirstToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gw, eps, _ := newGateway(t, gateway.Config{}, "")
		load(gw, eps, map[string]int{"a": 0, "b": 0})
		send := func(stream bool, took time.Duration) {
			t.Helper()
			b := &request.Body{Model: "chat-model", Kind: request.Chat, Stream: stream,
				Messages: []request.Message{{Role: "user", Content: strings.Repeat("x", 4000)}}}
			d, err := gw.Decide(b, gateway.Meta{})
			if err != nil {
				t.Fatal(err)
			}
			att := gw.Dispatch(d, eps["a"])
			time.Sleep(took) // the fake clock of the bubble: the pod's answer time
			att.FirstByte()
			att.Done(200, false)
		}
		for range 20 {
			send(true, 200*time.Millisecond)
		}
		price := gw.PrefillSeconds("chat-model", 1000)
		for range 20 {
			send(false, 20*time.Second)
		}
		if got := gw.PrefillSeconds("chat-model", 1000); got != price {
			t.Fatalf("20 s non-streamed answers moved the prefill price from %.4f to %.4f s", price, got)
		}
		send(true, 2*time.Second)
		if got := gw.PrefillSeconds("chat-model", 1000); got == price {
			t.Fatalf("a streamed first token at 2 s left the prefill price at %.4f s", got)
		}
	})
}
