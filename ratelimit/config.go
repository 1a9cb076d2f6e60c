package ratelimit

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config tunes one Limiter. The zero value of each field means the default
// named in its comment; DefaultConfig returns them all filled in.
type Config struct {
	// Instance names this Limiter among its peers. It must be unique in
	// the gossip cluster and stable for the life of the process; the
	// memberlist node name is a good choice. Required.
	Instance string

	// SyncInterval is how often the Limiter folds its measured demand into
	// an estimate, recomputes its shares and publishes its state. Shorter
	// intervals converge faster after a shift at the cost of more gossip
	// traffic (one payload of about 12 bytes per active limit per
	// interval). Zero means 100ms.
	SyncInterval time.Duration

	// DemandTimeConstant is the time constant τ of the exponentially
	// weighted moving average of demand (units attempted per second). A
	// step in demand is 95% reflected after 3τ. Shorter is faster to
	// re-converge but noisier for low-rate tenants. Zero means 300ms.
	DemandTimeConstant time.Duration

	// PeerTimeout is how long a peer that has stopped reporting keeps its
	// share. While it is held, a partitioned side keeps serving with the
	// share it had and the global total stays at the limit; once it
	// expires, each side of a partition takes the whole limit (see
	// docs/rate-limits.md for the bound). A peer that leaves cleanly sends
	// a tombstone and releases its share at once, so this only matters for
	// crashes and partitions: longer strands a crashed instance's share
	// longer, shorter lets partitions over-admit sooner. Zero means 30s.
	PeerTimeout time.Duration

	// StaleAfter is how long a peer may stay silent before its share is
	// held fixed at what it was, rather than following its last reported
	// demand. Held shares are what keep a partition from over-admitting
	// when demand grows on one side; holding too early only delays a
	// peer's share following its demand until its next report arrives.
	// It should exceed a few SyncIntervals plus the gossip delay. Zero
	// means 1s.
	StaleAfter time.Duration

	// MinShare is the weight floor, as a fraction of the limit's rate,
	// that every live instance is counted with when shares are divided:
	// an instance with no demand still holds about MinShare of the limit,
	// so its first requests pass before the next sync. Capacity held this
	// way by idle instances is the only capacity that does not flow to
	// busy ones. Zero means 0.002; must be below 1.
	MinShare float64

	// InitialShare is the share a new Limiter assumes for every limit
	// until it hears from a peer or Warmup passes, so that a restarting
	// instance does not briefly believe it owns the whole limit. Zero
	// means 0.05.
	InitialShare float64

	// Warmup is how long a Limiter that has heard from no peer waits
	// before concluding it is alone and taking whole limits. Zero means
	// 2s (several memberlist push/pull rounds on a LAN).
	Warmup time.Duration

	// MaxPayload is the largest payload, in bytes, that the transport
	// takes in one broadcast (gossip.Node.MaxPayload). A report that does
	// not fit is split into parts, each sent on its own; each active limit
	// costs 32 bytes. Zero means no limit: one payload per sync.
	MaxPayload int

	// Now is the clock. Nil means time.Now. Tests inject a fake clock.
	Now func() time.Time

	// Registerer receives the Limiter's metrics. Nil means the metrics are
	// kept but not registered.
	Registerer prometheus.Registerer
}

// DefaultConfig returns the defaults for a Limiter named instance.
func DefaultConfig(instance string) Config {
	return Config{
		Instance:           instance,
		SyncInterval:       100 * time.Millisecond,
		DemandTimeConstant: 300 * time.Millisecond,
		PeerTimeout:        30 * time.Second,
		StaleAfter:         time.Second,
		MinShare:           0.002,
		InitialShare:       0.05,
		Warmup:             2 * time.Second,
		Now:                time.Now,
	}
}

// withDefaults fills zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig(c.Instance)
	if c.Instance == "" {
		return c, errors.New("ratelimit: config: instance: required")
	}
	// A zero field takes its default.
	c.SyncInterval = cmp.Or(c.SyncInterval, d.SyncInterval)
	c.DemandTimeConstant = cmp.Or(c.DemandTimeConstant, d.DemandTimeConstant)
	c.PeerTimeout = cmp.Or(c.PeerTimeout, d.PeerTimeout)
	c.StaleAfter = cmp.Or(c.StaleAfter, d.StaleAfter)
	c.MinShare = cmp.Or(c.MinShare, d.MinShare)
	c.InitialShare = cmp.Or(c.InitialShare, d.InitialShare)
	c.Warmup = cmp.Or(c.Warmup, d.Warmup)
	if c.Now == nil {
		c.Now = d.Now
	}
	switch {
	case c.SyncInterval < 0:
		return c, fmt.Errorf("ratelimit: config: syncInterval: %v is negative", c.SyncInterval)
	case c.DemandTimeConstant < 0:
		return c, fmt.Errorf("ratelimit: config: demandTimeConstant: %v is negative", c.DemandTimeConstant)
	case c.PeerTimeout < 0:
		return c, fmt.Errorf("ratelimit: config: peerTimeout: %v is negative", c.PeerTimeout)
	case c.StaleAfter < 0:
		return c, fmt.Errorf("ratelimit: config: staleAfter: %v is negative", c.StaleAfter)
	case c.MaxPayload < 0:
		return c, fmt.Errorf("ratelimit: config: maxPayload: %d is negative", c.MaxPayload)
	case c.MaxPayload > 0 && c.MaxPayload < 64+len(c.Instance):
		return c, fmt.Errorf("ratelimit: config: maxPayload: %d bytes cannot hold one limit's report", c.MaxPayload)
	case c.Warmup < 0:
		return c, fmt.Errorf("ratelimit: config: warmup: %v is negative", c.Warmup)
	case c.MinShare < 0 || c.MinShare >= 1:
		return c, fmt.Errorf("ratelimit: config: minShare: %v is outside [0, 1)", c.MinShare)
	case c.InitialShare < 0 || c.InitialShare > 1:
		return c, fmt.Errorf("ratelimit: config: initialShare: %v is outside [0, 1]", c.InitialShare)
	}
	return c, nil
}
