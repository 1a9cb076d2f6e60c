package deploytest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// dashboard is the part of a Grafana dashboard these tests read.
type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Datasource  *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
		RefID        string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repo, "deploy/grafana/meridian.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("meridian.json: %v", err)
	}
	return d
}

// grafanaVariables are replaced by what Grafana would put there before an
// expression reaches Prometheus.
var grafanaVariables = strings.NewReplacer(
	"$__rate_interval", "1m",
	"$__interval", "15s",
	"$__range", "3h",
	"$pool", ".*",
)

// dashboardExpressions returns every PromQL expression of the dashboard,
// Grafana's variables substituted, including the label_values() query of
// template variables.
func dashboardExpressions(t *testing.T, d dashboard) []expression {
	t.Helper()
	var exprs []expression
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				exprs = append(exprs, expression{
					origin: fmt.Sprintf("panel %q target %s", p.Title, tg.RefID),
					expr:   grafanaVariables.Replace(tg.Expr),
				})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_]\w*)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: want label_values(SELECTOR, LABEL), got %q", v.Name, v.Definition)
			continue
		}
		exprs = append(exprs, expression{origin: "variable " + v.Name, expr: m[1]})
	}
	return exprs
}

func TestDashboardExpressionsParseAndUseContractNames(t *testing.T) {
	d := readDashboard(t)
	contract := contractNames(t)
	_, recorded := ruleExpressions(t)
	exprs := dashboardExpressions(t, d)
	if len(exprs) < 20 {
		t.Fatalf("only %d expressions", len(exprs))
	}
	for _, e := range exprs {
		if strings.Contains(e.expr, "$") {
			t.Errorf("%s: a Grafana variable the test does not know: %s", e.origin, e.expr)
			continue
		}
		checkExpression(t, e, contract, recorded)
	}
}

// TestDashboardPanels checks the panels the issue names are there, each
// with a data source and a description, and that panels do not overlap.
func TestDashboardPanels(t *testing.T) {
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Fatal("dashboard needs a uid and a title")
	}
	var all []panel
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			all = append(all, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	must := map[string]string{
		"P99 TTFT per model name":         "vllm:time_to_first_token_seconds_bucket",
		"Queue spread per pool":           "vllm:num_requests_waiting",
		"Prefix-cache hit ratio per pool": "vllm:prefix_cache_hits_total",
		"429 rate per band and tenant":    "meridian_tier2_rejected_total",
		"Traffic per Region":              "meridian_tier2_requests_total",
		"Failovers":                       "meridian_tier2_failovers_total",
		"Rate-limit rejections":           "meridian_ratelimit_rejected_total",
		"Canary state":                    "meridian_canary_state",
	}
	for title, metric := range must {
		found := false
		for _, p := range all {
			if !strings.Contains(p.Title, title) {
				continue
			}
			for _, tg := range p.Targets {
				if strings.Contains(tg.Expr, metric) {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("no panel %q over %s", title, metric)
		}
	}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	used := map[cell]string{}
	for _, p := range all {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source must be the ${datasource} variable", p.Title)
		}
		if p.Description == "" {
			t.Errorf("panel %q: no description", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no queries", p.Title)
		}
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: grid position %+v outside the 24-column grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := used[cell{x, y}]; ok {
					t.Errorf("panel %q overlaps %q at (%d,%d)", p.Title, other, x, y)
					return
				}
				used[cell{x, y}] = p.Title
			}
		}
	}
}

// TestDashboardExpressionsPromtool has the Prometheus that CI installs
// parse every dashboard expression too, by wrapping them in a rules file:
// the Go parser is newer than the server operators may run.
func TestDashboardExpressionsPromtool(t *testing.T) {
	d := readDashboard(t)
	exprs := dashboardExpressions(t, d)
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		q, _ := json.Marshal(e.expr) // a JSON string is a YAML string
		fmt.Fprintf(&b, "      - record: dashboard_expr_%d\n        expr: %s\n", i, q)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.yml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runPromtool(t, dir, "check", "rules", "dashboard.yml")
	if err != nil {
		t.Fatalf("promtool check rules (dashboard expressions): %v\n%s", err, out)
	}
}
