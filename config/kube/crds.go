package kube

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"slices"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

//go:embed crds
var crdFiles embed.FS

// CRDDocuments is every CustomResourceDefinition the source reads, one
// YAML document each, sorted by file name: Meridian's kinds, the
// HyperPod-style InferenceGatewayConfig, Meridian's InferenceModelRewrite
// and InferenceObjective, and GIE's InferencePool.
func CRDDocuments() [][]byte {
	names, err := fs.Glob(crdFiles, "crds/*.yaml")
	if err != nil {
		panic(err) // a constant pattern
	}
	slices.Sort(names)
	out := make([][]byte, len(names))
	for i, n := range names {
		out[i], _ = crdFiles.ReadFile(n)
	}
	return out
}

// PartOfLabel marks Meridian's own definitions.
const PartOfLabel = "app.kubernetes.io/part-of"

// NotInstalledByOthers returns the definitions of docs that the cluster
// does not already have from another owner (one without PartOfLabel
// meridian, as llm-d installs its InferenceObjective), and the names of
// those it left out: applying Meridian's over them would replace their
// schema.
func NotInstalledByOthers(ctx context.Context, dyn dynamic.Interface, docs [][]byte) (keep [][]byte, foreign []string, err error) {
	crds := dyn.Resource(apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions"))
	for _, d := range docs {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal(d, &u.Object); err != nil {
			return nil, nil, err
		}
		cur, err := crds.Get(ctx, u.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, nil, fmt.Errorf("config: kubernetes: read CRD %s: %w", u.GetName(), err)
		case cur.GetLabels()[PartOfLabel] != "meridian":
			foreign = append(foreign, u.GetName())
			continue
		}
		keep = append(keep, d)
	}
	return keep, foreign, nil
}
