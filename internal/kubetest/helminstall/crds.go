package helminstall

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
	"sigs.k8s.io/controller-tools/pkg/crd"
	crdmarkers "sigs.k8s.io/controller-tools/pkg/crd/markers"
	"sigs.k8s.io/controller-tools/pkg/loader"
	"sigs.k8s.io/controller-tools/pkg/markers"
	"sigs.k8s.io/yaml"
)

// GeneratedCRDs generates the CustomResourceDefinitions of kinds from the
// Go types of package pkg and their +kubebuilder markers with
// controller-tools, as the project that owns them does with
// controller-gen (without descriptions, which the API server does not
// need). It is for projects whose module carries types but no CRD files
// (Prometheus Operator's monitoring API).
func GeneratedCRDs(pkg string, kinds ...string) ([][]byte, error) {
	roots, err := loader.LoadRoots(pkg)
	if err != nil {
		return nil, fmt.Errorf("crds: load %s: %w", pkg, err)
	}
	reg := &markers.Registry{}
	if err := crdmarkers.Register(reg); err != nil {
		return nil, err
	}
	parser := &crd.Parser{Collector: &markers.Collector{Registry: reg}, Checker: &loader.TypeChecker{}, AllowDangerousTypes: true}
	crd.AddKnownTypes(parser)
	for _, r := range roots {
		parser.NeedPackage(r)
	}
	noDescriptions := 0
	var out [][]byte
	var found []string
	for _, gk := range crd.FindKubeKinds(parser, crd.FindMetav1(roots)) {
		if !slices.Contains(kinds, gk.Kind) {
			continue
		}
		parser.NeedCRDFor(gk, &noDescriptions)
		def, ok := parser.CustomResourceDefinitions[gk]
		if !ok {
			return nil, fmt.Errorf("crds: no definition for %s", gk)
		}
		def.APIVersion, def.Kind = "apiextensions.k8s.io/v1", "CustomResourceDefinition"
		b, err := yaml.Marshal(def)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
		found = append(found, gk.Kind)
	}
	if loader.PrintErrors(roots, packages.TypeError) {
		return nil, errors.New("crds: " + pkg + " has errors")
	}
	for _, k := range kinds {
		if !slices.Contains(found, k) {
			return nil, fmt.Errorf("crds: %s has no kind %s", pkg, k)
		}
	}
	return out, nil
}

// ModuleFile reads a file of a module the build uses (a CRD a project
// ships as YAML in its module, such as Gateway API's).
func ModuleFile(module, path string) ([]byte, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module).Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m %s: %w", module, err)
	}
	return os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), path))
}
