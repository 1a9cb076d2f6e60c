package regions

import (
	"math"
	"time"
)

// admission says how cluster c takes part in a request at now (Unix ns).
// A cluster on its readmission ramp is given its share of requests by a
// golden-ratio sequence over its own counter: deterministic, and spread
// evenly instead of in runs.
func (c *cluster) admission(now int64, o *OutlierConfig) rank {
	until := c.ejectedUntil.Load()
	if until == 0 {
		return rankReady
	}
	if now < until {
		return rankEjected
	}
	share := readmitShare(now-until, o)
	if share >= 1 {
		return rankReady
	}
	k := c.probes.Add(1)
	if float64((k*0x9E3779B97F4A7C15)>>11)/(1<<53) < share {
		return rankReady
	}
	return rankProbation
}

// readmitShare is the share of requests a cluster gets elapsed ns after its
// ejection ended: ReadmitShare doubling every ReadmitStep.
func readmitShare(elapsed int64, o *OutlierConfig) float64 {
	if o.ReadmitStep <= 0 {
		return 1
	}
	steps := float64(elapsed) / float64(o.ReadmitStep)
	if steps >= 64 {
		return 1
	}
	return min(1, o.ReadmitShare*math.Exp2(steps))
}

// errorRate is the share of failed attempts this Tier-2 saw in the
// current outlier Interval, once MinRequests were seen; 0 before that.
func (c *cluster) errorRate(now time.Time, o *OutlierConfig) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Sub(c.windowStart) >= o.Interval || c.windowReqs < max(1, o.MinRequests) {
		return 0
	}
	return float64(c.windowFails) / float64(c.windowReqs)
}

// record counts one outcome and ejects the cluster when it crosses a
// threshold.
func (c *cluster) record(now time.Time, r Result, o *OutlierConfig) {
	if r == Overloaded {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Sub(c.windowStart) >= o.Interval {
		c.windowStart, c.windowReqs, c.windowFails = now, 0, 0
	}
	c.windowReqs++
	if r == Success {
		c.consecutive = 0
		return
	}
	c.windowFails++
	c.consecutive++

	ns := now.UnixNano()
	until := c.ejectedUntil.Load()
	if until != 0 && ns < until {
		return // requests sent before the ejection are still finishing
	}
	ramping := until != 0 && readmitShare(ns-until, o) < 1
	switch {
	case ramping,
		o.ConsecutiveFailures > 0 && c.consecutive >= o.ConsecutiveFailures,
		o.FailureRate > 0 && c.windowReqs >= o.MinRequests &&
			float64(c.windowFails) >= o.FailureRate*float64(c.windowReqs):
		c.eject(now, o)
	}
}

// eject takes the cluster out for BaseEjection × 2^(recent ejections),
// capped at MaxEjection.
func (c *cluster) eject(now time.Time, o *OutlierConfig) {
	if now.Sub(c.lastEjected) > o.EjectionMemory {
		c.ejections = 0
	}
	d := o.MaxEjection
	if c.ejections < 32 {
		d = min(o.MaxEjection, o.BaseEjection<<c.ejections)
		if d < o.BaseEjection { // overflow
			d = o.MaxEjection
		}
	}
	c.ejections++
	c.lastEjected = now
	c.consecutive = 0
	c.windowStart, c.windowReqs, c.windowFails = now, 0, 0
	c.ejectedUntil.Store(now.Add(d).UnixNano())
	c.ejectedTotal.Add(1)
}
