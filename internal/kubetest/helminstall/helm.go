// Package helminstall installs a Helm chart with the Helm SDK, as `helm
// install` does, and generates the upstream CustomResourceDefinitions a
// chart's objects need, for tests against internal/kubetest's API server.
// It is apart from kubetest so that only the tests that install charts
// link Helm's install machinery and controller-tools.
package helminstall

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// Timeout bounds one Helm install on a loaded machine.
const Timeout = 3 * time.Minute

// Install installs the chart in directory chartDir into namespace as
// release with vals, through kubeconfig, as `helm install --namespace
// namespace` does it:
// the chart's crds/ first, then every object by server-side apply, which
// the API server validates strictly. It does not wait
// for workloads to become ready (nothing here runs pods). It returns the
// release's rendered manifest.
func Install(kubeconfig, chartDir, namespace, release string, vals map[string]any) (string, error) {
	kc := kubeconfig
	getter := genericclioptions.NewConfigFlags(false)
	getter.KubeConfig, getter.Namespace = &kc, &namespace
	cfg := action.NewConfiguration()
	cfg.SetLogger(slog.New(slog.NewTextHandler(io.Discard, nil)).Handler())
	if err := cfg.Init(getter, namespace, "secret"); err != nil {
		return "", fmt.Errorf("helm: %w", err)
	}
	ch, err := loader.Load(chartDir)
	if err != nil {
		return "", fmt.Errorf("helm: load %s: %w", chartDir, err)
	}
	in := action.NewInstall(cfg)
	in.Namespace, in.ReleaseName = namespace, release
	in.WaitStrategy = kube.HookOnlyStrategy
	in.Timeout = Timeout
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	r, err := in.RunWithContext(ctx, ch, vals)
	if err != nil {
		return "", fmt.Errorf("helm install %s: %w", release, err)
	}
	rel, ok := r.(*releasev1.Release)
	if !ok {
		return "", fmt.Errorf("helm install %s: a %T, not a v1 release", release, r)
	}
	return rel.Manifest, nil
}
