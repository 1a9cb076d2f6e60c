package deploytest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/prometheus/model/relabel"
	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/kube"
	promdeploy "github.com/meridian-router/meridian/deploy/prometheus"
)

const (
	chartDir    = repo + "/deploy/helm/meridian"
	examplesDir = repo + "/deploy/examples/helm"
	platformDir = repo + "/deploy/examples/platform"
	namespace   = "meridian"
)

// The flags `meridian tier1` and `meridian tier2` accept (issues 5 and 7,
// cmd/meridian; --prefix from the shared configuration-source flags). A rendered argument outside these
// fails the test.
var tierFlags = map[string][]string{
	"tier1": {"--config", "--etcd", "--source", "--prefix", "--cache", "--discovery", "--cluster", "--region", "--listen", "--extproc", "--health", "--metrics", "--peers"},
	"tier2": {"--config", "--etcd", "--source", "--prefix", "--cache", "--region", "--listen", "--gossip-bind", "--join", "--metrics",
		"--tls-cert", "--tls-key", "--redirect-http", "--redirect-port", "--jwt-issuer", "--jwks-url", "--jwt-audience",
		"--jwt-required-claim", "--jwt-tenant-claim", "--jwt-criticality-claim", "--gossip-key-file"},
}

// manifests is one rendering of the chart, decoded.
type manifests struct {
	deployments     []*appsv1.Deployment
	statefulSets    []*appsv1.StatefulSet
	services        []*corev1.Service
	configMaps      []*corev1.ConfigMap
	serviceAccounts []*corev1.ServiceAccount
	pdbs            []*policyv1.PodDisruptionBudget
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
	roles           []*rbacv1.Role
	roleBindings    []*rbacv1.RoleBinding
	serviceMonitors []*monitoringv1.ServiceMonitor
	podMonitors     []*monitoringv1.PodMonitor
	httpRoutes      []*gatewayv1.HTTPRoute
	networkPolicies []*networkingv1.NetworkPolicy
	prometheusRules []*monitoringv1.PrometheusRule
	inferencePools  []*config.InferencePool
	count           int
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	return c
}

// render renders the chart with vals the way `helm install -n meridian`
// would, strict about missing values.
func render(c *chart.Chart, vals map[string]any) (map[string]string, error) {
	opts := common.ReleaseOptions{Name: "meridian", Namespace: namespace, Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValuesWithSchemaValidation(c, vals, opts, common.DefaultCapabilities, false)
	if err != nil {
		return nil, err
	}
	return engine.Engine{Strict: true}.Render(c, rv)
}

// decodeStrict decodes a JSON document into v, failing on unknown fields.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// decode splits the rendered templates into documents and decodes each
// into its Kubernetes API type.
func decode(out map[string]string) (manifests, []error) {
	var m manifests
	var errs []error
	names := make([]string, 0, len(out))
	for name := range out {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue // NOTES.txt, helpers
		}
		for i, doc := range strings.Split(out[name], "\n---") {
			if strings.TrimSpace(stripYAMLComments(doc)) == "" {
				continue
			}
			where := fmt.Sprintf("%s document %d", name, i)
			js, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %v\n%s", where, err, doc))
				continue
			}
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(js, &head); err != nil {
				errs = append(errs, fmt.Errorf("%s: %v", where, err))
				continue
			}
			where = fmt.Sprintf("%s (%s %s/%s)", where, head.Metadata.Name, head.APIVersion, head.Kind)
			for _, msg := range validation.IsDNS1123Subdomain(head.Metadata.Name) {
				errs = append(errs, fmt.Errorf("%s: name: %s", where, msg))
			}
			var obj any
			switch head.APIVersion + "/" + head.Kind {
			case "apps/v1/Deployment":
				o := &appsv1.Deployment{}
				m.deployments, obj = append(m.deployments, o), o
			case "apps/v1/StatefulSet":
				o := &appsv1.StatefulSet{}
				m.statefulSets, obj = append(m.statefulSets, o), o
			case "v1/Service":
				o := &corev1.Service{}
				m.services, obj = append(m.services, o), o
			case "v1/ConfigMap":
				o := &corev1.ConfigMap{}
				m.configMaps, obj = append(m.configMaps, o), o
			case "v1/ServiceAccount":
				o := &corev1.ServiceAccount{}
				m.serviceAccounts, obj = append(m.serviceAccounts, o), o
			case "policy/v1/PodDisruptionBudget":
				o := &policyv1.PodDisruptionBudget{}
				m.pdbs, obj = append(m.pdbs, o), o
			case "autoscaling/v2/HorizontalPodAutoscaler":
				o := &autoscalingv2.HorizontalPodAutoscaler{}
				m.hpas, obj = append(m.hpas, o), o
			case "rbac.authorization.k8s.io/v1/Role":
				o := &rbacv1.Role{}
				m.roles, obj = append(m.roles, o), o
			case "rbac.authorization.k8s.io/v1/RoleBinding":
				o := &rbacv1.RoleBinding{}
				m.roleBindings, obj = append(m.roleBindings, o), o
			case "monitoring.coreos.com/v1/ServiceMonitor":
				o := &monitoringv1.ServiceMonitor{}
				m.serviceMonitors, obj = append(m.serviceMonitors, o), o
			case "monitoring.coreos.com/v1/PodMonitor":
				o := &monitoringv1.PodMonitor{}
				m.podMonitors, obj = append(m.podMonitors, o), o
			case "monitoring.coreos.com/v1/PrometheusRule":
				o := &monitoringv1.PrometheusRule{}
				m.prometheusRules, obj = append(m.prometheusRules, o), o
			case "networking.k8s.io/v1/NetworkPolicy":
				o := &networkingv1.NetworkPolicy{}
				m.networkPolicies, obj = append(m.networkPolicies, o), o
			case "gateway.networking.k8s.io/v1/HTTPRoute":
				o := &gatewayv1.HTTPRoute{}
				m.httpRoutes, obj = append(m.httpRoutes, o), o
			case "inference.networking.k8s.io/v1/InferencePool":
				// Meridian's own strict schema of GIE's InferencePool.
				docs, derrs := config.Decode(where, []byte(doc))
				if err := derrs.Err(); err != nil {
					errs = append(errs, fmt.Errorf("%s: %v", where, err))
					continue
				}
				for _, d := range docs {
					p, ok := d.Value.(*config.InferencePool)
					if !ok {
						errs = append(errs, fmt.Errorf("%s: decoded as %T", where, d.Value))
						continue
					}
					m.inferencePools = append(m.inferencePools, p)
				}
				m.count++
				continue
			default:
				errs = append(errs, fmt.Errorf("%s: no Kubernetes API type known for %s %s", where, head.APIVersion, head.Kind))
				continue
			}
			if err := decodeStrict(js, obj); err != nil {
				errs = append(errs, fmt.Errorf("%s: %v", where, err))
				continue
			}
			m.count++
		}
	}
	return m, errs
}

func stripYAMLComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func readValues(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := common.ReadValues(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return vals
}

// platformFiles is what `--set-file config.configMap.files.PATH=...` over
// the example platform passes: every file under it by relative path.
func platformFiles(t *testing.T) map[string]any {
	t.Helper()
	files := map[string]any{}
	err := filepath.WalkDir(platformDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(platformDir, p)
		files[filepath.ToSlash(rel)] = string(data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// renderings are the value sets the chart must render for: every
// per-Region values file, and the chart's defaults with the example
// platform's files in a chart-made ConfigMap.
func renderings(t *testing.T) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	paths, err := filepath.Glob(filepath.Join(examplesDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 2 {
		t.Fatalf("want a values file per Region in %s, found %d", examplesDir, len(paths))
	}
	for _, p := range paths {
		out[filepath.Base(p)] = readValues(t, p)
	}
	// The defaults leave one choice open: how the front door is encrypted.
	tls := map[string]any{"tls": map[string]any{"secretName": "meridian-tls"}}
	out["kubernetes source"] = map[string]any{
		"region":  "us-east-1",
		"cluster": "us-east-1a",
		"config":  map[string]any{"source": "kubernetes"},
		"tier2":   tls,
	}
	out["defaults with chart-made ConfigMap"] = map[string]any{
		"region":  "us-east-1",
		"cluster": "us-east-1a",
		"config":  map[string]any{"configMap": map[string]any{"files": platformFiles(t)}},
		"tier2":   tls,
	}
	return out
}

func TestChartRendersAndDecodes(t *testing.T) {
	c := loadChart(t)
	jobs := kubernetesJobs(t)
	for name, vals := range renderings(t) {
		t.Run(name, func(t *testing.T) {
			out, err := render(c, vals)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			m, errs := decode(out)
			for _, err := range errs {
				t.Error(err)
			}
			t.Logf("%d objects: %d Deployments, %d Services, %d HPAs, %d PDBs, %d ServiceMonitors, %d PodMonitors, %d InferencePools, %d HTTPRoutes, %d ConfigMaps",
				m.count, len(m.deployments), len(m.services), len(m.hpas), len(m.pdbs), len(m.serviceMonitors), len(m.podMonitors), len(m.inferencePools), len(m.httpRoutes), len(m.configMaps))
			if m.count < 10 {
				t.Errorf("only %d objects rendered", m.count)
			}
			checkRendering(t, vals, m, jobs)
		})
	}
}

// checkRendering checks the references between the rendered objects and
// against the values, beyond what decoding catches.
func checkRendering(t *testing.T, vals map[string]any, m manifests, jobs map[string][]*relabel.Config) {
	t.Helper()
	// StatefulSets are checked like Deployments: same pod template rules.
	kinds := map[string]string{}
	for _, d := range m.deployments {
		kinds[d.Name] = "Deployment"
	}
	for _, s := range m.statefulSets {
		kinds[s.Name] = "StatefulSet"
		if s.Spec.ServiceName == "" || findService(m.services, s.Spec.ServiceName) == nil || findService(m.services, s.Spec.ServiceName).Spec.ClusterIP != "None" {
			t.Errorf("StatefulSet %s: serviceName %q is not a rendered headless Service", s.Name, s.Spec.ServiceName)
		}
		checkPeers(t, s, m.hpas)
		m.deployments = append(m.deployments, &appsv1.Deployment{
			ObjectMeta: s.ObjectMeta,
			Spec:       appsv1.DeploymentSpec{Replicas: s.Spec.Replicas, Selector: s.Spec.Selector, Template: s.Spec.Template},
		})
	}
	tiers := map[string]*appsv1.Deployment{}
	for _, d := range m.deployments {
		tier := d.Spec.Template.Labels["app.kubernetes.io/component"]
		tiers[tier] = d
		checkDeployment(t, d, tier)
		checkMetricsRelabelling(t, d, jobs)
	}
	for _, tier := range []string{"tier1", "tier2"} {
		if tiers[tier] == nil {
			t.Errorf("no %s workload", tier)
		}
	}

	// Services select pods of a Deployment and name ports those pods have.
	for _, s := range m.services {
		d := selectDeployment(m.deployments, s.Spec.Selector)
		if d == nil {
			t.Errorf("Service %s selects no Deployment (%v)", s.Name, s.Spec.Selector)
			continue
		}
		for _, p := range s.Spec.Ports {
			if s.Spec.Type == corev1.ServiceTypeLoadBalancer && p.TargetPort.StrVal == "metrics" {
				t.Errorf("Service %s: a load balancer exposes the metrics port", s.Name)
			}
			if p.TargetPort.StrVal != "" && !hasPort(d, p.TargetPort.StrVal, p.Protocol) {
				t.Errorf("Service %s port %s: target %s/%s is not a port of %s", s.Name, p.Name, p.TargetPort.StrVal, p.Protocol, d.Name)
			}
		}
	}
	for _, pdb := range m.pdbs {
		if selectDeployment(m.deployments, pdb.Spec.Selector.MatchLabels) == nil {
			t.Errorf("PodDisruptionBudget %s selects no Deployment", pdb.Name)
		}
	}
	for _, h := range m.hpas {
		ref := h.Spec.ScaleTargetRef
		if (ref.Kind != "Deployment" && ref.Kind != "StatefulSet") || ref.APIVersion != "apps/v1" {
			t.Errorf("HPA %s scales %s %s", h.Name, ref.APIVersion, ref.Kind)
		}
		if h.Spec.MaxReplicas < 1 || (h.Spec.MinReplicas != nil && *h.Spec.MinReplicas > h.Spec.MaxReplicas) {
			t.Errorf("HPA %s: replicas %v..%d", h.Name, h.Spec.MinReplicas, h.Spec.MaxReplicas)
		}
		for _, metric := range h.Spec.Metrics {
			switch metric.Type {
			case autoscalingv2.ExternalMetricSourceType:
				// Model-server pools: scaled by queue depth or 429s.
				name := metric.External.Metric.Name
				if name != "meridian_pool_queue_depth" && name != "meridian_pool_429_rate" {
					t.Errorf("HPA %s: external metric %s is not one prometheus-adapter serves", h.Name, name)
				}
				if metric.External.Metric.Selector.MatchLabels["pool"] == "" {
					t.Errorf("HPA %s: external metric without a pool selector", h.Name)
				}
			case autoscalingv2.ResourceMetricSourceType:
				if kinds[ref.Name] != ref.Kind {
					t.Errorf("HPA %s scales %s %s, not rendered", h.Name, ref.Kind, ref.Name)
				}
			default:
				t.Errorf("HPA %s: metric type %s", h.Name, metric.Type)
			}
		}
	}
	// The example values file asks for external-metric HPAs per pool.
	if as, ok := vals["autoscaling"].(map[string]any); ok {
		pools, _ := as["pools"].([]any)
		external := 0
		for _, h := range m.hpas {
			for _, metric := range h.Spec.Metrics {
				if metric.Type == autoscalingv2.ExternalMetricSourceType {
					external++
				}
			}
		}
		if external != len(pools) {
			t.Errorf("%d pools to autoscale, %d external-metric HPAs", len(pools), external)
		}
	}

	// ServiceMonitors find a Service with a metrics port, and keep the
	// series' own labels (meridian_tier1_pod_queue_depth has an endpoint
	// label, which the Operator would otherwise rename).
	for _, sm := range m.serviceMonitors {
		for _, ep := range sm.Spec.Endpoints {
			if !ep.HonorLabels {
				t.Errorf("ServiceMonitor %s: honorLabels is off", sm.Name)
			}
		}
		found := false
		for _, s := range m.services {
			if !config.MatchLabels(sm.Spec.Selector.MatchLabels, s.Labels) {
				continue
			}
			for _, p := range s.Spec.Ports {
				if p.Name == sm.Spec.Endpoints[0].Port {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("ServiceMonitor %s finds no Service with port %s", sm.Name, sm.Spec.Endpoints[0].Port)
		}
	}

	// A chart-made ConfigMap holds every key the pods mount, and the files
	// as mounted are a valid Meridian configuration.
	cms := map[string]*corev1.ConfigMap{}
	for _, cm := range m.configMaps {
		cms[cm.Name] = cm
	}
	for _, d := range m.deployments {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.ConfigMap == nil {
				continue
			}
			cm := cms[v.ConfigMap.Name]
			if cm == nil {
				continue // an existing ConfigMap, made by kubectl
			}
			if len(v.ConfigMap.Items) != len(cm.Data) {
				t.Errorf("Deployment %s mounts %d of the %d keys of ConfigMap %s", d.Name, len(v.ConfigMap.Items), len(cm.Data), cm.Name)
			}
			dir := t.TempDir()
			for _, it := range v.ConfigMap.Items {
				content, ok := cm.Data[it.Key]
				if !ok {
					t.Errorf("Deployment %s mounts key %s, not in ConfigMap %s", d.Name, it.Key, cm.Name)
					continue
				}
				path := filepath.Join(dir, filepath.FromSlash(it.Path))
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := config.LoadDir(dir); err != nil {
				t.Errorf("Deployment %s: the mounted configuration is invalid: %v", d.Name, err)
			}
		}
	}

	// The PrometheusRule carries every rule of deploy/prometheus/rules.
	if len(m.prometheusRules) != 1 {
		t.Errorf("%d PrometheusRules, want 1", len(m.prometheusRules))
	} else {
		exprs, _ := ruleExpressions(t)
		n := 0
		for _, g := range m.prometheusRules[0].Spec.Groups {
			n += len(g.Rules)
		}
		if n != len(exprs) {
			t.Errorf("PrometheusRule has %d rules, deploy/prometheus/rules %d", n, len(exprs))
		}
	}

	// extproc wiring: each InferencePool names the Tier-1 Service and its
	// ext_proc port; each HTTPRoute backend is a rendered InferencePool.
	pools := map[string]bool{}
	configured := platformPools(t)
	for _, p := range m.inferencePools {
		pools[p.Metadata.Name] = true
		// The pool the Gateway reads is the pool Meridian is configured
		// with.
		if c, ok := configured[p.Metadata.Name]; ok {
			got, _ := json.Marshal(p.Spec)
			want, _ := json.Marshal(c.Spec)
			if !bytes.Equal(got, want) {
				t.Errorf("InferencePool %s differs from deploy/examples/platform:\n chart:  %s\n config: %s", p.Metadata.Name, got, want)
			}
		}
		ref := p.Spec.EndpointPickerRef
		if ref == nil || ref.Port == nil {
			t.Errorf("InferencePool %s: no endpointPickerRef port", p.Metadata.Name)
			continue
		}
		svc := findService(m.services, ref.Name)
		if svc == nil || !slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.Name == "extproc" && int(sp.Port) == ref.Port.Number }) {
			t.Errorf("InferencePool %s: picker %s:%d is not a rendered Service's extproc port", p.Metadata.Name, ref.Name, ref.Port.Number)
		}
	}
	// The route sends every /v1/ request, whatever its model, to a
	// rendered pool: the picker reads the model from the body.
	for _, r := range m.httpRoutes {
		for _, rule := range r.Spec.Rules {
			for _, b := range rule.BackendRefs {
				if string(b.Name) == "" || !pools[string(b.Name)] || b.Kind == nil || *b.Kind != "InferencePool" {
					t.Errorf("HTTPRoute %s: backend %v is not a rendered InferencePool", r.Name, b.Name)
				}
			}
			for _, match := range rule.Matches {
				if len(match.Headers) > 0 || match.Path == nil || *match.Path.Value != "/v1/" {
					t.Errorf("HTTPRoute %s: match %+v is narrower than every /v1/ request", r.Name, match)
				}
			}
		}
	}
	if vals["networkPolicy"] == nil || vals["networkPolicy"].(map[string]any)["enabled"] != false {
		if len(m.networkPolicies) != btoi(len(m.deployments) > 0)+btoi(len(m.statefulSets) > 0) {
			t.Errorf("%d NetworkPolicies for %d Deployments and %d StatefulSets", len(m.networkPolicies), len(m.deployments), len(m.statefulSets))
		}
	}
}

func checkDeployment(t *testing.T, d *appsv1.Deployment, tier string) {
	t.Helper()
	if !config.MatchLabels(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("Deployment %s: selector %v does not match its pods %v", d.Name, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	}
	if _, ok := d.Spec.Template.Labels["pool"]; ok {
		t.Errorf("Deployment %s: Meridian pods must not carry a pool label (it would overwrite their series' pool)", d.Name)
	}
	ps := d.Spec.Template.Spec
	if sc := ps.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("Deployment %s: must run as non-root", d.Name)
	}
	if len(ps.Containers) != 1 {
		t.Fatalf("Deployment %s: %d containers", d.Name, len(ps.Containers))
	}
	ctr := ps.Containers[0]
	if len(ctr.Args) == 0 || ctr.Args[0] != tier {
		t.Errorf("Deployment %s: args %v do not start with the %s subcommand", d.Name, ctr.Args, tier)
	}
	allowed := tierFlags[tier]
	seen := map[string]bool{}
	for _, a := range ctr.Args[1:] {
		flag, _, _ := strings.Cut(a, "=")
		if !slices.Contains(allowed, flag) {
			t.Errorf("Deployment %s: %s is not a flag of meridian %s", d.Name, a, tier)
		}
		if seen[flag] {
			t.Errorf("Deployment %s: %s given twice", d.Name, flag)
		}
		seen[flag] = true
	}
	if seen["--etcd"] && !seen["--cache"] {
		t.Errorf("Deployment %s: etcd source without --cache: the default cache directory is not writable (read-only root file system)", d.Name)
	}
	if n := btoi(seen["--config"]) + btoi(seen["--etcd"]) + btoi(seen["--source"]); n != 1 {
		t.Errorf("Deployment %s: exactly one of --config, --etcd and --source, got %v", d.Name, ctr.Args)
	}
	for _, must := range map[string][]string{"tier1": {"--cluster", "--health", "--metrics"}, "tier2": {"--region", "--listen", "--gossip-bind", "--join", "--metrics"}}[tier] {
		if !seen[must] {
			t.Errorf("Deployment %s: no %s", d.Name, must)
		}
	}
	if tier == "tier1" && seen["--listen"] == seen["--extproc"] {
		t.Errorf("Deployment %s: exactly one of --listen (proxy) and --extproc, got %v", d.Name, ctr.Args)
	}
	if ctr.Resources.Requests.Cpu().IsZero() || ctr.Resources.Requests.Memory().IsZero() {
		t.Errorf("Deployment %s: no resource requests", d.Name)
	}
	for _, probe := range []struct {
		name string
		p    *corev1.Probe
	}{{"liveness", ctr.LivenessProbe}, {"readiness", ctr.ReadinessProbe}} {
		if probe.p == nil {
			t.Errorf("Deployment %s: no %s probe", d.Name, probe.name)
			continue
		}
		switch {
		case probe.p.HTTPGet != nil:
			want := map[string]string{"liveness": "/healthz", "readiness": "/readyz"}[probe.name]
			if probe.p.HTTPGet.Path != want {
				t.Errorf("Deployment %s: %s probe on %s, want %s", d.Name, probe.name, probe.p.HTTPGet.Path, want)
			}
			if !hasPort(d, probe.p.HTTPGet.Port.StrVal, corev1.ProtocolTCP) {
				t.Errorf("Deployment %s: %s probe port %s is not a container port", d.Name, probe.name, probe.p.HTTPGet.Port.StrVal)
			}
		case probe.p.GRPC != nil:
			// ext_proc mode: gRPC health on the picker's port.
			if !seen["--extproc"] || probe.p.GRPC.Service == nil || *probe.p.GRPC.Service != probe.name {
				t.Errorf("Deployment %s: gRPC %s probe %+v", d.Name, probe.name, probe.p.GRPC)
			}
		default:
			t.Errorf("Deployment %s: %s probe is neither HTTP nor gRPC", d.Name, probe.name)
		}
	}
	// Every flag that names a listening address matches a container port.
	for _, a := range ctr.Args[1:] {
		flag, addr, _ := strings.Cut(a, "=")
		if !slices.Contains([]string{"--listen", "--extproc", "--health", "--metrics", "--gossip-bind"}, flag) {
			continue
		}
		_, port, ok := strings.Cut(addr, ":")
		if !ok || !slices.ContainsFunc(ctr.Ports, func(p corev1.ContainerPort) bool { return fmt.Sprint(p.ContainerPort) == port }) {
			t.Errorf("Deployment %s: %s listens on %q, not a container port", d.Name, flag, addr)
		}
	}
}

// checkMetricsRelabelling runs the Kubernetes scrape configuration over
// the Deployment's pod, one target per container port, as Prometheus's
// pod discovery would: the meridian job keeps exactly the metrics port,
// and the model-servers job keeps none.
func checkMetricsRelabelling(t *testing.T, d *appsv1.Deployment, jobs map[string][]*relabel.Config) {
	t.Helper()
	kept := 0
	for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
		target := podTarget(d.Name+"-0", "Running", p.Name, int(p.ContainerPort), d.Spec.Template.Labels)
		if got := relabelTarget(jobs[promdeploy.JobModelServers], target); got != nil {
			t.Errorf("Deployment %s port %s: scraped as a model server", d.Name, p.Name)
		}
		if got := relabelTarget(jobs[promdeploy.JobMeridian], target); got != nil {
			kept++
			if p.Name != "metrics" {
				t.Errorf("Deployment %s: port %s scraped by the meridian job", d.Name, p.Name)
			}
		}
	}
	if kept != 1 {
		t.Errorf("Deployment %s: the meridian job scrapes %d ports, want 1", d.Name, kept)
	}
}

func selectDeployment(ds []*appsv1.Deployment, selector map[string]string) *appsv1.Deployment {
	for _, d := range ds {
		if config.MatchLabels(selector, d.Spec.Template.Labels) {
			return d
		}
	}
	return nil
}

func findService(ss []*corev1.Service, name string) *corev1.Service {
	for _, s := range ss {
		if s.Name == name {
			return s
		}
	}
	return nil
}

func hasPort(d *appsv1.Deployment, name string, proto corev1.Protocol) bool {
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name && (proto == "" || p.Protocol == proto) {
				return true
			}
		}
	}
	return false
}

// TestChartRejectsBadValues shows mistakes in a values file fail at
// render time, with a message that names them.
func TestChartRejectsBadValues(t *testing.T) {
	c := loadChart(t)
	base := func() map[string]any {
		return readValues(t, filepath.Join(examplesDir, "values-us-east-1.yaml"))
	}
	for _, tc := range []struct {
		name string
		edit func(v map[string]any)
		want string
	}{
		{"misspelt key", func(v map[string]any) { v["tier1"].(map[string]any)["replcas"] = 3 }, "replcas"},
		{"unknown tier1 mode", func(v map[string]any) { v["tier1"].(map[string]any)["mode"] = "envoy" }, "mode"},
		{"no cluster", func(v map[string]any) { v["cluster"] = "" }, "cluster is required"},
		{"etcd without endpoints", func(v map[string]any) { v["config"] = map[string]any{"source": "etcd"} }, "config.etcd.endpoints is required"},
		{"chart-made ConfigMap without files", func(v map[string]any) {
			v["config"] = map[string]any{"source": "configMap", "configMap": map[string]any{"name": "", "items": []any{}}}
		}, "config.configMap.files is empty"},
		{"autoscaling on GPU use", func(v map[string]any) {
			v["autoscaling"].(map[string]any)["pools"].([]any)[0].(map[string]any)["metric"] = "gpuUtilization"
		}, "metric"},
		{"port out of range", func(v map[string]any) { v["tier2"].(map[string]any)["ports"] = map[string]any{"http": 80800} }, "http"},
		{"front door without a TLS choice", func(v map[string]any) { v["tier2"].(map[string]any)["tls"] = map[string]any{"secretName": ""} }, "tier2.tls: set secretName or acmCertificateArn"},
		{"TLS twice", func(v map[string]any) {
			v["tier2"].(map[string]any)["tls"].(map[string]any)["acmCertificateArn"] = "arn:x"
		}, "not both"},
		{"issuer without keys", func(v map[string]any) {
			v["tier2"].(map[string]any)["auth"] = map[string]any{"issuer": "https://idp.example/", "jwksURL": ""}
		}, "tier2.auth.issuer needs tier2.auth.jwksURL"},
		{"route to an unknown pool", func(v map[string]any) {
			v["tier1"] = map[string]any{"mode": "extproc", "extproc": map[string]any{
				"inferencePools": []any{map[string]any{"name": "all", "selector": map[string]any{"a": "b"}, "targetPorts": []any{8000}}},
				"httpRoute":      map[string]any{"enabled": true, "pool": "other"}}}
		}, `tier1.extproc.httpRoute.pool "other"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := base()
			tc.edit(v)
			_, err := render(c, v)
			if err == nil {
				t.Fatal("rendered")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

// TestChartTemplateTypoFailsDecoding misspells a field in a template and
// expects the strict decoding to say which.
func TestChartTemplateTypoFailsDecoding(t *testing.T) {
	for _, tc := range []struct{ template, from, to string }{
		{"templates/tier1.yaml", "name: health, containerPort:", "name: health, containerPrt:"},
		{"templates/tier2.yaml", "publishNotReadyAddresses:", "publishNotReadyAddress:"},
		{"templates/autoscaling.yaml", "averageValue:", "averageValu:"},
		{"templates/monitoring.yaml", "podMetricsEndpoints:", "podMetricEndpoints:"},
		{"templates/extproc.yaml", "endpointPickerRef:", "endpointPicker:"},
		{"templates/extproc.yaml", "backendRefs:", "backendRef:"},
	} {
		t.Run(tc.template+" "+tc.to, func(t *testing.T) {
			c := loadChart(t)
			found := false
			for _, tpl := range c.Templates {
				if tpl.Name == tc.template && bytes.Contains(tpl.Data, []byte(tc.from)) {
					tpl.Data = bytes.Replace(tpl.Data, []byte(tc.from), []byte(tc.to), 1)
					found = true
				}
			}
			if !found {
				t.Fatalf("%s has no %q; update this test", tc.template, tc.from)
			}
			out, err := render(c, readValues(t, filepath.Join(examplesDir, "values-eu-west-1.yaml")))
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			_, errs := decode(out)
			if len(errs) == 0 {
				t.Fatal("decoded without error")
			}
			field := strings.TrimSuffix(tc.to[strings.LastIndex(tc.to, " ")+1:], ":")
			if !strings.Contains(errors.Join(errs...).Error(), field) {
				t.Fatalf("errors do not name %s: %v", field, errs)
			}
		})
	}
}

// TestChartRulesAreTheShippedRules keeps the chart's copies of the rule
// files identical to deploy/prometheus/rules (Helm can only read files
// inside the chart).
func TestChartRulesAreTheShippedRules(t *testing.T) {
	for _, name := range []string{"recording.yml", "alerts.yml"} {
		want, err := os.ReadFile(filepath.Join(repo, "deploy/prometheus/rules", name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(chartDir, "files", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("deploy/helm/meridian/files/%s differs from deploy/prometheus/rules/%s: cp deploy/prometheus/rules/%s deploy/helm/meridian/files/", name, name, name)
		}
	}
}

// platformPools returns the example platform's InferencePools by name.
func platformPools(t *testing.T) map[string]*config.InferencePool {
	t.Helper()
	snap, err := config.LoadDir(platformDir)
	if err != nil {
		t.Fatal(err)
	}
	return snap.Pools
}

// checkPeers checks Tier-1's --peers names every replica the StatefulSet
// can have, by its stable DNS name, on the health port.
func checkPeers(t *testing.T, s *appsv1.StatefulSet, hpas []*autoscalingv2.HorizontalPodAutoscaler) {
	t.Helper()
	want := 0
	if s.Spec.Replicas != nil {
		want = int(*s.Spec.Replicas)
	}
	for _, h := range hpas {
		if h.Spec.ScaleTargetRef.Kind == "StatefulSet" && h.Spec.ScaleTargetRef.Name == s.Name {
			want = int(h.Spec.MaxReplicas)
		}
	}
	ctr := s.Spec.Template.Spec.Containers[0]
	var peers []string
	for _, a := range ctr.Args {
		if v, ok := strings.CutPrefix(a, "--peers="); ok {
			peers = strings.Split(v, ",")
		}
	}
	var health int32
	for _, p := range ctr.Ports {
		if p.Name == "health" {
			health = p.ContainerPort
		}
	}
	if len(peers) != want {
		t.Errorf("StatefulSet %s: %d peers for up to %d replicas: %v", s.Name, len(peers), want, peers)
	}
	for i, p := range peers {
		name := fmt.Sprintf("%s-%d.%s.%s.svc.cluster.local:%d", s.Name, i, s.Spec.ServiceName, namespace, health)
		if p != name {
			t.Errorf("StatefulSet %s: peer %d is %s, want %s", s.Name, i, p, name)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// With config.source=kubernetes the chart's service account may do
// exactly what Tier-1 and Tier-2 need on the Kubernetes source
// (kube.RunnerRules: what the source reads, and what Tier-2's canary
// analysis writes), nothing more. TestChartServiceAccountRBAC
// (cmd/meridian) runs them on these rights alone.
func TestChartKubernetesSourceRBAC(t *testing.T) {
	out, err := render(loadChart(t), map[string]any{"region": "us-east-1", "cluster": "us-east-1a", "config": map[string]any{"source": "kubernetes"},
		"tier2": map[string]any{"tls": map[string]any{"plainHTTP": true}}})
	if err != nil {
		t.Fatal(err)
	}
	m, errs := decode(out)
	for _, err := range errs {
		t.Fatal(err)
	}
	var role *rbacv1.Role
	for _, r := range m.roles {
		if r.Name == "meridian-config" {
			role = r
		}
	}
	if role == nil {
		t.Fatal("no Role meridian-config")
	}
	bound := false
	for _, b := range m.roleBindings {
		bound = bound || b.RoleRef.Name == role.Name
	}
	if !bound {
		t.Error("Role meridian-config is not bound")
	}
	grants := func(rules []rbacv1.PolicyRule) map[string]bool {
		out := map[string]bool{}
		for _, r := range rules {
			if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
				t.Errorf("rule %+v: resource names and URLs are not expected", r)
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						out[v+" "+res+"."+g] = true
					}
				}
			}
		}
		return out
	}
	allowed, need := grants(role.Rules), grants(kube.RunnerRules())
	for g := range need {
		if !allowed[g] {
			t.Errorf("Role meridian-config does not allow %s", g)
		}
	}
	for g := range allowed {
		if !need[g] {
			t.Errorf("Role meridian-config allows %s, which Meridian does not need", g)
		}
	}
}
