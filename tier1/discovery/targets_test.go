package discovery

import (
	"fmt"
	"slices"
	"testing"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
)

// The configuration the matcher tests run against: two clusters, a
// scheduler per way of finding pods.
const testConfig = `
apiVersion: meridian.dev/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: gw-a}
spec:
  cluster: a
  bbr: {enabled: true}
  schedulers:
  - name: chat             # modelSelector, default port 8000
    modelName: chat-v1
    modelSelector: {matchLabels: {pool: chat}}
  - name: code             # modelSelector, targetPort 9000
    modelName: code-v1
    modelSelector: {matchLabels: {pool: code}}
    targetPort: 9000
  - name: multi            # the InferencePool named "multi": its selector, two ports
    modelName: multi-v1
    modelSelector: {matchLabels: {pool: multi}}
    targetPort: 9999
  - name: embed            # the InferencePool with the same selector, namespace ml
    modelName: embed-v1
    modelSelector: {matchLabels: {pool: embed}}
  - name: empty            # nothing matches
    modelName: empty-v1
    modelSelector: {matchLabels: {pool: nobody}}
---
apiVersion: meridian.dev/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: gw-b}
spec:
  cluster: b
  schedulers:
  - name: chat
    modelName: chat-v1
    modelSelector: {matchLabels: {pool: chat}}
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: multi}
spec:
  selector: {matchLabels: {app: multi-server}}
  targetPorts: [{number: 8000}, {number: 8001}]
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: embeddings, namespace: ml}
spec:
  selector: {matchLabels: {pool: embed}}
  targetPorts: [{number: 7000}]
---
apiVersion: meridian.dev/v1alpha1
kind: StaticEndpoints
metadata: {name: everywhere}
spec:
  endpoints:
  - {name: static-chat, address: "10.9.0.1:8000", labels: {pool: chat}}
  - {name: static-multi, address: "10.9.0.2:8001", labels: {app: multi-server}}
---
apiVersion: meridian.dev/v1alpha1
kind: StaticEndpoints
metadata: {name: only-b}
spec:
  cluster: b
  endpoints:
  - {name: static-chat-b, address: "10.9.1.1:8000", labels: {pool: chat}}
`

func testSnapshot(t testing.TB) *config.Snapshot {
	t.Helper()
	return testkit.Snapshot(t, 1, testConfig)
}

func pod(ns, name, ip string, ready bool, labels ...string) Pod {
	l := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		l[labels[i]] = labels[i+1]
	}
	return Pod{Namespace: ns, Name: name, IP: ip, Ready: ready, Labels: l}
}

// ids renders targets as "ID=Address" for readable comparisons.
func ids(ts []Target) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.ID + "=" + t.Address
	}
	return out
}

func TestEndpoints(t *testing.T) {
	s := testSnapshot(t)
	tests := []struct {
		name      string
		cluster   string
		pods      []Pod
		scheduler string
		want      []string
	}{{
		name:      "ready pods with an IP on the default port, plus the static endpoint every cluster sees",
		cluster:   "a",
		pods:      []Pod{pod("ns", "chat-1", "10.0.0.1", true, "pool", "chat"), pod("ns", "chat-0", "10.0.0.2", true, "pool", "chat", "gpu", "h100")},
		scheduler: "chat",
		want:      []string{"ns/chat-0:8000=10.0.0.2:8000", "ns/chat-1:8000=10.0.0.1:8000", "static-chat=10.9.0.1:8000"},
	}, {
		name:      "not ready pods are left out",
		cluster:   "a",
		pods:      []Pod{pod("ns", "chat-1", "10.0.0.1", false, "pool", "chat"), pod("ns", "chat-2", "10.0.0.3", true, "pool", "chat")},
		scheduler: "chat",
		want:      []string{"ns/chat-2:8000=10.0.0.3:8000", "static-chat=10.9.0.1:8000"},
	}, {
		name:      "pods without an IP, or with a bad one, are left out",
		cluster:   "a",
		pods:      []Pod{pod("ns", "chat-1", "", true, "pool", "chat"), pod("ns", "chat-2", "not-an-ip", true, "pool", "chat")},
		scheduler: "chat",
		want:      []string{"static-chat=10.9.0.1:8000"},
	}, {
		name:      "label mismatch: another value, or the key missing",
		cluster:   "a",
		pods:      []Pod{pod("ns", "x", "10.0.0.1", true, "pool", "chat-v2"), pod("ns", "y", "10.0.0.2", true, "app", "chat")},
		scheduler: "chat",
		want:      []string{"static-chat=10.9.0.1:8000"},
	}, {
		name:      "targetPort is used",
		cluster:   "a",
		pods:      []Pod{pod("ns", "code-1", "10.0.0.5", true, "pool", "code")},
		scheduler: "code",
		want:      []string{"ns/code-1:9000=10.0.0.5:9000"},
	}, {
		name:    "a pool named like the scheduler: its selector, one target per port, the scheduler's selector and port unused",
		cluster: "a",
		pods: []Pod{
			pod("ns", "m-1", "10.0.0.7", true, "app", "multi-server"),
			pod("ns", "m-2", "10.0.0.8", true, "pool", "multi"), // the scheduler's selector only
		},
		scheduler: "multi",
		want: []string{
			"ns/m-1:8000=10.0.0.7:8000",
			"ns/m-1:8001=10.0.0.7:8001",
			"static-multi=10.9.0.2:8001",
		},
	}, {
		name:    "a pool with the scheduler's selector: its ports, only pods of its namespace",
		cluster: "a",
		pods: []Pod{
			pod("ml", "e-1", "10.0.0.9", true, "pool", "embed"),
			pod("other", "e-2", "10.0.0.10", true, "pool", "embed"),
		},
		scheduler: "embed",
		want:      []string{"ml/e-1:7000=10.0.0.9:7000"},
	}, {
		name:      "IPv6 addresses are bracketed",
		cluster:   "a",
		pods:      []Pod{pod("ns", "chat-6", "fd00::1", true, "pool", "chat")},
		scheduler: "chat",
		want:      []string{"ns/chat-6:8000=[fd00::1]:8000", "static-chat=10.9.0.1:8000"},
	}, {
		name:      "a pod listed twice is one target",
		cluster:   "a",
		pods:      []Pod{pod("ns", "chat-1", "10.0.0.1", true, "pool", "chat"), pod("ns", "chat-1", "10.0.0.1", true, "pool", "chat")},
		scheduler: "chat",
		want:      []string{"ns/chat-1:8000=10.0.0.1:8000", "static-chat=10.9.0.1:8000"},
	}, {
		name:      "a scheduler nothing matches has an empty list",
		cluster:   "a",
		pods:      []Pod{pod("ns", "chat-1", "10.0.0.1", true, "pool", "chat")},
		scheduler: "empty",
		want:      []string{},
	}, {
		name:      "cluster scoping: cluster b's gateway sees its own static endpoints and the shared ones",
		cluster:   "b",
		pods:      []Pod{pod("ns", "chat-1", "10.0.0.1", true, "pool", "chat")},
		scheduler: "chat",
		want:      []string{"ns/chat-1:8000=10.0.0.1:8000", "static-chat=10.9.0.1:8000", "static-chat-b=10.9.1.1:8000"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Endpoints(s, tc.cluster, tc.pods)
			ts, ok := got[tc.scheduler]
			if !ok {
				t.Fatalf("no key for scheduler %q in %v", tc.scheduler, got)
			}
			if g := ids(ts); !slices.Equal(g, tc.want) {
				t.Errorf("targets of %q:\n got %q\nwant %q", tc.scheduler, g, tc.want)
			}
		})
	}
}

func TestEndpointsKeysAndScope(t *testing.T) {
	s := testSnapshot(t)
	pods := []Pod{pod("ns", "chat-1", "10.0.0.1", true, "pool", "chat")}

	a := Endpoints(s, "a", pods)
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"chat", "code", "embed", "empty", "multi"}; !slices.Equal(keys, want) {
		t.Errorf("cluster a: schedulers %q, want %q", keys, want)
	}
	if got := ids(a["chat"]); slices.Contains(got, "static-chat-b=10.9.1.1:8000") {
		t.Errorf("cluster a sees cluster b's static endpoint: %q", got)
	}
	if a["empty"] == nil {
		t.Errorf("a scheduler without targets maps to nil, want an empty slice")
	}

	if got := Endpoints(s, "nowhere", pods); got != nil {
		t.Errorf("unknown cluster: got %v, want nil", got)
	}
	if got := Endpoints(nil, "a", pods); got != nil {
		t.Errorf("nil snapshot: got %v, want nil", got)
	}
	// Labels are passed through so that filters can read them (gpu type).
	if l := a["chat"][0].Labels; l["pool"] != "chat" {
		t.Errorf("labels not carried: %v", l)
	}
}

// A static endpoint whose name equals a pod target's ID loses to the pod.
func TestEndpointsPodWinsIDClash(t *testing.T) {
	s := testSnapshot(t)
	clash := *s
	clash.StaticEndpoints = append(slices.Clone(s.StaticEndpoints), &config.StaticEndpoints{
		Spec: config.StaticEndpointsSpec{Endpoints: []config.StaticEndpoint{
			{Name: "ns/chat-1:8000", Address: "192.0.2.1:8000", Labels: map[string]string{"pool": "chat"}},
		}},
	})
	got := ids(Endpoints(&clash, "a", []Pod{pod("ns", "chat-1", "10.0.0.1", true, "pool", "chat")})["chat"])
	want := []string{"ns/chat-1:8000=10.0.0.1:8000", "static-chat=10.9.0.1:8000"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// The result depends only on the input set, not its order.
func TestEndpointsDeterministic(t *testing.T) {
	s := testSnapshot(t)
	pods := benchPods(200)
	want := Endpoints(s, "a", pods)
	rev := slices.Clone(pods)
	slices.Reverse(rev)
	got := Endpoints(s, "a", rev)
	for name, ts := range want {
		if !slices.Equal(ids(got[name]), ids(ts)) {
			t.Errorf("%s: order of pods changed the result", name)
		}
	}
}

func benchPods(n int) []Pod {
	pools := []string{"chat", "code", "embed", "other"}
	pods := make([]Pod, n)
	for i := range pods {
		ns := "ns"
		if pools[i%len(pools)] == "embed" {
			ns = "ml"
		}
		pods[i] = pod(ns, fmt.Sprintf("pod-%04d", i), fmt.Sprintf("10.1.%d.%d", i/250, i%250), i%10 != 0,
			"pool", pools[i%len(pools)], "gpu", "h100")
	}
	return pods
}

func BenchmarkEndpoints(b *testing.B) {
	s := testSnapshot(b)
	for _, n := range []int{100, 1000} {
		pods := benchPods(n)
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Endpoints(s, "a", pods)
			}
		})
	}
}
