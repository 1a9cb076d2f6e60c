package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestCRDsUpToDate regenerates the definitions and compares them with
// the committed ones in config/kube/crds and the Helm chart's crds/: a
// change to the configuration types, their markers or the GIE module's
// InferencePool must come with `go generate ./config/kube`.
func TestCRDsUpToDate(t *testing.T) {
	files, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{filepath.Join("..", "crds"), filepath.Join("..", "..", "..", "deploy", "helm", "meridian", "crds")} {
		t.Run(filepath.ToSlash(dir), func(t *testing.T) { upToDate(t, dir, files) })
	}
}

func upToDate(t *testing.T, dir string, files map[string][]byte) {
	committed, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var have []string
	for _, f := range committed {
		have = append(have, filepath.Base(f))
	}
	if want := names(files); !slices.Equal(have, want) {
		t.Fatalf("config/kube/crds holds %q, want %q: run go generate ./config/kube", have, want)
	}
	for name, b := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b) {
			t.Errorf("config/kube/crds/%s is not what crdgen writes: run go generate ./config/kube", name)
		}
	}
}
