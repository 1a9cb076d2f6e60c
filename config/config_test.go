package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
)

const examples = "../deploy/examples"

func TestExamplesValidate(t *testing.T) {
	s, err := config.LoadDir(examples)
	if err != nil {
		t.Fatalf("deploy/examples must validate:\n%v", err)
	}
	if len(s.Gateways) != 2 || s.Topology == nil || len(s.Topology.Spec.Regions) != 2 {
		t.Fatalf("want 2 gateways and 2 Regions, got %d gateways, topology %v", len(s.Gateways), s.Topology)
	}
	for _, a := range []string{"claims-triage-auto", "claims-triage-home", "claims-fraud-notes"} {
		if s.Adapters[a] != "claims-base-llama-8b" {
			t.Errorf("adapter %s maps to %q, want claims-base-llama-8b", a, s.Adapters[a])
		}
	}
	// The claims scheduler's policy comes from the GIE EndpointPickerConfig
	// carried in a ConfigMap.
	p, ok := s.Policy("us-east-1a", "claims")
	if !ok {
		t.Fatal("no policy for us-east-1a/claims")
	}
	want := config.Weights{Queue: 2, KVCache: 1, Prefix: 2, LoraAffinity: 3}
	if p.Weights != want || p.Picker != config.PickerMaxScore || p.BlockSize != 64 || p.LRUCapacityPerServer != 31250 {
		t.Errorf("claims policy = %+v, want weights %+v, max-score, block 64, lru 31250", p, want)
	}
	p, _ = s.Policy("us-east-1a", "support-agent")
	// The example ships the binary's defaults, written out.
	if p.Weights != config.DefaultWeights() || p.Scoring != config.ScoringMeridian {
		t.Errorf("support-agent policy = %+v", p)
	}
	if got := s.Endpoints("us-east-1a", map[string]string{"pool": "llama-8b-mixed"}); len(got) != 3 {
		t.Errorf("us-east-1a llama-8b-mixed endpoints = %d, want 3", len(got))
	}
	if got := s.Endpoints("eu-west-1a", map[string]string{"pool": "llama-8b-mixed"}); len(got) != 2 {
		t.Errorf("eu-west-1a llama-8b-mixed endpoints = %d, want 2", len(got))
	}
}

// The HyperPod scheduler block from the issue validates unchanged.
func TestHyperPodSchedulersUnchanged(t *testing.T) {
	doc := `apiVersion: inference.sagemaker.aws.amazon.com/v1alpha1
kind: InferenceGatewayConfig
metadata:
  name: hyperpod
spec:
  bbr:
    enabled: true
  schedulers:
  - name: support-agent
    modelName: "support-agent-v3"
    modelSelector: {matchLabels: {pool: qwen-32b-agent}}
    weights: {prefix: 5, kvCache: 2, queue: 2}
  - name: doc-summarizer
    modelName: "summarizer-long"
    modelSelector: {matchLabels: {pool: llama-70b-longctx}}
    weights: {kvCache: 5, queue: 2, prefix: 1}
  - name: autocomplete
    modelName: "autocomplete-fast"
    modelSelector: {matchLabels: {pool: llama-8b-mixed}}
    weights: {queue: 4, runningRequests: 3, predictedLatency: 2, prefix: 1}
`
	s := mustBuild(t, doc)
	p, _ := s.Policy("hyperpod", "autocomplete")
	if p.Weights != (config.Weights{Queue: 4, RunningRequests: 3, PredictedLatency: 2, Prefix: 1}) {
		t.Errorf("autocomplete weights = %+v", p.Weights)
	}
}

func mustBuild(t *testing.T, doc string) *config.Snapshot {
	t.Helper()
	return testkit.Snapshot(t, 1, doc)
}

const gwHead = `apiVersion: meridian.dev/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: gw}
spec:
  bbr: {enabled: true}
  schedulers:
`

func sched(name, model, extra string) string {
	return fmt.Sprintf("  - name: %s\n    modelName: %s\n    modelSelector: {matchLabels: {pool: %s}}\n%s", name, model, name, extra)
}

func TestInvalidConfigs(t *testing.T) {
	adapters51 := make([]string, 51)
	for i := range adapters51 {
		adapters51[i] = fmt.Sprintf("ad-%d", i)
	}
	schedulers101 := ""
	for i := 0; i < 101; i++ {
		schedulers101 += sched(fmt.Sprintf("s%d", i), fmt.Sprintf("m%d", i), "")
	}
	cases := []struct {
		name string
		doc  string
		want []string // every substring must appear in the error text
	}{
		{"unknown field", gwHead + sched("a", "m", "    wieghts: {queue: 1}\n"),
			[]string{`test.yaml: InferenceGatewayConfig/gw: spec.schedulers[0].wieghts: strict decoding error: unknown field "wieghts"`}},
		{"unknown weight", gwHead + sched("a", "m", "    weights: {queue: 1, kvcache: 2}\n"),
			[]string{`spec.schedulers[0].weights.kvcache: strict decoding error: unknown field "kvcache"`}},
		{"weights and configMapRef", gwHead + sched("a", "m", "    weights: {queue: 1}\n    configMapRef: {name: x}\n"),
			[]string{"InferenceGatewayConfig/gw: spec.schedulers[0].weights: set either weights or configMapRef, not both"}},
		{"51 adapters", gwHead + sched("a", "m", "    loraAdapters: ["+strings.Join(adapters51, ",")+"]\n"),
			[]string{"spec.schedulers[0].loraAdapters: at most 50 adapters per scheduler, got 51"}},
		{"101 schedulers", gwHead + schedulers101, []string{"spec.schedulers: at most 100 schedulers per gateway, got 101"}},
		{"all-zero weights", gwHead + sched("a", "m", "    weights: {queue: 0}\n"),
			[]string{"spec.schedulers[0].weights: at least one weight must be positive"}},
		{"negative weight", gwHead + sched("a", "m", "    weights: {lru: -1, queue: 1}\n"),
			[]string{"spec.schedulers[0].weights.lru: must be ≥ 0, got -1"}},
		{"duplicate names and models", gwHead + sched("a", "m", "") + sched("a", "m", ""),
			[]string{`spec.schedulers[1].name: duplicate scheduler name "a"`, `spec.schedulers[1].modelName: duplicate modelName "m"`}},
		{"bbr off with two schedulers", strings.Replace(gwHead, "enabled: true", "enabled: false", 1) + sched("a", "m", "") + sched("b", "m2", ""),
			[]string{"spec.bbr.enabled: body-based routing must be enabled with more than one scheduler"}},
		{"configMapRef unresolved", gwHead + sched("a", "m", "    configMapRef: {name: nope}\n"),
			[]string{`spec.schedulers[0].configMapRef.name: no EndpointPickerConfig or ConfigMap named "nope"`}},
		{"wrong type", gwHead + sched("a", "m", "    targetPort: eighty\n"),
			[]string{`spec.schedulers[0].targetPort: want an integer, got string "eighty"`}},
		{"unknown kind", "apiVersion: meridian.dev/v1alpha1\nkind: Gateway\nmetadata: {name: x}\n",
			[]string{`kind: unknown kind "Gateway"`}},
		{"wrong apiVersion", "apiVersion: meridian.dev/v1\nkind: Tenant\nmetadata: {name: x}\n",
			[]string{`apiVersion: "meridian.dev/v1" is not served for Tenant`}},
		{"unknown plugin type", "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nmetadata: {name: e}\nplugins:\n- type: magic-scorer\n",
			[]string{`plugins[0].type: unknown plugin type "magic-scorer"`}},
		{"rewrite target not served", gwHead + sched("a", "m", "") + "---\napiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModelRewrite\nmetadata: {name: r}\nspec:\n  rules:\n  - targets:\n    - {modelRewrite: ghost, weight: 1}\n    - {modelRewrite: m, weight: 0}\n",
			[]string{`test.yaml:11: InferenceModelRewrite/r: spec.rules[0].targets[0].modelRewrite: target model "ghost" is not served`, "spec.rules[0].targets[1].weight: must be 1..1000000, got 0"}},
		{"adapter base not served", gwHead + sched("a", "m", "") + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: ads, labels: {inference.networking.k8s.io/bbr-managed: \"true\"}}\ndata:\n  baseModel: other\n  adapters: |\n    - x\n",
			[]string{`ConfigMap/ads: data.baseModel: base model "other" is not served by any scheduler`}},
		{"tenant limits", "apiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: t}\nspec:\n  maxBand: Gold\n  limits:\n    requests: {limit: 0, per: 1m}\n    tokens: {limit: 5, per: soon}\n",
			[]string{`spec.limits.tokens.per: invalid duration "soon"`}},
		{"tenant band and limit", "apiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: t}\nspec:\n  maxBand: Gold\n  limits:\n    requests: {limit: 0, per: 1m}\n",
			[]string{`spec.maxBand: want Critical, Standard or Sheddable, got "Gold"`, `spec.limits.requests.limit: must be > 0, got 0`}},
		{"duplicate object", "apiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: t}\n---\napiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: t}\n",
			[]string{"Tenant/t: metadata.name: duplicate"}},
		{"missing name", "apiVersion: meridian.dev/v1alpha1\nkind: Tenant\nspec: {}\n", []string{"metadata.name: required"}},
		{"not a mapping", "- a\n- b\n", []string{"a document must be a mapping"}},
		{"bad yaml", "a: [\n", []string{"invalid YAML"}},
		{"admission unknown field", gwHead + sched("a", "m", "    admission: {queueThreshold: 3, reserve: 0.2}\n"),
			[]string{`spec.schedulers[0].admission.reserve: strict decoding error: unknown field "reserve"`}},
		{"admission out of range", gwHead + sched("a", "m", "    admission: {kvCacheThreshold: 1.5, criticalReserve: 1, maxQueued: -1, standardMaxWait: 2h, queueThreshold: -2}\n"),
			[]string{"spec.schedulers[0].admission.kvCacheThreshold: must be a fraction in (0, 1], got 1.5",
				"spec.schedulers[0].admission.criticalReserve: must be a fraction in [0, 1), got 1",
				"spec.schedulers[0].admission.maxQueued: must be 1..1000000, got -1",
				"spec.schedulers[0].admission.standardMaxWait: must be a duration between 0 and 1h, got 2h0m0s",
				"spec.schedulers[0].admission.queueThreshold: must be a number > 0"}},
		{"cluster queue time at Tier-1", gwHead + sched("a", "m", "    admission: {clusterQueueTime: 1s}\n"),
			[]string{"spec.schedulers[0].admission.clusterQueueTime: is Tier-2's: set it in the Topology's spec.routing.admission"}},
		{"admission wrong type", gwHead + sched("a", "m", "    admission: {criticalMaxWait: 30}\n"),
			[]string{`spec.schedulers[0].admission.criticalMaxWait: want a duration string`}},
		{"prefix plugin unknown parameter", "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nmetadata: {name: e}\nplugins:\n- type: prefix-cache-scorer\n  parameters: {blockSize: 32, autoTunes: true}\n",
			[]string{`EndpointPickerConfig/e: plugins[0].parameters.autoTunes: strict decoding error: unknown field "autoTunes"`}},
		{"prefix plugin autoTune false", "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nmetadata: {name: e}\nplugins:\n- type: prefix-cache-scorer\n  parameters: {autoTune: false}\n",
			[]string{`plugins[0].parameters.autoTune: false is not supported`}},
		{"prefix plugin wrong type", "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nmetadata: {name: e}\nplugins:\n- type: prefix-cache-scorer\n  parameters: {lruCapacityPerServer: many}\n",
			[]string{`plugins[0].parameters.lruCapacityPerServer: want an integer, got string "many"`}},
		{"scorer without parameters given one", "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nmetadata: {name: e}\nplugins:\n- type: queue-scorer\n  parameters: {threshold: 3}\n",
			[]string{`EndpointPickerConfig/e: plugins[0].parameters.threshold: strict decoding error: unknown field "threshold" (queue-scorer takes no parameters)`}},
		{"filter parameter misspelt", "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nmetadata: {name: e}\nplugins:\n- type: low-queue-filter\n  parameters: {threshold: 128, treshold: 64}\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 2}\n",
			[]string{`EndpointPickerConfig/e: plugins[0].parameters.treshold: strict decoding error: unknown field "treshold" (low-queue-filter takes threshold)`}},
		{"objective unknown field", "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: o}\nspec: {priority: 1, criticality: Critical}\n",
			[]string{`InferenceObjective/o: spec.criticality: strict decoding error: unknown field "criticality"`}},
		{"objective priority range", "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: o}\nspec: {priority: 9999999999}\n",
			[]string{`InferenceObjective/o: spec.priority: must be -1000000..1000000`}},
		{"scheduler options", gwHead + sched("a", "m", "    options: {fallbacks: 99, kvSaturation: 2, latencyScale: 2h, latencyClassLabel: \"gpu type\", prefix: {blockSize: -1, autoTune: false}}\n"),
			[]string{"spec.schedulers[0].options.fallbacks: must be -1 (none) to 16, got 99",
				"spec.schedulers[0].options.kvSaturation: must be a fraction in (0, 1], got 2",
				"spec.schedulers[0].options.latencyScale: must be a duration between 0 and 1h, got 2h0m0s",
				`spec.schedulers[0].options.latencyClassLabel: must be a label key (such as gpu or example.com/accelerator) or -, got "gpu type"`,
				"spec.schedulers[0].options.prefix.blockSize: must be 1..65536 characters, got -1",
				"spec.schedulers[0].options.prefix.autoTune: false is not supported"}},
		{"scheduler options unknown field", gwHead + sched("a", "m", "    options: {prefix: {blockSizeTokens: 16}}\n"),
			[]string{`spec.schedulers[0].options.prefix.blockSizeTokens: strict decoding error: unknown field "blockSizeTokens"`}},
		{"routing internals", "apiVersion: meridian.dev/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  regions: [{name: r, clusters: [{name: c, tier1: \"http://127.0.0.1:1\"}]}]\n  routing:\n    digestMaxAge: -1s\n    retryBudget: {ratio: 20, budget: 1}\n    outlierDetection: {failureRate: 2, baseEjection: 10s, maxEjection: 1s}\n    admission: {criticalReserve: -0.5}\n",
			[]string{`Topology/t: spec.routing.retryBudget.budget: strict decoding error: unknown field "budget"`}},
		{"routing internals values", "apiVersion: meridian.dev/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  regions: [{name: r, clusters: [{name: c, tier1: \"http://127.0.0.1:1\"}]}]\n  routing:\n    digestMaxAge: -1s\n    retryBudget: {ratio: 20}\n    outlierDetection: {failureRate: 2, baseEjection: 10s, maxEjection: 1s}\n    admission: {criticalReserve: -0.5, clusterQueueTime: 2m}\n",
			[]string{"spec.routing.digestMaxAge: must be a duration between 0 and 1h, got -1s",
				"spec.routing.admission.clusterQueueTime: must be a duration between 0 and 1m, got 2m0s",
				"spec.routing.retryBudget.ratio: must be 0..10 retries per request, got 20",
				"spec.routing.outlierDetection.failureRate: must be a fraction in (0, 1], got 2",
				"spec.routing.outlierDetection.maxEjection: must be at least baseEjection (10s), got 1s",
				"spec.routing.admission.criticalReserve: must be a fraction in [0, 1), got -0.5"}},
		{"gossip and canary analysis", "apiVersion: meridian.dev/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  regions: [{name: r, clusters: [{name: c, tier1: \"http://127.0.0.1:1\"}]}]\n  gossip: {profile: fast, probeInterval: 1s, probeTimeout: 2s, gossipNodes: -1, pushPullInterval: 2h}\n  routing:\n    canaryAnalysis: {period: 10ms, window: -1m}\n",
			[]string{`Topology/t: spec.gossip.profile: want lan, wan or local, got "fast"`,
				"spec.gossip.probeTimeout: must not exceed probeInterval (1s), got 2s",
				"spec.gossip.gossipNodes: must be 0..1000, got -1",
				"spec.gossip.pushPullInterval: must be a duration between 0 and 1h, got 2h0m0s",
				"spec.routing.canaryAnalysis.period: must be at least 100ms, got 10ms",
				"spec.routing.canaryAnalysis.window: must be a duration between 0 and 24h, got -1m0s"}},
		{"gossip unknown field", "apiVersion: meridian.dev/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  regions: [{name: r, clusters: [{name: c, tier1: \"http://127.0.0.1:1\"}]}]\n  gossip: {profile: lan, suspicionMult: 4}\n",
			[]string{`Topology/t: spec.gossip.suspicionMult: strict decoding error: unknown field "suspicionMult"`}},
		{"static endpoint address", "apiVersion: meridian.dev/v1alpha1\nkind: StaticEndpoints\nmetadata: {name: s}\nspec:\n  endpoints:\n  - {name: p, address: nowhere}\n",
			[]string{`spec.endpoints[0].address: want host:port, got "nowhere"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			docs, errs := config.Decode("test.yaml", []byte(tc.doc))
			var err error = errs.Err()
			if err == nil {
				_, err = config.Build(docs, 1)
			} else if _, berr := config.Build(docs, 1); berr != nil {
				err = fmt.Errorf("%v\n%v", err, berr)
			}
			if err == nil {
				t.Fatal("want an error, got none")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

// All problems are reported at once, not only the first.
func TestAllErrorsReported(t *testing.T) {
	doc := gwHead + sched("a", "m", "    weights: {queue: 1, bogus: 2}\n") +
		sched("a", "m2", "    weights: {queue: 1}\n    configMapRef: {name: x}\n")
	docs, errs := config.Decode("all.yaml", []byte(doc))
	_, berr := config.Build(docs, 1)
	bes, _ := config.AsErrors(berr)
	all := append(errs, bes...)
	if len(all) < 3 {
		t.Fatalf("want at least 3 errors (unknown field, duplicate name, weights+configMapRef), got %d:\n%v", len(all), all)
	}
}

func TestLoadDirNamesFile(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "gateways", "prod.yaml"), gwHead+sched("a", "m", "")+sched("b", "m2", "")+
		sched("c", "o", "    weights: {queue: 1}\n    configMapRef: {name: epp}\n"))
	write(t, filepath.Join(dir, "values.yaml"), "replicaCount: 2\n") // not config: skipped
	_, err := config.LoadDir(dir)
	want := filepath.Join(dir, "gateways", "prod.yaml") + ": InferenceGatewayConfig/gw: spec.schedulers[2].weights: set either weights or configMapRef, not both"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error = %v\nwant it to contain %q", err, want)
	}
}

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func FuzzDecode(f *testing.F) {
	entries, _ := filepath.Glob(filepath.Join(examples, "platform", "*.yaml"))
	for _, e := range entries {
		b, err := os.ReadFile(e)
		if err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(gwHead + sched("a", "m", "    weights: {queue: 1}\n")))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("kind: [\n"))
	f.Add([]byte("apiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: t}\nspec: {limits: {requests: {limit: 1, per: 1s}}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		docs, errs := config.Decode("fuzz.yaml", data)
		for _, e := range errs {
			if e.Error() == "" {
				t.Fatal("empty error message")
			}
		}
		s, err := config.Build(docs, 1)
		if err == nil && s == nil {
			t.Fatal("no error and no snapshot")
		}
	})
}

func TestAdmissionAndObjectives(t *testing.T) {
	s := mustBuild(t, gwHead+sched("a", "m", "    admission: {queueThreshold: 3, kvCacheThreshold: 0.7, criticalReserve: 0, maxQueued: 10, standardMaxWait: 2s}\n")+
		"---\napiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: checkout}\nspec: {priority: 10}\n"+
		"---\napiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: default}\nspec: {}\n")
	a := s.Gateways[0].Spec.Schedulers[0].Admission
	if a == nil || a.QueueThreshold != 3 || a.KVCacheThreshold != 0.7 || a.CriticalReserve == nil || *a.CriticalReserve != 0 ||
		a.MaxQueued != 10 || a.StandardMaxWait.D() != 2*time.Second {
		t.Fatalf("admission %+v", a)
	}
	if got := s.ObjectivePriorities(); len(got) != 2 || got["checkout"] != 10 || got["default"] != 0 {
		t.Fatalf("objectives %v", got)
	}
	o := mustBuild(t, gwHead+sched("a", "m", "    options: {fallbacks: -1, queueHalf: 2, prefix: {blockSize: 16, lruCapacityPerServer: 500, autoTune: true}}\n"))
	if pol, _ := o.Policy("gw", "a"); pol.BlockSize != 16 || pol.LRUCapacityPerServer != 500 || pol.MaxPrefixBlocks != 256 {
		t.Fatalf("options.prefix not in the policy: %+v", pol)
	}
	p := mustBuild(t, "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nmetadata: {name: e}\nplugins:\n- type: prefix-cache-scorer\n  parameters: {blockSize: 32, maxPrefixBlocksToMatch: 64, lruCapacityPerServer: 1000, autoTune: true}\n---\n"+
		gwHead+sched("a", "m", "    configMapRef: {name: e}\n"))
	pol, _ := p.Policy("gw", "a")
	if pol.BlockSize != 32 || pol.MaxPrefixBlocks != 64 || pol.LRUCapacityPerServer != 1000 || pol.PrefixAutoTune == nil || !*pol.PrefixAutoTune {
		t.Fatalf("policy %+v", pol)
	}
}

// The parameters GIE defines for its filters and pickers are accepted
// (Meridian's own filters and picker run instead; docs/configuration.md).
func TestGIEPluginParametersAccepted(t *testing.T) {
	mustBuild(t, `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
metadata: {name: e}
plugins:
- type: low-queue-filter
  parameters: {threshold: 128}
- type: lora-affinity-filter
  parameters: {threshold: 0.999}
- type: decision-tree-filter
  name: low-latency-filter
  parameters:
    current: {pluginRef: low-queue-filter}
    nextOnSuccess: {pluginRef: lora-affinity-filter}
- type: queue-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 1}
`)
}
