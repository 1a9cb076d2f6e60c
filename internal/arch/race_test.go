package arch

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRaceDependentTestsInSecondPass: a test that reads the race detector's
// flag (a constant named raceEnabled, RaceEnabled or ending so) skips or
// shrinks under the detector, so the test command's first pass (go test
// -race) does not check what it pins. The command's second pass, without
// the detector, runs the tests its -run pattern names: this fails a test
// that reads the flag and that the pattern misses, which CI would never
// run whole.
func TestRaceDependentTestsInSecondPass(t *testing.T) {
	root := filepath.Join("..", "..")
	pattern := secondPass(t, filepath.Join(root, "test.sh"))
	flag := regexp.MustCompile(`(?i)raceEnabled$`)
	found := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "Test") {
				continue
			}
			reads := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.Ident:
					reads = reads || flag.MatchString(x.Name)
				case *ast.SelectorExpr:
					reads = reads || flag.MatchString(x.Sel.Name)
				}
				return !reads
			})
			if !reads {
				continue
			}
			found++
			if !pattern.MatchString(fn.Name.Name) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s: %s reads the race detector's flag, and test.sh's second pass (-run %q) does not run it", rel, fn.Name.Name, pattern)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatal("no test reads the race detector's flag: the search is broken")
	}
}

// secondPass is the -run pattern of the test command's second pass: the
// line second='PATTERN' of test.sh, which runs go test -run "$second".
func secondPass(t *testing.T, script string) *regexp.Regexp {
	t.Helper()
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^second='([^']+)'$`).FindSubmatch(b)
	if m == nil || !strings.Contains(string(b), `go test -run "$second"`) {
		t.Fatalf("%s: no second pass of the form second='PATTERN' ... go test -run \"$second\"", script)
	}
	re, err := regexp.Compile(string(m[1]))
	if err != nil {
		t.Fatalf("%s: the second pass's -run pattern: %v", script, err)
	}
	return re
}
