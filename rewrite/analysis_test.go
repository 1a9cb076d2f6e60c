package rewrite

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
)

func TestAnalyze(t *testing.T) {
	ms := time.Millisecond
	stable := Stats{Requests: 1000, Errors: 10, Throttled: 20, TTFTP99: 400 * ms}
	for _, tc := range []struct {
		name    string
		canary  Stats
		stable  Stats
		lim     *config.AnalysisLimit
		want    Verdict
		reasons []string
	}{
		{"healthy", Stats{Requests: 100, Errors: 1, Throttled: 2, TTFTP99: 450 * ms}, stable, nil, Pass, []string{"within limits", "1.12×"}},
		{"slow", Stats{Requests: 100, TTFTP99: 700 * ms}, stable, nil, Fail, []string{"P99 TTFT 700ms vs stable 400ms (1.75×, limit 1.50×)"}},
		{"slow at the limit passes", Stats{Requests: 100, TTFTP99: 600 * ms}, stable, nil, Pass, nil},
		{"tighter ratio", Stats{Requests: 100, TTFTP99: 500 * ms}, stable, &config.AnalysisLimit{MaxTTFTP99Ratio: 1.2}, Fail, []string{"limit 1.20×"}},
		{"errors", Stats{Requests: 100, Errors: 10, TTFTP99: 400 * ms}, stable, nil, Fail, []string{"error rate 10.0% vs stable 1.0% (+9.0 points, limit 5.0)"}},
		{"429s", Stats{Requests: 100, Throttled: 15, TTFTP99: 400 * ms}, stable, nil, Fail, []string{"429 rate 15.0% vs stable 2.0%"}},
		{"every limit named", Stats{Requests: 100, Errors: 10, Throttled: 15, TTFTP99: 2 * time.Second}, stable, nil, Fail, []string{"error rate", "429 rate", "P99 TTFT"}},
		{"too few", Stats{Requests: 5, TTFTP99: 900 * ms}, stable, nil, Inconclusive, []string{"too few requests: canary 5, stable 1000, need 20 each"}},
		{"too few but already failing", Stats{Requests: 5, Errors: 5}, stable, nil, Fail, []string{"error rate 100.0%"}},
		{"few failures not yet decisive", Stats{Requests: 5, Errors: 1, TTFTP99: 400 * ms}, stable, nil, Inconclusive, nil},
		{"stable too small to compare", Stats{Requests: 5, Errors: 5}, Stats{Requests: 3}, nil, Inconclusive, []string{"too few"}},
		{"custom min", Stats{Requests: 50, TTFTP99: 400 * ms}, stable, &config.AnalysisLimit{MinRequests: 100}, Inconclusive, []string{"need 100"}},
		{"no TTFT samples", Stats{Requests: 100}, stable, nil, Inconclusive, []string{"no TTFT samples"}},
		{"stable idle (a 100% step)", Stats{Requests: 40, TTFTP99: 400 * ms}, Stats{}, nil, Inconclusive, []string{"canary 40, stable 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.stable
			got, err := Analyze(tc.canary, st, tc.lim)
			if err != nil {
				t.Fatal(err)
			}
			if got.Verdict != tc.want {
				t.Fatalf("verdict %s (%s); want %s", got.Verdict, got.Reason, tc.want)
			}
			// Only a canary with enough requests and an idle stable side
			// is StableIdle (Evaluate completes a 100% step on it).
			if idle := got.Verdict == Inconclusive && tc.canary.Requests >= 20 && st.Requests < 20; got.StableIdle != idle {
				t.Errorf("StableIdle %v, want %v", got.StableIdle, idle)
			}
			for _, r := range tc.reasons {
				if !strings.Contains(got.Reason, r) {
					t.Errorf("reason %q does not mention %q", got.Reason, r)
				}
			}
		})
	}
}

func TestAnalyzeBadInput(t *testing.T) {
	ok := Stats{Requests: 100, TTFTP99: time.Second}
	for _, tc := range []struct {
		name           string
		canary, stable Stats
		lim            *config.AnalysisLimit
		bad            bool
	}{
		{"negative", Stats{Requests: -1}, ok, nil, true},
		{"more errors than requests", Stats{Requests: 10, Errors: 8, Throttled: 3}, ok, nil, true},
		{"bad stable", ok, Stats{Requests: 1, Errors: 2}, nil, true},
		{"negative limit", ok, ok, &config.AnalysisLimit{MaxErrorRateDelta: -0.1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Analyze(tc.canary, tc.stable, tc.lim)
			if err == nil {
				t.Fatal("no error")
			}
			if errors.Is(err, ErrBadStats) != tc.bad {
				t.Fatalf("errors.Is(%v, ErrBadStats) = %v; want %v", err, !tc.bad, tc.bad)
			}
		})
	}
}
