package deploytest

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/meridian-router/meridian/internal/kubetest"
	"github.com/meridian-router/meridian/internal/kubetest/helminstall"
)

// upstreamCRDs are the definitions the chart's objects need besides its
// own crds/: Prometheus Operator's ServiceMonitor, PodMonitor and
// PrometheusRule (generated from the module's Go types, as the project
// does) and Gateway API's HTTPRoute (the module's YAML).
func upstreamCRDs(t *testing.T) [][]byte {
	t.Helper()
	docs, err := helminstall.GeneratedCRDs("github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1",
		"ServiceMonitor", "PodMonitor", "PrometheusRule")
	if err != nil {
		t.Fatal(err)
	}
	route, err := helminstall.ModuleFile("sigs.k8s.io/gateway-api", "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return append(docs, route)
}

// The chart installs with Helm into a real API server for each Region's
// values and for the Kubernetes configuration source: every object it
// renders is accepted by the server's validation (server-side apply) and
// is there afterwards.
func TestChartInstallsOnAPIServer(t *testing.T) {
	s := kubetest.Start(t, kubetest.Options{})
	s.InstallCRDs(upstreamCRDs(t))
	cfg := s.Config(kubetest.Admin)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	us := readValues(t, filepath.Join(examplesDir, "values-us-east-1.yaml"))
	kubeSource := readValues(t, filepath.Join(examplesDir, "values-us-east-1.yaml"))
	kubeSource["config"] = map[string]any{"source": "kubernetes"}
	for _, tc := range []struct {
		name string
		vals map[string]any
	}{
		{"us-east-1", us},
		{"eu-west-1", readValues(t, filepath.Join(examplesDir, "values-eu-west-1.yaml"))},
		{"kubernetes-source", kubeSource},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := "meridian-" + tc.name
			s.Namespace(ns)
			manifest, err := helminstall.Install(s.Kubeconfig(kubetest.Admin, ns), chartDir, ns, "meridian", tc.vals)
			if err != nil {
				t.Fatal(err)
			}
			// CRDs installed by the first release are new to the mapper.
			mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
			n := 0
			for _, doc := range strings.Split(manifest, "\n---") {
				var u unstructured.Unstructured
				if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
					t.Fatalf("manifest: %v", err)
				}
				if u.Object == nil {
					continue
				}
				gvk := u.GroupVersionKind()
				m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if err != nil {
					t.Fatalf("%s %s: %v", gvk, u.GetName(), err)
				}
				if _, err := dyn.Resource(m.Resource).Namespace(ns).Get(context.Background(), u.GetName(), metav1.GetOptions{}); err != nil {
					t.Errorf("%s %s after the install: %v", gvk.Kind, u.GetName(), err)
				}
				n++
			}
			if n < 15 {
				t.Errorf("only %d objects installed", n)
			}
			t.Logf("%d objects installed in %s", n, ns)
		})
	}
}
