package kube_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/kube"
	"github.com/meridian-router/meridian/internal/kubetest"
	"github.com/meridian-router/meridian/internal/testkit"
)

const (
	ns       = "meridian"
	reader   = "meridian-reader"
	operator = "operator"
	example  = "../../deploy/examples/platform"
)

// env is a real API server with Meridian's definitions installed, the
// namespace ns, a reader with ReaderRules and an operator with
// WriterRules.
type env struct {
	*kubetest.Server
	reader, operator kube.Clients
}

func startEnv(t *testing.T) *env {
	t.Helper()
	s := kubetest.Start(t, kubetest.Options{Users: []string{reader, operator}})
	s.InstallCRDs(kube.CRDDocuments())
	s.Namespace(ns)
	s.GrantRules("meridian-reader", ns, reader, kube.ReaderRules())
	s.GrantRules("meridian-operator", ns, operator, kube.WriterRules())
	e := &env{Server: s}
	var err error
	if e.reader, err = kube.NewClients(s.Config(reader)); err != nil {
		t.Fatal(err)
	}
	if e.operator, err = kube.NewClients(s.Config(operator)); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) store() *kube.Store {
	return &kube.Store{Dynamic: e.operator.Dynamic, Client: e.operator.Client, Namespace: ns}
}

// apply writes docs through the Store, as `meridian config apply` does.
func (e *env) apply(t *testing.T, docs []config.Document) {
	t.Helper()
	ctx := context.Background()
	p, err := e.store().PlanApply(ctx, docs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store().Commit(ctx, p); err != nil {
		t.Fatal(err)
	}
}

func exampleDocs(t *testing.T) []config.Document {
	t.Helper()
	docs, _, err := config.ReadDir(example)
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

// reloads records a Source's OnReload outcomes.
type reloads struct {
	mu   sync.Mutex
	errs []error
}

func (r *reloads) add(_ int64, err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
}

func (r *reloads) refused() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.errs {
		if e != nil {
			n++
		}
	}
	return n
}

func (e *env) source(t *testing.T, r *reloads) *kube.Source {
	t.Helper()
	src := &kube.Source{Dynamic: e.reader.Dynamic, Client: e.reader.Client, Namespace: ns,
		Logger: slog.New(slog.DiscardHandler)}
	if r != nil {
		src.OnReload = r.add
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := src.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); src.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return src
}

// The definitions `meridian config crds` prints are accepted by a real
// API server, and the example platform stored as cluster objects reads
// back as the same configuration as its files.
func TestKubernetesSourceReadsTheExamplePlatform(t *testing.T) {
	e := startEnv(t)
	docs := exampleDocs(t)
	e.apply(t, docs)

	want, err := config.LoadDir(example)
	if err != nil {
		t.Fatal(err)
	}
	src := e.source(t, nil)
	got := src.Snapshot()
	if len(got.Objects) != len(want.Objects) {
		t.Fatalf("%d objects from the cluster, %d from the files", len(got.Objects), len(want.Objects))
	}
	for k, o := range want.Objects {
		g, ok := got.Objects[k]
		if !ok {
			t.Errorf("%s: missing from the cluster's configuration", k)
			continue
		}
		if string(g.JSON) != string(o.JSON) {
			t.Errorf("%s differs:\ncluster %s\nfiles   %s", k, g.JSON, o.JSON)
		}
	}
	if got.Adapters["claims-triage-auto"] == "" {
		t.Errorf("the BBR ConfigMap's adapters were not read: %v", got.Adapters)
	}
	// Applying the same files again changes nothing.
	p, err := e.store().PlanApply(context.Background(), docs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Changes) != 0 {
		t.Errorf("re-applying the same files plans changes:\n%s", p.Describe())
	}
}

// Objects the API server's schema refuses (OpenAPI types, enums, ranges,
// and the CEL rules) never reach Meridian: the refusal names the object
// and the field.
func TestKubernetesCRDSchemaRefusesInvalidObjects(t *testing.T) {
	e := startEnv(t)
	e.apply(t, exampleDocs(t))
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"enum", `apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: bad-band}
spec: {maxBand: Urgent}`, []string{`Tenant.meridian.dev "bad-band" is invalid`, "spec.maxBand", `supported values: "Critical", "Standard", "Sheddable"`}},
		{"range", `apiVersion: meridian.dev/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: bad-port}
spec:
  schedulers: [{name: s, modelName: m, modelSelector: {matchLabels: {pool: p}}, targetPort: 70000}]`,
			[]string{`InferenceGatewayConfig.meridian.dev "bad-port" is invalid`, "spec.schedulers[0].targetPort", "less than or equal to 65535"}},
		{"type", `apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: bad-weight}
spec: {weight: heavy}`, []string{`Tenant.meridian.dev "bad-weight" is invalid`, "spec.weight", "must be of type number"}},
		{"CEL: weights or configMapRef", `apiVersion: inference.sagemaker.aws.amazon.com/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: both}
spec:
  schedulers:
  - {name: s, modelName: m, modelSelector: {matchLabels: {pool: p}}, weights: {queue: 1}, configMapRef: {name: epp}}`,
			[]string{`InferenceGatewayConfig.inference.sagemaker.aws.amazon.com "both" is invalid`, "spec.schedulers[0]", "set either weights or configMapRef, not both"}},
		{"CEL: body-based routing", `apiVersion: meridian.dev/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: two}
spec:
  schedulers:
  - {name: a, modelName: a, modelSelector: {matchLabels: {pool: a}}}
  - {name: b, modelName: b, modelSelector: {matchLabels: {pool: b}}}`,
			[]string{`InferenceGatewayConfig.meridian.dev "two" is invalid`, "spec", "body-based routing (bbr.enabled) must be on with more than one scheduler"}},
		{"rewrite weight", `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {name: heavy}
spec:
  rules: [{targets: [{modelRewrite: x, weight: 2000000}]}]`,
			[]string{`InferenceModelRewrite.inference.networking.x-k8s.io "heavy" is invalid`, "spec.rules[0].targets[0].weight", "less than or equal to 1000000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var u unstructured.Unstructured
			if err := yaml.Unmarshal([]byte(tc.yaml), &u.Object); err != nil {
				t.Fatal(err)
			}
			gv, _ := schema.ParseGroupVersion(u.GetAPIVersion())
			r := resourceOf(t, gv, u.GetKind())
			_, err := e.operator.Dynamic.Resource(r).Namespace(ns).Create(context.Background(), &u, metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create: %v, want 422 Invalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the refusal does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

func resourceOf(t *testing.T, gv schema.GroupVersion, kind string) schema.GroupVersionResource {
	t.Helper()
	for _, r := range kube.Resources {
		if r.GroupVersion() == gv && r.Kind == kind {
			return r.GroupVersionResource
		}
	}
	t.Fatalf("no resource for %s %s", gv, kind)
	return schema.GroupVersionResource{}
}

// An object that passes the API server's schema but not Meridian's
// validation (here: a scheduler whose weights are all zero) is refused by
// the source: the configuration in force keeps serving, the refusal is
// counted (OnReload) and recorded as a Warning Event on the object naming
// the field; fixing the object applies it.
func TestKubernetesSourceRefusesWhatMeridianRejects(t *testing.T) {
	e := startEnv(t)
	e.apply(t, exampleDocs(t))
	var r reloads
	src := e.source(t, &r)
	updates := src.Subscribe()
	before := src.Snapshot()

	gw := kube.Resources[1].GroupVersionResource // HyperPod's InferenceGatewayConfig
	res := e.operator.Dynamic.Resource(gw).Namespace(ns)
	edit := func(weights map[string]any) {
		t.Helper()
		u, err := res.Get(context.Background(), "us-east-1a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		scheds, _, _ := unstructured.NestedSlice(u.Object, "spec", "schedulers")
		s0 := scheds[0].(map[string]any)
		delete(s0, "configMapRef")
		s0["weights"] = weights
		if err := unstructured.SetNestedSlice(u.Object, scheds, "spec", "schedulers"); err != nil {
			t.Fatal(err)
		}
		if _, err := res.Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("the API server refused an object its schema allows: %v", err)
		}
	}
	edit(map[string]any{"queue": int64(0)})

	testkit.Eventually(t, "the refusal counted", func() bool { return r.refused() > 0 })
	err := src.LastError()
	for _, w := range []string{"meridian/inferencegatewayconfigs.inference.sagemaker.aws.amazon.com/us-east-1a", "InferenceGatewayConfig/us-east-1a", "spec.schedulers[0].weights", "at least one weight must be positive"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("the refusal does not name %q: %v", w, err)
		}
	}
	if src.Snapshot() != before {
		t.Fatal("a refused configuration was put in force")
	}
	var event corev1.Event
	testkit.Eventually(t, "a Warning Event on the gateway", func() bool {
		l, err := e.Client(kubetest.Admin).CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, ev := range l.Items {
			if ev.InvolvedObject.Name == "us-east-1a" && ev.Reason == "Invalid" {
				event = ev
				return true
			}
		}
		return false
	})
	if event.Type != corev1.EventTypeWarning || event.InvolvedObject.Kind != config.KindGateway ||
		!strings.Contains(event.Message, "spec.schedulers[0].weights: at least one weight must be positive") {
		t.Errorf("event: %s %s %s: %s", event.Type, event.InvolvedObject.Kind, event.Reason, event.Message)
	}

	edit(map[string]any{"queue": int64(5), "prefix": int64(1)})
	var after *config.Snapshot
	testkit.Eventually(t, "the fixed gateway in force", func() bool {
		select {
		case after = <-updates:
		default:
		}
		return after != nil
	})
	pol, ok := after.Policy("us-east-1a", after.Gateway("us-east-1a").Spec.Schedulers[0].Name)
	if !ok || pol.Weights.Queue != 5 || pol.Weights.Prefix != 1 {
		t.Errorf("weights in force after the fix: %+v", pol.Weights)
	}
	if err := src.LastError(); err != nil {
		t.Errorf("LastError after the fix: %v", err)
	}
}

// Two operators plan against the same state: the first commit wins, the
// second is refused with config.ErrConflict and writes nothing, even when
// it changes another object; re-planned, it applies.
func TestKubernetesStoreConflicts(t *testing.T) {
	e := startEnv(t)
	e.apply(t, exampleDocs(t))
	ctx := context.Background()
	tenant := func(name, limit string) []config.Document {
		docs, errs := config.Decode("t.yaml", []byte(`apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: `+name+`}
spec: {limits: {requests: {limit: `+limit+`, per: 1m}}}`))
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		return docs
	}
	s := e.store()
	a, err := s.PlanApply(ctx, tenant("team-a", "10"), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.PlanApply(ctx, tenant("team-b", "20"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, b); !errors.Is(err, config.ErrConflict) {
		t.Fatalf("second commit: %v, want ErrConflict", err)
	}
	snap, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Tenant("team-b") != nil {
		t.Fatal("the refused commit wrote team-b")
	}
	if r := snap.Tenant("team-a").Spec.Limits.Requests; r == nil || r.Limit != 10 {
		t.Fatalf("team-a after the first commit: %+v", r)
	}
	b, err = s.PlanApply(ctx, tenant("team-b", "20"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, b); err != nil {
		t.Fatalf("re-planned commit: %v", err)
	}
}

// An object the API server's schema lets through but Meridian cannot
// decode (a duration that is no duration) makes Load fail naming it, and
// an apply that replaces it goes through.
func TestKubernetesStoreReplacesAnUndecodableObject(t *testing.T) {
	e := startEnv(t)
	e.apply(t, exampleDocs(t))
	ctx := context.Background()
	tenants := e.operator.Dynamic.Resource(resourceOf(t, schema.GroupVersion{Group: kube.GroupMeridian, Version: "v1alpha1"}, config.KindTenant)).Namespace(ns)
	u, err := tenants.Get(ctx, "batch-jobs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedMap(u.Object, map[string]any{"limit": int64(5), "per": "soon"}, "spec", "limits", "requests"); err != nil {
		t.Fatal(err)
	}
	if _, err := tenants.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("the API server refused a string where its schema wants one: %v", err)
	}
	_, err = e.store().Load(ctx)
	if err == nil || !strings.Contains(err.Error(), `meridian/tenants.meridian.dev/batch-jobs: Tenant/batch-jobs: spec.limits.requests.per: invalid duration "soon"`) {
		t.Fatalf("Load: %v, want the undecodable tenant named", err)
	}
	docs, errs := config.Decode("fix.yaml", []byte("apiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: batch-jobs}\nspec: {limits: {requests: {limit: 5, per: 1m}}}\n"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	e.apply(t, docs)
	snap, err := e.store().Load(ctx)
	if err != nil {
		t.Fatalf("Load after the fix: %v", err)
	}
	if r := snap.Tenant("batch-jobs").Spec.Limits.Requests; r == nil || r.Per.D() != time.Minute {
		t.Fatalf("batch-jobs after the fix: %+v", r)
	}
}
