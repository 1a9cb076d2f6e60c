package config_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/meridian-router/meridian/config"
)

// everyField is configuration that sets every nested object of the schema
// the example platform leaves out: the Tier-2 routing internals and gossip
// timings, a scheduler's options and admission, the JWT clock skew, an
// InferenceObjective, an InferencePool, a rollout with its analysis and a
// tenant's per-model and per-band limits.
const everyField = `apiVersion: meridian.dev/v1alpha1
kind: Topology
metadata: {name: t}
spec:
  regions:
  - name: r
    tier2: ["127.0.0.1:8080"]
    gossip: ["127.0.0.1:7946"]
    clusters: [{name: c, tier1: "http://127.0.0.1:1", health: "127.0.0.1:2"}]
  gossip: {profile: lan, gossipInterval: 200ms, gossipNodes: 3, pushPullInterval: 30s, probeInterval: 1s, probeTimeout: 500ms, streamTimeout: 10s}
  routing:
    weights: {kvHeadroom: 1}
    rtts: [{a: r, b: r, rtt: 1ms}]
    digestMaxAge: 5s
    retryBudget: {ratio: 0.2, window: 10s, minRetries: 3}
    outlierDetection: {consecutiveFailures: 5, failureRate: 0.5, minRequests: 20, interval: 10s, baseEjection: 2s, maxEjection: 2m, ejectionMemory: 5m, readmitShare: 0.1, readmitStep: 1s}
    admission: {queueThreshold: 5, kvCacheThreshold: 0.8, staleAfter: 2s, criticalReserve: 0.65, maxQueued: 1000, maxQueuedBytes: 1000000, standardMaxWait: 10s, criticalMaxWait: 30s, retryAfter: 1s, clusterQueueTime: 500ms}
    canaryAnalysis: {period: 5s, window: 1m}
---
apiVersion: meridian.dev/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: c}
spec:
  region: r
  cluster: c
  auth:
    jwt:
      issuer: https://auth.example.com/
      audiences: [meridian]
      jwksFile: keys.json
      clockSkew: 30s
      requiredClaims: {present: [sub], tenant: tenant, criticality: criticality}
  schedulers:
  - name: chat
    modelName: chat-model
    modelSelector: {matchLabels: {pool: chat}}
    weights: {queue: 1}
    options: {fallbacks: 2, maxMetricsAge: 1s, queueHalf: 4, runningHalf: 64, queueSaturation: 8, kvSaturation: 0.95, latencyScale: 500ms, latencyClassLabel: nvidia.com/gpu.product, prefix: {blockSize: 64, maxPrefixBlocksToMatch: 256, lruCapacityPerServer: 31250, autoTune: true}}
    admission: {queueThreshold: 5}
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: chat-pool}
spec:
  selector: {matchLabels: {pool: chat}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: epp, port: {number: 9002}, failureMode: FailClose}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: checkout}
spec: {priority: 1, poolRef: {name: chat-pool}}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {name: chat}
spec:
  poolRef: {name: chat-pool}
  rules:
  - matches: [{model: {type: Exact, value: chat}}]
    targets: [{modelRewrite: chat-model, weight: 1}]
  stickiness: {key: tenant, salt: s}
  rollout: {stable: chat-model, canary: chat-model, steps: [50, 100], interval: 1m, analysis: {maxTTFTP99Ratio: 1.5, maxErrorRateDelta: 0.05, max429RateDelta: 0.1, minRequests: 20}}
---
apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: payments}
spec:
  maxBand: Critical
  limits:
    requests: {limit: 10, per: 1m}
    perModel: [{model: chat, tokens: {limit: 100, per: 1m}}]
    perBand: [{band: Critical, requests: {limit: 5, per: 1m}}]
`

// freeForm are the maps whose keys are the operator's (labels, ConfigMap
// data), where any key is valid.
var freeForm = []string{"labels", "annotations", "matchLabels", "data"}

// TestUnknownFieldAnywhere adds an unknown field to every object of every
// document — the example platform's, GIE's EndpointPickerConfig plugin
// parameters among them, and everyField's — one at a time, and checks
// that each is refused with its full path.
func TestUnknownFieldAnywhere(t *testing.T) {
	type doc struct {
		file string
		obj  map[string]any
	}
	var docs []doc
	add := func(file string, data []byte) {
		for _, part := range strings.Split(string(data), "\n---") {
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(part), &obj); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if obj["kind"] != nil {
				docs = append(docs, doc{file, obj})
			}
		}
	}
	add("every.yaml", []byte(everyField))
	files, err := filepath.Glob(filepath.Join(examples, "platform", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("example platform: %v, %d files", err, len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		add(filepath.Base(f), b)
	}
	// Every document validates as it is (alone, or with the others of its
	// set), so the only error below is the unknown field.
	checked := 0
	for _, d := range docs {
		var paths []string
		objects(d.obj, "", func(path string) { paths = append(paths, path) })
		sort.Strings(paths)
		for _, path := range paths {
			b, err := json.Marshal(withField(d.obj, path, "bogusField"))
			if err != nil {
				t.Fatal(err)
			}
			_, errs := config.Decode(d.file, b)
			want := "bogusField"
			if path != "" {
				want = path + ".bogusField"
			}
			kind, name := d.obj["kind"], ""
			if md, ok := d.obj["metadata"].(map[string]any); ok {
				name, _ = md["name"].(string)
			}
			err = errs.Err()
			if err == nil {
				// Some kinds check parameters when the configuration is
				// built (EndpointPickerConfig plugin parameters).
				_, err = config.Build(errsDocs(t, d.file, b), 1)
			}
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `unknown field "bogusField"`) {
				t.Errorf("%s: %v/%s: unknown field at %q: got %v; want an error naming %s", d.file, kind, name, path, err, want)
			}
			checked++
		}
	}
	t.Logf("%d objects checked in %d documents", checked, len(docs))
}

func errsDocs(t *testing.T, file string, b []byte) []config.Document {
	docs, _ := config.Decode(file, b)
	return docs
}

// objects calls f with the path of every object (JSON mapping) in v that
// is part of the schema, path "" for the document itself.
func objects(v any, path string, f func(string)) {
	switch x := v.(type) {
	case map[string]any:
		f(path)
		for k, e := range x {
			if contains(freeForm, k) {
				continue
			}
			p := k
			if path != "" {
				p = path + "." + k
			}
			objects(e, p, f)
		}
	case []any:
		for i, e := range x {
			objects(e, fmt.Sprintf("%s[%d]", path, i), f)
		}
	}
}

// withField returns a deep copy of obj with key set to 1 in the object at
// path.
func withField(obj map[string]any, path, key string) map[string]any {
	b, _ := json.Marshal(obj)
	var c map[string]any
	json.Unmarshal(b, &c)
	var target any = c
	for _, tok := range tokens(path) {
		if i, ok := tok.(int); ok {
			target = target.([]any)[i]
		} else {
			target = target.(map[string]any)[tok.(string)]
		}
	}
	target.(map[string]any)[key] = 1
	return c
}

// tokens splits "spec.regions[0].clusters" into "spec", "regions", 0,
// "clusters".
func tokens(path string) []any {
	var out []any
	if path == "" {
		return nil
	}
	for _, seg := range strings.Split(path, ".") {
		key, rest, _ := strings.Cut(seg, "[")
		out = append(out, key)
		for rest != "" {
			var i int
			fmt.Sscanf(rest, "%d]", &i)
			out = append(out, i)
			_, rest, _ = strings.Cut(rest, "[")
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}
