// Package replay replays an LLM request trace through routing policies
// against simulated model-server pods on virtual time, and reports what
// each policy does to latency, throughput and prefix-cache hits.
//
// The policies are the baselines Meridian is measured against (Envoy's
// round-robin, random and least-request load balancers, and the Gateway
// API Inference Extension's default scheduler) and Meridian's own
// scheduler. The last two are not re-implementations: they are the real
// Tier-1 decision core (package tier1) in its "gie" and "meridian" scoring
// modes, fed metric snapshots scraped from the simulated pods every 50 ms
// of virtual time, exactly as the data plane feeds them live. Several
// Tier-1 replicas can take requests in turn; Meridian replicas exchange
// prefix events (as they do over gRPC in production, here without delay),
// GIE replicas keep independent indexes.
//
// The package decides how a replay is run and measured: trace loading,
// synthetic LoRA adapter popularity, the event loop, percentiles, weight
// sweeps, the goodput search and the output formats. It does not decide
// how long work takes on a pod (package sim) or which pod a request goes
// to (the policies, tier1 for the two schedulers). DESIGN.md lists trace
// replay under sim/; it lives in its own package because it imports both
// sim and tier1, and sim must not depend on the scheduler it measures.
//
// Runs are deterministic: the same workload, policy, options and seed give
// the same Result. See docs/tuning.md for how to use it.
package replay
