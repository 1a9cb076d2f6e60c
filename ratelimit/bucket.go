package ratelimit

import (
	"math"
	"time"
)

// bucket is one instance's slice of a global limit: a token bucket that
// refills at rate units per second up to burst, and that may go into debt.
//
// It is not golang.org/x/time/rate.Limiter because Meridian needs three
// things that type does not do: return part of a charge or add to it after
// the fact (token reconciliation: a Reservation can only be cancelled
// whole), admit a request larger than the bucket (a small instance's slice
// of a tokens burst can be smaller than one prompt, and AllowN rejects any n
// above the burst forever), and keep the level when rate and burst are
// re-sliced ten times a second. Debt gives the last two for free: a request
// is admitted when the level covers min(n, burst), and the level then drops
// by n, possibly below zero, so the long-run rate stays exact.
//
// The caller serialises access (the tenant's mutex).
type bucket struct {
	rate  float64 // units per second
	burst float64 // units
	level float64 // units; negative is debt
	last  int64   // unix nanoseconds of the last advance
}

// advance refills the bucket up to now.
func (b *bucket) advance(now int64) {
	if now <= b.last {
		return
	}
	// Refill stops at burst; units taken up from peers above it stay.
	if b.level < b.burst {
		b.level = math.Min(b.level+b.rate*float64(now-b.last)/1e9, b.burst)
	}
	b.last = now
}

// need is the level at which a request of n units is admitted.
func (b *bucket) need(n float64) float64 {
	return math.Min(n, b.burst)
}

// fits reports whether n units may be taken now. Call advance first.
func (b *bucket) fits(n float64) bool {
	return b.level >= b.need(n)
}

// wait is how long until n units fit, assuming the rate holds.
func (b *bucket) wait(n float64) time.Duration {
	short := b.need(n) - b.level
	if short <= 0 {
		return 0
	}
	return rateDuration(short, b.rate)
}

// untilFull is how long until the bucket is full again: OpenAI's "reset".
func (b *bucket) untilFull() time.Duration {
	short := b.burst - b.level
	if short <= 0 {
		return 0
	}
	return rateDuration(short, b.rate)
}

// resize gives the bucket a new rate and burst, keeping its level (clipped
// to the new burst). Call advance first so the old rate applies up to now.
func (b *bucket) resize(rate, burst float64) {
	b.rate, b.burst = rate, burst
	if b.level > burst {
		b.level = burst
	}
}

func rateDuration(units, rate float64) time.Duration {
	if rate <= 0 {
		return math.MaxInt64
	}
	s := units / rate
	if s >= float64(math.MaxInt64)/1e9 {
		return math.MaxInt64
	}
	return time.Duration(math.Ceil(s * 1e9))
}
