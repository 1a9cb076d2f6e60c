package regions

import (
	"fmt"
	"math"
	"time"

	"github.com/meridian-router/meridian/config"
)

// Config configures a Fleet. Every zero field has a documented default, so
// Config{LocalRegion: "us-east-1", Clusters: ...} is complete.
type Config struct {
	// LocalRegion is the Region this Tier-2 runs in. Proximity is measured
	// from here. Required.
	LocalRegion string

	// Clusters lists every cluster requests may go to. A digest for a
	// cluster not listed here is kept (and gossiped on) but never chosen:
	// there is no address to send to. ClustersFromTopology builds this from
	// the config Topology.
	Clusters []Cluster

	// Weights are the operator's weights for each score; see Weights.
	Weights Weights

	// LoadFactor is 1+ε of consistent hashing with bounded loads: among the
	// clusters that are equally good for a request (see
	// Weights.PrefixAffinity), none is given more than LoadFactor times its
	// fair share (by ready pods) of this Tier-2's in-flight requests.
	// Closer to 1 balances tighter but moves more prefixes away from their
	// home cluster (fewer cache hits); Mirrokni et al. show that the number
	// of moves per arrival grows like 1/ε². Zero means 1.25; below 1 is an
	// error.
	LoadFactor float64

	// LoadFloor is the requests in flight per ready pod a cluster may
	// always hold before the load bound applies. With few requests in
	// flight the bound alone is harsh: with 1 request in flight over 4 equal
	// clusters, ⌈1.25 × 2 / 4⌉ = 1 would send a second request with the same
	// prefix elsewhere although every cluster is idle. A model server batches
	// dozens of requests per pod, so a floor of one per pod costs no
	// balance that matters. Zero means 1; negative means no floor (the
	// bound of the paper, exactly).
	LoadFloor float64

	// VirtualNodes is how many points each cluster has on the hash ring.
	// More spreads prefixes more evenly over clusters at the cost of memory
	// (16 bytes each) and a longer ring to search. Zero means 64.
	VirtualNodes int

	// MaxTargets caps Select's list: the primary plus fallbacks for
	// failover. Zero means 3.
	MaxTargets int

	// QueueScale is the waiting requests per ready pod at which the
	// queueDepth score halves: score = 1 / (1 + perPod/QueueScale). Zero
	// means 4.
	QueueScale float64

	// ProximityScale is the round trip at which the regionProximity score
	// halves: score = 1 / (1 + rtt/ProximityScale). Zero means 50 ms.
	ProximityScale time.Duration

	// ErrorRateCeiling is the error rate at which the errorRate score
	// reaches 0, falling linearly from 1 at no errors. Zero means 0.25.
	ErrorRateCeiling float64

	// DigestMaxAge is how long after it arrived a digest is used. Older
	// digests are ignored, never gossiped and dropped by Sweep; a cluster
	// with no fresh digest for a model is not a candidate for it. It must
	// exceed the feed interval plus gossip delay (clock skew between
	// instances does not count: age is measured on the receiver's clock,
	// see MaxClockSkew). Shorter reacts faster to a silent cluster; longer
	// tolerates a slow feed or a CPU-starved producer. Zero means 5 s.
	DigestMaxAge time.Duration

	// RTTs are configured round trips between Regions, used until one is
	// measured (and when measurements go stale). A pair applies in both
	// directions.
	RTTs []RegionRTT

	// DefaultRTT is the round trip assumed to a Region with neither a
	// measurement nor a configured value. Zero means 100 ms. The local
	// Region is 0 unless measured or configured.
	DefaultRTT time.Duration

	// MeasuredRTTMaxAge is how long a measured round trip stays valid
	// without a new measurement. Zero means 2 min.
	MeasuredRTTMaxAge time.Duration

	// Outlier configures per-cluster failure ejection.
	Outlier OutlierConfig

	// Retry configures the retry budget.
	Retry RetryConfig

	// Now is the clock. Nil means time.Now.
	Now func() time.Time
}

// Cluster is one Tier-1 deployment requests can be sent to.
type Cluster struct {
	Region string
	Name   string
	// Tier1 is the base URL of the cluster's Tier-1 (http://host:port).
	Tier1 string
}

// RegionRTT is a configured round trip between two Regions.
type RegionRTT struct {
	A, B string
	RTT  time.Duration
}

// Weights are the operator's weights for cluster choice, named like those of
// AWS's global inference tier. Each score is in [0, 1]; a cluster's score is
// Σ weight × score / Σ weights. All zero means the defaults
// (DefaultWeights); to turn one score off, set the others.
type Weights struct {
	// KVHeadroom scores free KV cache: 1 − mean KV use over ready pods.
	KVHeadroom float64
	// QueueDepth scores short queues: 1 / (1 + waiting per pod / QueueScale).
	QueueDepth float64
	// RegionProximity scores near Regions: 1 / (1 + rtt / ProximityScale).
	RegionProximity float64
	// ErrorRate scores clean clusters: 1 − errors / ErrorRateCeiling, from
	// the worse of Tier-1's reported rate and this Tier-2's own over the
	// current outlier Interval (counted once MinRequests were seen, and
	// applied when the next digest arrives).
	ErrorRate float64
	// PrefixAffinity is how much score (in the same units as the others) a
	// cluster may give up to serve a prompt prefix it is home to: clusters
	// within PrefixAffinity / Σ weights of the best are equally good, and
	// among them the prefix's home is chosen by consistent hashing with
	// bounded loads. Zero turns prefix affinity off: the best cluster wins,
	// spread by load among exact ties.
	PrefixAffinity float64
}

// DefaultWeights favours proximity and cleanliness over load, with load
// still able to send traffic to another Region when the near one queues.
func DefaultWeights() Weights {
	return Weights{KVHeadroom: 1, QueueDepth: 1, RegionProximity: 2, ErrorRate: 2, PrefixAffinity: 0.5}
}

func (w Weights) sum() float64 { return w.KVHeadroom + w.QueueDepth + w.RegionProximity + w.ErrorRate }

// OutlierConfig configures ejection of failing clusters (the shape of
// Envoy's outlier detection) and their gradual return.
type OutlierConfig struct {
	// ConsecutiveFailures ejects a cluster after this many failures in a
	// row (connect errors, timeouts, 5xx). Zero means 5; negative disables.
	ConsecutiveFailures int
	// FailureRate ejects a cluster whose share of failed requests within
	// one Interval reaches this, once MinRequests have been seen. Zero
	// means 0.5; negative disables.
	FailureRate float64
	// MinRequests is the sample needed before FailureRate applies. Zero
	// means 20.
	MinRequests int
	// Interval is the window FailureRate is computed over. Zero means 10 s.
	Interval time.Duration
	// BaseEjection is the first ejection's length; each further ejection
	// within EjectionMemory doubles it, up to MaxEjection. Zero means 2 s.
	BaseEjection time.Duration
	// MaxEjection caps an ejection's length. Zero means 2 min.
	MaxEjection time.Duration
	// EjectionMemory is how long a cluster must go without an ejection for
	// its backoff to reset. Zero means 5 min.
	EjectionMemory time.Duration
	// ReadmitShare is the share of requests a cluster gets as a candidate
	// when its ejection ends; it doubles every ReadmitStep until the cluster
	// takes its full share. A failure during the ramp ejects again at
	// once. Zero means 0.1.
	ReadmitShare float64
	// ReadmitStep is how long each doubling of the readmitted share waits.
	// Zero means 1 s (full traffic about 3.3 s after readmission at the
	// default share).
	ReadmitStep time.Duration
}

// RetryConfig configures the retry budget: retries may add at most Ratio of
// the requests seen over Window, plus MinRetries per Window so a quiet
// Tier-2 can still fail over.
type RetryConfig struct {
	// Ratio is the allowed retries per request. Zero means 0.2.
	Ratio float64
	// Window is the period counted. Zero means 10 s.
	Window time.Duration
	// MinRetries is allowed per Window whatever the traffic. Zero means 3;
	// negative means none.
	MinRetries int
}

func (c *Config) withDefaults() (Config, error) {
	d := *c
	if d.LocalRegion == "" {
		return d, fmt.Errorf("regions: config: localRegion is required")
	}
	if d.Weights == (Weights{}) {
		d.Weights = DefaultWeights()
	}
	for _, w := range []float64{d.Weights.KVHeadroom, d.Weights.QueueDepth, d.Weights.RegionProximity, d.Weights.ErrorRate, d.Weights.PrefixAffinity} {
		if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			return d, fmt.Errorf("regions: config: weights: %v: want a finite weight ≥ 0", w)
		}
	}
	if d.LoadFactor == 0 {
		d.LoadFactor = 1.25
	}
	if !(d.LoadFactor >= 1) || math.IsInf(d.LoadFactor, 0) {
		return d, fmt.Errorf("regions: config: loadFactor %v: want 1+ε ≥ 1", d.LoadFactor)
	}
	setFloat(&d.LoadFloor, 1)
	setInt(&d.VirtualNodes, 64)
	setInt(&d.MaxTargets, 3)
	setFloat(&d.QueueScale, 4)
	setDur(&d.ProximityScale, 50*time.Millisecond)
	setFloat(&d.ErrorRateCeiling, 0.25)
	setDur(&d.DigestMaxAge, 5*time.Second)
	setDur(&d.DefaultRTT, 100*time.Millisecond)
	setDur(&d.MeasuredRTTMaxAge, 2*time.Minute)
	o := &d.Outlier
	setInt(&o.ConsecutiveFailures, 5)
	setFloat(&o.FailureRate, 0.5)
	setInt(&o.MinRequests, 20)
	setDur(&o.Interval, 10*time.Second)
	setDur(&o.BaseEjection, 2*time.Second)
	setDur(&o.MaxEjection, 2*time.Minute)
	setDur(&o.EjectionMemory, 5*time.Minute)
	setFloat(&o.ReadmitShare, 0.1)
	setDur(&o.ReadmitStep, time.Second)
	r := &d.Retry
	setFloat(&r.Ratio, 0.2)
	setDur(&r.Window, 10*time.Second)
	setInt(&r.MinRetries, 3)
	if d.Now == nil {
		d.Now = time.Now
	}
	switch {
	case d.VirtualNodes < 0 || d.VirtualNodes > 4096:
		return d, fmt.Errorf("regions: config: virtualNodes %d: want 1 to 4096", d.VirtualNodes)
	case d.MaxTargets < 0:
		return d, fmt.Errorf("regions: config: maxTargets %d: want ≥ 1", d.MaxTargets)
	case d.QueueScale < 0, d.ErrorRateCeiling < 0, d.ProximityScale < 0, d.DigestMaxAge < 0, d.DefaultRTT < 0:
		return d, fmt.Errorf("regions: config: queueScale, errorRateCeiling, proximityScale, digestMaxAge and defaultRTT must not be negative")
	case o.ReadmitShare > 1 || o.ReadmitShare < 0:
		return d, fmt.Errorf("regions: config: outlier.readmitShare %v: want a fraction in (0, 1]", o.ReadmitShare)
	case o.BaseEjection < 0 || o.MaxEjection < o.BaseEjection:
		return d, fmt.Errorf("regions: config: outlier: maxEjection %v must be at least baseEjection %v", o.MaxEjection, o.BaseEjection)
	case r.Ratio < 0 || r.Window < 0:
		return d, fmt.Errorf("regions: config: retry: ratio and window must not be negative")
	}
	seen := make(map[[2]string]bool, len(d.Clusters))
	for i, c := range d.Clusters {
		if c.Region == "" || c.Name == "" {
			return d, fmt.Errorf("regions: config: clusters[%d]: region and name are required", i)
		}
		k := [2]string{c.Region, c.Name}
		if seen[k] {
			return d, fmt.Errorf("regions: config: clusters[%d]: %s/%s listed twice", i, c.Region, c.Name)
		}
		seen[k] = true
	}
	for i, r := range d.RTTs {
		if r.A == "" || r.B == "" || r.RTT < 0 {
			return d, fmt.Errorf("regions: config: rtts[%d]: want two Regions and a round trip ≥ 0", i)
		}
	}
	return d, nil
}

func setInt(p *int, def int) {
	if *p == 0 {
		*p = def
	}
}

func setFloat(p *float64, def float64) {
	if *p == 0 {
		*p = def
	}
}

func setDur(p *time.Duration, def time.Duration) {
	if *p == 0 {
		*p = def
	}
}

// ClustersFromTopology lists the clusters of a config Topology.
func ClustersFromTopology(t *config.Topology) []Cluster {
	if t == nil {
		return nil
	}
	var out []Cluster
	for _, r := range t.Spec.Regions {
		for _, c := range r.Clusters {
			out = append(out, Cluster{Region: r.Name, Name: c.Name, Tier1: c.Tier1})
		}
	}
	return out
}
