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
