// Package plan sizes model-server pools from replayed peak traffic: how
// many pods of which GPU each pool needs to meet a TTFT SLO (Capacity),
// and how LoRA adapters are split between a hot-set pool and a long-tail
// pool (LoRA). Every figure comes from replaying the workload through the
// shipped Meridian scheduler on simulated pods (package replay); a plan is
// a search over pod counts, not a formula.
//
// The package decides the search: which mixes are tried, in which order,
// what "meets the SLO" and "minimal" mean, how the peak is taken from a
// trace or from Prometheus, and how adapters are grouped. It does not
// decide how long work takes on a pod (package sim) or where a request
// goes (package tier1, through replay). It assumes, as replay's goodput
// search does, that more pods never make the SLO harder to meet; the
// final plan is checked pod by pod rather than trusted to that.
//
// See docs/planning.md.
package plan
