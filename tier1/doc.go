// Package tier1 is Tier-1's decision core: for one request, which model
// server pod of a pool serves it.
//
// A Pool holds the live state of a pool's endpoints: their last scraped
// metrics, Meridian's accounting of what was sent to each since (so that a
// burst between two scrapes spreads instead of herding onto the pod that
// looked idlest), an online TTFT model per endpoint, LoRA adapter demand,
// and a prefix index of which prompt blocks each endpoint was sent. A
// Scheduler, built from a configuration's scheduler and its resolved
// policy, filters the endpoints (ready, inside the proxy's subset hint,
// metrics fresh enough, able to serve the adapter), scores them with the
// seven weighted scorers (queue, kvCache, prefix, loraAffinity,
// runningRequests, predictedLatency, lru), and picks a primary plus ordered
// fallbacks. A scheduler in "gie" scoring mode reproduces the Gateway API
// Inference Extension's scorer semantics exactly; it is the baseline
// Meridian's own scoring is measured against (docs/scheduling.md).
//
// The package does no I/O and reads no clock: every decision takes its
// time as an argument, so the same code runs live and in virtual-time
// replay. Scraping, discovery, proxying, ext_proc, sharing prefix events
// between replicas and swapping schedulers on reload belong to the data
// plane; this package gives it the operations to call (Endpoint.SetMetrics,
// Scheduler.Schedule, Scheduler.Dispatch, Ticket.FirstToken, Ticket.Done,
// Scheduler.ApplyPrefixEvent).
package tier1
