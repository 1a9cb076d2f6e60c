package deploytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
	yamlv2 "go.yaml.in/yaml/v2"

	promdeploy "github.com/meridian-router/meridian/deploy/prometheus"
	"github.com/meridian-router/meridian/internal/testkit"
)

// promtool returns the path of promtool (testkit.Binary: skipped without
// it on a developer's machine, failed under CI).
func promtool(t *testing.T) string {
	t.Helper()
	return testkit.Binary(t, "promtool", "apt-get install prometheus")
}

// runPromtool runs promtool in dir and returns its combined output.
func runPromtool(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// layOut copies the embedded files into a temporary directory, the way a
// deployment would mount them.
func layOut(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{promdeploy.KubernetesConfig, promdeploy.LocalConfig, promdeploy.RecordingRules, promdeploy.AlertRules, promdeploy.RulesTest} {
		data, err := promdeploy.Files.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		// The embedded copy must be the file in the tree.
		disk, err := os.ReadFile(filepath.Join(repo, "deploy/prometheus", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, disk) {
			t.Fatalf("%s: embedded copy differs from the file", name)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestPromtoolCheckRules(t *testing.T) {
	dir := layOut(t)
	out, err := runPromtool(t, dir, "check", "rules", promdeploy.RecordingRules, promdeploy.AlertRules)
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

func TestPromtoolTestRules(t *testing.T) {
	dir := layOut(t)
	out, err := runPromtool(t, dir, "test", "rules", promdeploy.RulesTest)
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	if !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool test rules: no SUCCESS in\n%s", out)
	}
}

// TestPromtoolTestRulesCanFail breaks one alert threshold and expects the
// unit tests to catch it.
func TestPromtoolTestRulesCanFail(t *testing.T) {
	dir := layOut(t)
	path := filepath.Join(dir, promdeploy.AlertRules)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	broken := bytes.Replace(data, []byte("pool:vllm_num_requests_waiting:spread > 8"), []byte("pool:vllm_num_requests_waiting:spread > 80"), 1)
	if bytes.Equal(broken, data) {
		t.Fatal("the queue-spread alert expression changed; update this test")
	}
	if err := os.WriteFile(path, broken, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runPromtool(t, dir, "test", "rules", promdeploy.RulesTest)
	if err == nil {
		t.Fatalf("promtool test rules passed with a broken threshold:\n%s", out)
	}
	if !strings.Contains(out, "MeridianQueueSpreadHigh") {
		t.Errorf("the failure does not name the alert:\n%s", out)
	}
}

// TestLocalConfig lays out the local platform's configuration with
// WriteLocal, as the end-to-end test does, and has promtool check it,
// rule files and target lists included.
func TestLocalConfig(t *testing.T) {
	dir := t.TempDir()
	targets := promdeploy.LocalTargets{
		ModelServers: []promdeploy.TargetGroup{
			{Targets: []string{"127.0.0.1:18110", "127.0.0.1:18111"}, Labels: map[string]string{"pool": "qwen-32b-agent"}},
		},
		Meridian: []promdeploy.TargetGroup{
			{Targets: []string{"127.0.0.1:9100"}, Labels: map[string]string{"tier": "tier2"}},
		},
	}
	cfg, err := promdeploy.WriteLocal(dir, targets)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "targets", "model-servers.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got []promdeploy.TargetGroup
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Labels["pool"] != "qwen-32b-agent" || len(got[0].Targets) != 2 {
		t.Fatalf("model-servers.json = %s", data)
	}
	out, err := runPromtool(t, dir, "check", "config", cfg)
	if err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	if strings.Contains(out, "WARNING") {
		t.Errorf("promtool warns:\n%s", out)
	}
}

func TestLocalTargetsValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		targets promdeploy.LocalTargets
		want    string
	}{
		{"pod without pool", promdeploy.LocalTargets{ModelServers: []promdeploy.TargetGroup{{Targets: []string{"127.0.0.1:1"}}}}, "pool label is required"},
		{"meridian with pool", promdeploy.LocalTargets{Meridian: []promdeploy.TargetGroup{{Targets: []string{"127.0.0.1:1"}, Labels: map[string]string{"pool": "a"}}}}, "pool label would be added"},
		{"empty group", promdeploy.LocalTargets{Meridian: []promdeploy.TargetGroup{{}}}, "no targets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := promdeploy.WriteLocal(t.TempDir(), tc.targets)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// scrapeConfigFile is the part of a Prometheus configuration these tests
// read, strictly: an unknown or misspelt key fails.
type scrapeConfigFile struct {
	Global        map[string]any `yaml:"global"`
	RuleFiles     []string       `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName             string            `yaml:"job_name"`
		HonorLabels         bool              `yaml:"honor_labels"`
		KubernetesSDConfigs []map[string]any  `yaml:"kubernetes_sd_configs"`
		FileSDConfigs       []map[string]any  `yaml:"file_sd_configs"`
		RelabelConfigs      []*relabel.Config `yaml:"relabel_configs"`
	} `yaml:"scrape_configs"`
}

func kubernetesJobs(t *testing.T) map[string][]*relabel.Config {
	t.Helper()
	data, err := promdeploy.Files.ReadFile(promdeploy.KubernetesConfig)
	if err != nil {
		t.Fatal(err)
	}
	var f scrapeConfigFile
	if err := yamlv2.UnmarshalStrict(data, &f); err != nil {
		t.Fatalf("%s: %v", promdeploy.KubernetesConfig, err)
	}
	for _, rf := range f.RuleFiles {
		if _, err := promdeploy.Files.ReadFile(rf); err != nil {
			t.Errorf("rule file %s: %v", rf, err)
		}
	}
	jobs := map[string][]*relabel.Config{}
	for _, sc := range f.ScrapeConfigs {
		if len(sc.KubernetesSDConfigs) != 1 || sc.KubernetesSDConfigs[0]["role"] != "pod" {
			t.Errorf("job %s: want one kubernetes_sd_config with role pod", sc.JobName)
		}
		for i, rc := range sc.RelabelConfigs {
			if err := rc.Validate(model.UTF8Validation); err != nil {
				t.Errorf("job %s: relabel_configs[%d]: %v", sc.JobName, i, err)
			}
		}
		jobs[sc.JobName] = sc.RelabelConfigs
		// Meridian's region/cluster/pool labels must survive target
		// labels of the same name; model servers have none of their own.
		if want := sc.JobName == promdeploy.JobMeridian; sc.HonorLabels != want {
			t.Errorf("job %s: honor_labels %v, want %v", sc.JobName, sc.HonorLabels, want)
		}
	}
	for _, job := range []string{promdeploy.JobModelServers, promdeploy.JobMeridian} {
		if _, ok := jobs[job]; !ok {
			t.Fatalf("no job %s", job)
		}
	}
	return jobs
}

// podTarget is the label set Prometheus's Kubernetes pod discovery gives
// one container port of a pod.
func podTarget(name, phase, port string, portNumber int, podLabels map[string]string) labels.Labels {
	m := map[string]string{
		model.AddressLabel:                            fmt.Sprintf("10.0.0.1:%d", portNumber),
		model.MetricsPathLabel:                        "/metrics",
		model.SchemeLabel:                             "http",
		"__meta_kubernetes_namespace":                 "inference",
		"__meta_kubernetes_pod_name":                  name,
		"__meta_kubernetes_pod_phase":                 phase,
		"__meta_kubernetes_pod_container_port_name":   port,
		"__meta_kubernetes_pod_container_port_number": fmt.Sprint(portNumber),
	}
	for k, v := range podLabels {
		m["__meta_kubernetes_pod_label_"+model.EscapeName(k, model.UnderscoreEscaping)] = v
		m["__meta_kubernetes_pod_labelpresent_"+model.EscapeName(k, model.UnderscoreEscaping)] = "true"
	}
	return labels.FromMap(m)
}

// relabelTarget applies a job's relabelling and returns the target's
// final labels (without the double-underscore ones), or nil if dropped.
func relabelTarget(cfgs []*relabel.Config, lset labels.Labels) map[string]string {
	lb := labels.NewBuilder(lset)
	if !relabel.ProcessBuilder(lb, cfgs...) {
		return nil
	}
	out := map[string]string{}
	lb.Labels().Range(func(l labels.Label) {
		if !strings.HasPrefix(l.Name, "__") || l.Name == model.MetricsPathLabel {
			out[l.Name] = l.Value
		}
	})
	return out
}

func TestKubernetesRelabelling(t *testing.T) {
	jobs := kubernetesJobs(t)
	vllm := map[string]string{"pool": "qwen-32b-agent", "app": "vllm"}
	meridian := map[string]string{"app.kubernetes.io/name": "meridian", "app.kubernetes.io/component": "tier1"}
	for _, tc := range []struct {
		name   string
		job    string
		target labels.Labels
		want   map[string]string // nil: dropped
	}{
		{"vLLM pod API port", promdeploy.JobModelServers, podTarget("qwen-0", "Running", "http", 8000, vllm),
			map[string]string{"pool": "qwen-32b-agent", "namespace": "inference", "pod": "qwen-0", model.MetricsPathLabel: "/metrics"}},
		{"vLLM pod other port", promdeploy.JobModelServers, podTarget("qwen-0", "Running", "grpc", 50051, vllm), nil},
		{"pending vLLM pod", promdeploy.JobModelServers, podTarget("qwen-1", "Pending", "http", 8000, vllm), nil},
		{"pod without pool", promdeploy.JobModelServers, podTarget("web-0", "Running", "http", 8080, map[string]string{"app": "web"}), nil},
		{"Meridian pod is not a model server", promdeploy.JobModelServers, podTarget("meridian-tier1-0", "Running", "metrics", 9090, meridian), nil},
		{"Meridian metrics port", promdeploy.JobMeridian, podTarget("meridian-tier1-0", "Running", "metrics", 9090, meridian),
			map[string]string{"tier": "tier1", "namespace": "inference", "pod": "meridian-tier1-0", model.MetricsPathLabel: "/metrics"}},
		{"Meridian proxy port", promdeploy.JobMeridian, podTarget("meridian-tier1-0", "Running", "http", 8000, meridian), nil},
		{"vLLM pod is not Meridian", promdeploy.JobMeridian, podTarget("qwen-0", "Running", "metrics", 8000, vllm), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := relabelTarget(jobs[tc.job], tc.target)
			if tc.want == nil {
				if got != nil {
					t.Fatalf("kept %v, want dropped", got)
				}
				return
			}
			if got == nil {
				t.Fatal("dropped")
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("label %s = %q, want %q (all: %v)", k, got[k], v, got)
				}
			}
			keys := make([]string, 0, len(got))
			for k := range got {
				keys = append(keys, k)
			}
			for _, k := range keys {
				if _, ok := tc.want[k]; !ok && !slices.Contains([]string{"instance", "job"}, k) {
					t.Errorf("unexpected label %s=%q", k, got[k])
				}
			}
		})
	}
}
