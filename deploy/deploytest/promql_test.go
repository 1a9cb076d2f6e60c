package deploytest

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// repo is the repository root, relative to this package.
const repo = "../.."

// ruleFile is the shape of a Prometheus rule file, strict.
type ruleFile struct {
	Groups []struct {
		Name     string `json:"name"`
		Interval string `json:"interval,omitempty"`
		Rules    []struct {
			Record      string            `json:"record,omitempty"`
			Alert       string            `json:"alert,omitempty"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

// promql parses with the defaults of a stock Prometheus server: no
// experimental functions, so nothing the shipped files use needs a flag.
var promql = parser.NewParser(parser.Options{})

// expression is one PromQL expression and where it came from.
type expression struct {
	origin string
	expr   string
}

func readRules(t *testing.T, name string) ruleFile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repo, "deploy/prometheus/rules", name))
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return f
}

// ruleExpressions returns every rule's expression and the names the
// recording rules define.
func ruleExpressions(t *testing.T) ([]expression, map[string]bool) {
	t.Helper()
	var exprs []expression
	recorded := map[string]bool{}
	for _, name := range []string{"recording.yml", "alerts.yml"} {
		f := readRules(t, name)
		if len(f.Groups) == 0 {
			t.Fatalf("%s: no rule groups", name)
		}
		for _, g := range f.Groups {
			for i, r := range g.Rules {
				id := r.Record + r.Alert
				if id == "" {
					t.Errorf("%s: group %s rule %d: neither record nor alert", name, g.Name, i)
				}
				if r.Record != "" {
					recorded[r.Record] = true
				}
				exprs = append(exprs, expression{origin: name + ": " + id, expr: r.Expr})
			}
		}
	}
	return exprs, recorded
}

// contractNames reads the metric names of docs/metrics.md (every
// back-quoted name in the first column of its tables) with their type
// (the second column).
func contractNames(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(repo, "docs/metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names := map[string]string{}
	quoted := regexp.MustCompile("`([a-zA-Z_:][a-zA-Z0-9_:]*)`")
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cols := strings.Split(line, "|")
		if len(cols) < 3 {
			continue
		}
		typ := strings.TrimSpace(cols[2])
		for _, m := range quoted.FindAllStringSubmatch(cols[1], -1) {
			names[m[1]] = typ
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(names) < 20 {
		t.Fatalf("docs/metrics.md: found only %d metric names; has its table format changed?", len(names))
	}
	return names
}

// checkExpression parses e with the Prometheus parser and checks that every
// series it selects is in the contract, a recording rule, or `up`.
func checkExpression(t *testing.T, e expression, contract map[string]string, recorded map[string]bool) {
	t.Helper()
	node, err := promql.ParseExpr(e.expr)
	if err != nil {
		t.Errorf("%s: %v\n%s", e.origin, err, e.expr)
		return
	}
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			t.Errorf("%s: a selector without a metric name: %s", e.origin, vs)
			return nil
		}
		if !knownName(name, contract, recorded) {
			t.Errorf("%s: %s is not in docs/metrics.md (nor a recording rule)", e.origin, name)
		}
		return nil
	})
}

func knownName(name string, contract map[string]string, recorded map[string]bool) bool {
	if _, ok := contract[name]; ok || name == "up" || recorded[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && contract[base] == "histogram" {
			return true
		}
	}
	return false
}

func TestRuleExpressionsParseAndUseContractNames(t *testing.T) {
	contract := contractNames(t)
	exprs, recorded := ruleExpressions(t)
	if len(exprs) < 15 {
		t.Fatalf("only %d rules", len(exprs))
	}
	for _, e := range exprs {
		checkExpression(t, e, contract, recorded)
	}
}

// TestContractCheckCatchesUnknownNames shows the name check can fail.
func TestContractCheckCatchesUnknownNames(t *testing.T) {
	contract := contractNames(t)
	for _, name := range []string{"vllm:num_requests_waiting", "meridian_tier1_ttft_seconds_bucket", "meridian_tier2_rejected_total"} {
		if !knownName(name, contract, nil) {
			t.Errorf("%s should be in the contract", name)
		}
	}
	for _, name := range []string{"vllm:num_requests_waitin", "meridian_tier2_rejections_total", "meridian_tier2_rejected_total_bucket", "meridian_tier1_ttft_seconds_total"} {
		if knownName(name, contract, nil) {
			t.Errorf("%s should not be in the contract", name)
		}
	}
	if _, err := promql.ParseExpr(`sum by (pool (x)`); err == nil {
		t.Error("the parser accepted a broken expression")
	}
}

// TestAdapterRules parses the prometheus-adapter queries behind the
// chart's external-metric autoscalers, with the adapter's template filled
// in as it would be for one pool.
func TestAdapterRules(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repo, "deploy/prometheus/adapter-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Rules struct {
			Default  bool `json:"default"`
			External []struct {
				SeriesQuery string `json:"seriesQuery"`
				Resources   struct {
					Namespaced *bool `json:"namespaced"`
				} `json:"resources"`
				Name struct {
					As string `json:"as"`
				} `json:"name"`
				MetricsQuery string `json:"metricsQuery"`
			} `json:"external"`
		} `json:"rules"`
	}
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		t.Fatal(err)
	}
	contract := contractNames(t)
	names := map[string]bool{}
	for _, r := range f.Rules.External {
		names[r.Name.As] = true
		checkExpression(t, expression{origin: r.Name.As + " seriesQuery", expr: r.SeriesQuery}, contract, nil)
		q := strings.ReplaceAll(r.MetricsQuery, "<<.LabelMatchers>>", `pool="qwen-32b-agent"`)
		checkExpression(t, expression{origin: r.Name.As + " metricsQuery", expr: q}, contract, nil)
		if !strings.Contains(r.MetricsQuery, "by (pool)") {
			t.Errorf("%s: the HPA selects by pool; the query must keep it", r.Name.As)
		}
	}
	// The names the chart's autoscaling template uses.
	for _, want := range []string{"meridian_pool_queue_depth", "meridian_pool_429_rate"} {
		if !names[want] {
			t.Errorf("no external metric %s", want)
		}
	}
}
