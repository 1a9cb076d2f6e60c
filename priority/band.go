// Package priority decides who is served, who waits and who is turned away
// when a pool runs short of capacity. It holds the three bands (Critical,
// Standard, Sheddable), the saturation of a pool computed from per-pod
// metrics or from health digests, and the Gate: an admission queue per pool
// that serves Critical first, shares capacity fairly between the tenants of
// a band (weighted start-time fair queueing), sheds Sheddable requests at
// once when the pool is saturated, and bounds what it holds in requests and
// bytes, shedding the lowest band first.
//
// It does not pick a pod or a cluster: a request released by the Gate goes
// back to its caller, which picks the best pod or cluster at that moment
// (late binding). It does no I/O and serves no HTTP; Tier-2 uses it for
// global admission, Tier-1 for per-pool flow control. Rate limits live in
// ratelimit, not here.
package priority

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/meridian-router/meridian/config"
)

// Band is a request's priority class. Higher is more important; the zero
// value is Sheddable, so always set a band explicitly (or use ParseBand,
// whose empty input is Standard).
type Band int8

const (
	// Sheddable requests are served only while the pool has headroom and
	// are rejected at once (429 with Retry-After) when it is saturated.
	Sheddable Band = iota
	// Standard requests wait in a bounded, fair queue when the pool is
	// saturated, and are rejected when their wait runs out. The default.
	Standard
	// Critical requests are served before any Standard request, may spill
	// to another Region at Tier-2, and evict queued Standard requests when
	// the queue is full.
	Critical

	numBands = 3
)

// String returns the band's configuration name.
func (b Band) String() string {
	switch b {
	case Sheddable:
		return config.BandSheddable
	case Standard:
		return config.BandStandard
	case Critical:
		return config.BandCritical
	}
	return "Band(" + strconv.Itoa(int(b)) + ")"
}

func (b Band) valid() bool { return b >= Sheddable && b <= Critical }

// Priority returns the GIE integer priority that stands for the band:
// 1, 0 or -1. Tier-2 sends it to Tier-1 in x-gateway-inference-objective.
func (b Band) Priority() int {
	switch b {
	case Critical:
		return 1
	case Sheddable:
		return -1
	}
	return 0
}

// ErrUnknownBand reports a claim or header that names no band.
var ErrUnknownBand = errors.New("priority: unknown band")

// ParseBand parses a criticality claim: "Critical", "Standard" or
// "Sheddable", in any letter case. An empty claim is Standard.
func ParseBand(s string) (Band, error) {
	switch {
	case s == "":
		return Standard, nil
	case strings.EqualFold(s, config.BandCritical):
		return Critical, nil
	case strings.EqualFold(s, config.BandStandard):
		return Standard, nil
	case strings.EqualFold(s, config.BandSheddable):
		return Sheddable, nil
	}
	return Standard, fmt.Errorf("%w %q: want %s, %s or %s", ErrUnknownBand, s,
		config.BandCritical, config.BandStandard, config.BandSheddable)
}

// BandFromPriority maps GIE's integer priority to a band. GIE serves higher
// values first and sheds negative ones at saturation; its default is 0.
// Meridian keeps three bands, so every positive value is Critical, 0 is
// Standard and every negative value is Sheddable: priorities 1 and 10 are
// not told apart.
func BandFromPriority(p int) Band {
	switch {
	case p > 0:
		return Critical
	case p < 0:
		return Sheddable
	}
	return Standard
}

// HeaderObjective is the request header that carries a GIE
// InferenceObjective name.
const HeaderObjective = "x-gateway-inference-objective"

// HeaderFairnessID is the request header that carries GIE's flow (tenant)
// id; Tier-1 uses it as the tenant when no token says otherwise.
const HeaderFairnessID = "x-gateway-inference-fairness-id"

// ParseObjective returns the band for an x-gateway-inference-objective
// value. In GIE the value names an InferenceObjective whose spec.priority
// is the integer; objectives maps those names to priorities. A value that
// names no objective but is an integer is taken as the priority itself
// (Meridian's shortcut, and what Tier-2 sends to Tier-1). An empty value is
// Standard.
func ParseObjective(value string, objectives map[string]int) (Band, error) {
	if value == "" {
		return Standard, nil
	}
	if p, ok := objectives[value]; ok {
		return BandFromPriority(p), nil
	}
	if p, err := strconv.Atoi(strings.TrimSpace(value)); err == nil {
		return BandFromPriority(p), nil
	}
	return Standard, fmt.Errorf("%w: %s %q names no InferenceObjective and is not an integer priority",
		ErrUnknownBand, HeaderObjective, value)
}
