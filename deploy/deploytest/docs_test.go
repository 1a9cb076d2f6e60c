package deploytest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// githubAnchor is the anchor GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocLinksResolve checks every docs/observability.md#anchor that the
// alerts and the dashboard point operators to is a heading there.
func TestDocLinksResolve(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repo, "docs/observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			anchors[githubAnchor(strings.TrimLeft(h, "#"))] = true
		}
	}
	link := regexp.MustCompile(`docs/observability\.md#([a-z0-9_-]+)`)
	n := 0
	for _, f := range []string{"deploy/prometheus/rules/alerts.yml", "deploy/grafana/meridian.json"} {
		data, err := os.ReadFile(filepath.Join(repo, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(data), -1) {
			n++
			if !anchors[m[1]] {
				t.Errorf("%s links to docs/observability.md#%s, which has no such heading", f, m[1])
			}
		}
	}
	if n < 10 {
		t.Errorf("only %d links checked", n)
	}
	// Every alert has its section.
	exprs, _ := ruleExpressions(t)
	for _, e := range exprs {
		name := strings.TrimPrefix(e.origin, "alerts.yml: ")
		if name != e.origin && !anchors[githubAnchor(name)] {
			t.Errorf("alert %s has no section in docs/observability.md", name)
		}
	}
}

// TestEKSGuideCommands keeps docs/deploy-eks.md's promise: every command
// in its shell blocks ends with "# test: TestName", naming a test of this
// repository that runs it (or its equivalent through the same code), or
// with "# needs AWS".
func TestEKSGuideCommands(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repo, "docs/deploy-eks.md"))
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err = filepath.WalkDir(repo, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return err
		}
		data, err := os.ReadFile(p)
		for _, m := range decl.FindAllStringSubmatch(string(data), -1) {
			tests[m[1]] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	marker := regexp.MustCompile(`#\s*(?:test:\s*(Test\w+)|needs AWS)\s*$`)
	inBlock, inShell, n := false, false, 0
	for i, line := range strings.Split(string(doc), "\n") {
		if fence, ok := strings.CutPrefix(line, "```"); ok {
			inBlock = !inBlock
			inShell = inBlock && (fence == "" || fence == "sh" || fence == "bash")
			continue
		}
		if !inShell || strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		n++
		m := marker.FindStringSubmatch(line)
		switch {
		case m == nil:
			t.Errorf("docs/deploy-eks.md:%d: %q ends with neither # test: TestName nor # needs AWS", i+1, line)
		case m[1] != "" && !tests[m[1]]:
			t.Errorf("docs/deploy-eks.md:%d: names %s, which is no test of this repository", i+1, m[1])
		}
	}
	if n < 10 {
		t.Errorf("only %d commands found in docs/deploy-eks.md", n)
	}
}
