package arch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

const module = "github.com/meridian-router/meridian"

// pkg is what the rules need of one package, with paths relative to the
// module ("tier2/gossip").
type pkg struct {
	Path    string
	Doc     string
	Imports []string // non-test imports inside the module
}

// TestArchitecture checks docs/architecture.md against `go list`: the
// package map names every package and no other, and every rule holds.
func TestArchitecture(t *testing.T) {
	pkgs := list(t)
	mapped := packageMap(t, filepath.Join("..", "..", "docs", "architecture.md"))
	for _, p := range pkgs {
		if !mapped[p.Path] {
			t.Errorf("docs/architecture.md: package map lacks %s", p.Path)
		}
		delete(mapped, p.Path)
	}
	for p := range mapped {
		t.Errorf("docs/architecture.md: package map names %s, which go list does not find", p)
	}
	for _, v := range check(pkgs) {
		t.Error(v)
	}
}

// TestRulesCatchViolations shows each rule failing on a graph that breaks it.
func TestRulesCatchViolations(t *testing.T) {
	good := func(path string, imports ...string) pkg {
		return pkg{Path: path, Doc: "Package x.", Imports: imports}
	}
	cases := []struct {
		rule string
		p    pkg
	}{
		{"rule 1", good("tier2", "cmd/meridian")},
		{"rule 1", good("replay", "bench/soak")},
		{"rule 2", good("cmd/meridian", "tier2/gossip/gossiptest")},
		{"rule 2", good("sim", "internal/testkit")},
		{"rule 3", good("tier1/gateway", "tier2/gossip")},
		{"rule 3", good("tier2", "tier1/gateway")},
		{"rule 4", good("tier2", "canary")},
		{"rule 4", good("tier1/proxy", "sim")},
		{"rule 5", good("rewrite", "tier2")},
		{"rule 5", good("request", "config")},
		{"rule 5", good("ratelimit", "aws/cloudwatch")},
		{"rule 6", good("canary", "tier2")},
		{"rule 7", pkg{Path: "regions"}},
	}
	for _, c := range cases {
		v := check([]pkg{c.p})
		if len(v) != 1 || !strings.HasPrefix(v[0], c.rule+":") {
			t.Errorf("%s importing %v: got %q, want one %s violation", c.p.Path, c.p.Imports, v, c.rule)
		}
	}
	// Allowed edges stay allowed.
	for _, p := range []pkg{
		good("tier2", "api/tier1/v1", "rollout", "tier2/gossip", "regions"),
		good("tier1/health", "api/tier1/v1", "tier1/gateway"),
		good("ratelimit", "config"),
		good("regions", "tier2/gossip"),
		good("replay", "tier1", "sim"),
		good("cmd/meridian", "tier2/gossip/faultnet", "canary"),
	} {
		if v := check([]pkg{p}); len(v) > 0 {
			t.Errorf("%s importing %v: %q, want none", p.Path, p.Imports, v)
		}
	}
}

// check returns every rule of docs/architecture.md that pkgs break.
func check(pkgs []pkg) []string {
	var out []string
	bad := func(rule int, p pkg, format string, args ...any) {
		out = append(out, fmt.Sprintf("rule %d: %s %s", rule, p.Path, fmt.Sprintf(format, args...)))
	}
	tools := []string{"canary", "replay", "plan", "sim", "sim/trace"}
	domain := []string{"request", "config", "rewrite", "rollout", "priority", "ratelimit", "regions", "internal"}
	for _, p := range pkgs {
		if p.Doc == "" {
			bad(7, p, "has no package doc comment")
		}
		for _, imp := range p.Imports {
			switch {
			case under(imp, "cmd") || under(imp, "bench"):
				bad(1, p, "imports %s (a command)", imp)
			case strings.HasSuffix(filepath.Base(imp), "test") || imp == "internal/testkit":
				bad(2, p, "imports %s (a test kit) outside its tests", imp)
			case under(p.Path, "tier1") && under(imp, "tier2"),
				under(p.Path, "tier2") && under(imp, "tier1"):
				bad(3, p, "imports %s (the other tier)", imp)
			case (under(p.Path, "tier1") || under(p.Path, "tier2")) &&
				(slices.Contains(tools, imp) || under(imp, "aws") || under(imp, "deploy")):
				bad(4, p, "imports %s (a tool)", imp)
			case slices.ContainsFunc(domain, func(d string) bool { return under(p.Path, d) }) &&
				(p.Path == "request" ||
					(under(imp, "tier1") || under(imp, "tier2")) && imp != "tier2/gossip" ||
					slices.Contains(tools, imp) || under(imp, "aws") || under(imp, "deploy")):
				bad(5, p, "imports %s (above the domain)", imp)
			case slices.Contains([]string{"canary", "replay", "plan", "sim"}, p.Path) && under(imp, "tier2"):
				bad(6, p, "imports %s (Tier-2)", imp)
			}
		}
	}
	return out
}

// under reports whether path is dir or inside it.
func under(path, dir string) bool { return path == dir || strings.HasPrefix(path, dir+"/") }

// list runs `go list -json ./...` at the module's root.
func list(t *testing.T) []pkg {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-json=ImportPath,Doc,Imports,Error", "./...")
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var out []pkg
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		var p struct {
			ImportPath, Doc string
			Imports         []string
			Error           *struct{ Err string }
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Error != nil {
			t.Fatalf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		q := pkg{Path: rel(p.ImportPath), Doc: p.Doc}
		for _, imp := range p.Imports {
			if imp == module || strings.HasPrefix(imp, module+"/") {
				q.Imports = append(q.Imports, rel(imp))
			}
		}
		out = append(out, q)
	}
	if len(out) < 10 {
		t.Fatalf("go list found %d packages; is the test running inside the module?", len(out))
	}
	return out
}

func rel(importPath string) string { return strings.TrimPrefix(importPath, module+"/") }

// packageMap reads the packages the "Package map" table of the page names.
func packageMap(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `([^`]+)` \\|")
	out := map[string]bool{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Package map"
			continue
		}
		if m := row.FindStringSubmatch(line); in && m != nil {
			if out[m[1]] {
				t.Errorf("%s: package map names %s twice", path, m[1])
			}
			out[m[1]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no package map table under \"## Package map\"", path)
	}
	return out
}
