package kube

import (
	"bytes"
	"embed"
	"io/fs"
	"slices"
)

//go:embed crds
var crdFiles embed.FS

// CRDs is every CustomResourceDefinition the source reads, as one YAML
// stream ready for `kubectl apply -f -`: Meridian's kinds, the
// HyperPod-style InferenceGatewayConfig, Meridian's InferenceModelRewrite
// and InferenceObjective, and GIE's InferencePool.
func CRDs() []byte {
	var b bytes.Buffer
	for i, d := range CRDDocuments() {
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(d)
	}
	return b.Bytes()
}

// CRDDocuments is CRDs one definition at a time, sorted by file name.
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
