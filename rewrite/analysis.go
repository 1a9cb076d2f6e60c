package rewrite

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/meridian-router/meridian/config"
)

// Defaults of config.AnalysisLimit's zero fields.
const (
	DefaultMaxTTFTP99Ratio   = 1.5
	DefaultMaxErrorRateDelta = 0.05
	DefaultMax429RateDelta   = 0.1
	DefaultMinRequests       = 20
)

// Stats are one side's measurements over the analysis window, as Tier-2
// instances share them (summed over instances; P99 from merged histograms).
type Stats struct {
	// Requests answered in the window, whatever the outcome.
	Requests int64
	// Errors are 5xx answers and transport failures; not 429s.
	Errors int64
	// Throttled are 429 answers (rate limits and sheds).
	Throttled int64
	// TTFTP99 is the 99th percentile time to first token. Zero means no
	// sample (for example every request failed).
	TTFTP99 time.Duration
}

func (s Stats) validate(side string) error {
	switch {
	case s.Requests < 0 || s.Errors < 0 || s.Throttled < 0 || s.TTFTP99 < 0:
		return fmt.Errorf("%w: %s: negative value in %+v", ErrBadStats, side, s)
	case s.Errors+s.Throttled > s.Requests:
		return fmt.Errorf("%w: %s: %d errors and %d 429s out of %d requests", ErrBadStats, side, s.Errors, s.Throttled, s.Requests)
	}
	return nil
}

// ErrBadStats reports statistics that cannot describe real traffic.
var ErrBadStats = errors.New("rewrite: invalid analysis stats")

// Verdict is the outcome of one analysis.
type Verdict int

const (
	// Inconclusive: not enough evidence either way.
	Inconclusive Verdict = iota
	// Pass: the canary is within every limit.
	Pass
	// Fail: the canary breaks at least one limit.
	Fail
)

func (v Verdict) String() string {
	switch v {
	case Inconclusive:
		return "Inconclusive"
	case Pass:
		return "Pass"
	case Fail:
		return "Fail"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Result is a verdict with its reason, written for operators.
type Result struct {
	Verdict Verdict
	Reason  string
	// StableIdle marks an Inconclusive verdict whose only lack is stable
	// traffic: the canary had MinRequests and broke no limit. At a 100%
	// step stable serves nothing by design (Evaluate).
	StableIdle bool
}

// Analyze compares the canary with stable against lim (nil means every
// default). Rates are compared as absolute differences (canary − stable),
// so a stable side that is itself failing does not mask a worse canary, and
// latency as the ratio of P99 TTFTs. Every broken limit is named in the
// reason. Fewer than MinRequests on either side is Inconclusive, except
// that a canary whose failures already break a limit whatever the
// remaining requests do is failed at once.
func Analyze(canary, stable Stats, lim *config.AnalysisLimit) (Result, error) {
	l, err := limits(lim)
	if err != nil {
		return Result{}, err
	}
	if err := canary.validate("canary"); err != nil {
		return Result{}, err
	}
	if err := stable.validate("stable"); err != nil {
		return Result{}, err
	}
	enough := canary.Requests >= l.MinRequests && stable.Requests >= l.MinRequests
	var fails []string
	// With too few canary requests its rates are computed over MinRequests:
	// a lower bound on the rate once it has MinRequests, so a failure found
	// early is certain. Stable must have enough requests to compare with.
	cn := max(canary.Requests, l.MinRequests)
	sn := max(stable.Requests, 1)
	if d := rate(canary.Errors, cn) - rate(stable.Errors, sn); d > l.MaxErrorRateDelta && stable.Requests >= l.MinRequests {
		fails = append(fails, fmt.Sprintf("error rate %.1f%% vs stable %.1f%% (+%.1f points, limit %.1f)",
			100*rate(canary.Errors, max(canary.Requests, 1)), 100*rate(stable.Errors, sn), 100*d, 100*l.MaxErrorRateDelta))
	}
	if d := rate(canary.Throttled, cn) - rate(stable.Throttled, sn); d > l.Max429RateDelta && stable.Requests >= l.MinRequests {
		fails = append(fails, fmt.Sprintf("429 rate %.1f%% vs stable %.1f%% (+%.1f points, limit %.1f)",
			100*rate(canary.Throttled, max(canary.Requests, 1)), 100*rate(stable.Throttled, sn), 100*d, 100*l.Max429RateDelta))
	}
	if enough && canary.TTFTP99 > 0 && stable.TTFTP99 > 0 {
		if r := float64(canary.TTFTP99) / float64(stable.TTFTP99); r > l.MaxTTFTP99Ratio {
			fails = append(fails, fmt.Sprintf("P99 TTFT %s vs stable %s (%.2f×, limit %.2f×)",
				canary.TTFTP99, stable.TTFTP99, r, l.MaxTTFTP99Ratio))
		}
	}
	if len(fails) > 0 {
		return Result{Verdict: Fail, Reason: strings.Join(fails, "; ")}, nil
	}
	switch {
	case !enough:
		return Result{Verdict: Inconclusive, Reason: fmt.Sprintf("too few requests: canary %d, stable %d, need %d each",
			canary.Requests, stable.Requests, l.MinRequests), StableIdle: canary.Requests >= l.MinRequests}, nil
	case canary.TTFTP99 == 0 || stable.TTFTP99 == 0:
		return Result{Verdict: Inconclusive, Reason: fmt.Sprintf("no TTFT samples (canary P99 %s, stable P99 %s)",
			canary.TTFTP99, stable.TTFTP99)}, nil
	}
	return Result{Verdict: Pass, Reason: fmt.Sprintf("within limits: P99 TTFT %.2f× stable, error rate %+.1f points, 429 rate %+.1f points",
		float64(canary.TTFTP99)/float64(stable.TTFTP99),
		100*(rate(canary.Errors, canary.Requests)-rate(stable.Errors, stable.Requests)),
		100*(rate(canary.Throttled, canary.Requests)-rate(stable.Throttled, stable.Requests)))}, nil
}

func rate(n, of int64) float64 { return float64(n) / float64(of) }

func limits(lim *config.AnalysisLimit) (config.AnalysisLimit, error) {
	l := config.AnalysisLimit{}
	if lim != nil {
		l = *lim
	}
	if l.MaxTTFTP99Ratio < 0 || l.MaxErrorRateDelta < 0 || l.Max429RateDelta < 0 || l.MinRequests < 0 {
		return l, fmt.Errorf("rewrite: analysis limits must not be negative: %+v", l)
	}
	if l.MaxTTFTP99Ratio == 0 {
		l.MaxTTFTP99Ratio = DefaultMaxTTFTP99Ratio
	}
	if l.MaxErrorRateDelta == 0 {
		l.MaxErrorRateDelta = DefaultMaxErrorRateDelta
	}
	if l.Max429RateDelta == 0 {
		l.Max429RateDelta = DefaultMax429RateDelta
	}
	if l.MinRequests == 0 {
		l.MinRequests = DefaultMinRequests
	}
	return l, nil
}
