package rewrite_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/rewrite"
)

// Tier-2's model-resolution stage: build from the snapshot's rewrites
// (Update again on every reload), resolve each request, send Target
// upstream and answer with Public.
func ExampleResolver() {
	r, err := rewrite.NewResolver(map[string]*config.ModelRewrite{
		"support-agent": {Metadata: config.Metadata{Name: "support-agent"}, Spec: config.ModelRewriteSpec{
			Rules: []config.RewriteRule{{
				Matches: []config.RewriteMatch{{Model: &config.ModelMatch{Value: "support-agent"}}},
				Targets: []config.RewriteTarget{
					{ModelRewrite: "support-agent-v2", Weight: 1},
					{ModelRewrite: "support-agent-v3", Weight: 1, Clusters: []string{"us-east-1a"}},
				},
			}},
			Stickiness: &config.Stickiness{Key: "header", Header: "x-session-id", Salt: "rollout-3"},
			Rollout:    &config.Rollout{Stable: "support-agent-v2", Canary: "support-agent-v3", Steps: []int64{0, 25, 100}, Step: 0},
		}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	h := http.Header{}
	h.Set("X-Session-Id", "conversation-81")
	res, _ := r.Resolve(rewrite.Request{Model: "support-agent", Tenant: "search", Header: h})
	fmt.Println(res.Target, res.Public, res.Canary)
	// Output: support-agent-v2 support-agent false
}

// The analysis loop of a stepped rollout: compare, then let Evaluate say
// what to write.
func ExampleEvaluate() {
	ro := config.Rollout{Stable: "v2", Canary: "v3", Steps: []int64{5, 25, 100},
		Interval: config.Duration(10 * time.Minute), StepStarted: "2026-11-29T10:00:00Z"}
	res, _ := rewrite.Analyze(
		rewrite.Stats{Requests: 400, Errors: 40, TTFTP99: 900 * time.Millisecond},
		rewrite.Stats{Requests: 8000, Errors: 80, TTFTP99: 600 * time.Millisecond},
		ro.Analysis)
	d, _ := rewrite.Evaluate(ro, res, time.Date(2026, 11, 29, 10, 4, 0, 0, time.UTC))
	fmt.Println(d.Action, d.Rollout.Status, d.CanaryPercent)
	fmt.Println(d.Rollout.Reason)
	// Output:
	// abort Degraded 0
	// error rate 10.0% vs stable 1.0% (+9.0 points, limit 5.0)
}
