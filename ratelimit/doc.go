// Package ratelimit enforces global per-tenant rate limits — requests and
// tokens per unit of time, overall, per model and per band — across every
// Tier-2 instance in every Region, without a network call per request.
//
// Each instance decides alone, from in-memory token buckets that hold its
// share of each global limit. In the background the instances exchange
// how much demand each sees (Limiter.Sync, Limiter.Merge,
// Limiter.LocalState: the shape of a gossip channel) and every instance
// resizes its share to its fraction of the total demand, so capacity flows
// to wherever traffic is, and the sum of the shares stays at one limit.
// The burst moves with the shares: units a shrinking slice no longer holds
// are released to the peers, so an idle tenant has its whole burst
// available however its traffic is spread.
// Token limits are charged an estimate at admission and reconciled with
// real usage by Limiter.Settle.
//
// It decides whether a request fits and what to tell the caller (a
// Decision carries what OpenAI's x-ratelimit-* headers and Retry-After
// need). It does not authenticate, parse bodies, estimate tokens, pick
// bands, queue requests or speak HTTP or gossip: Tier-2 does those and
// passes the gossip payloads through. docs/rate-limits.md gives the design
// and the bounds on over-admission, including during partitions.
package ratelimit
