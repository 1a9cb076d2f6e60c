package main

import "math"

// model is docs/scale.md's cost model for today's design, evaluated for
// one run's options. Bytes are per instance per second.
type model struct {
	// ReportBytes is one instance's rate-limit report per sync: 32 bytes
	// per active limit plus about 30 per part.
	ReportBytes float64 `json:"report_bytes"`
	// NeededInBytesPerS is what each instance must take in to hear every
	// peer's every report once: (N−1) × ReportBytes ÷ Δ.
	NeededInBytesPerS float64 `json:"needed_in_bytes_per_s"`
	// WantedOutBytesPerS is what the epidemic broadcast would send per
	// instance if memberlist sent every queued message its T times:
	// (N × ReportBytes ÷ Δ + P × N/R × 160 ÷ I) × T.
	WantedOutBytesPerS float64 `json:"wanted_out_bytes_per_s"`
	// GossipCapBytesPerS is what memberlist sends at most by gossip:
	// GossipNodes × 1,400-byte packets every GossipInterval.
	GossipCapBytesPerS float64 `json:"gossip_cap_bytes_per_s"`
	// PushPullBytesPerS is the full-state exchange: 2 × state ÷ the
	// scaled push/pull interval, state = N × L × 32 + P × 140.
	PushPullBytesPerS float64 `json:"push_pull_bytes_per_s"`
	PushPullInterval  float64 `json:"push_pull_interval_s"`
	// Retransmits is T = RetransmitMult × ⌈log10(N+1)⌉.
	Retransmits float64 `json:"retransmits"`
}

func costModel(o options, activeLimits int) model {
	n, l := float64(o.Instances), float64(activeLimits)
	pools := float64(o.Clusters * o.PoolsPer)
	const packet = 1400.0
	gossipEvery, fanout, pushPull := 0.2, 3.0, 30.0 // LAN
	switch o.Profile {
	case "local":
		gossipEvery, fanout, pushPull = 0.1, 3, 15
	case "wan":
		gossipEvery, fanout, pushPull = 0.5, 4, 60
	}
	// memberlist's pushPullScale: ×(⌈log2 n − log2 32⌉ + 1) above 32.
	if o.Instances > 32 {
		pushPull *= math.Ceil(math.Log2(n)-5) + 1
	}
	var m model
	parts := math.Max(1, math.Ceil(l*32/1300))
	m.ReportBytes = l*32 + 30*parts
	m.Retransmits = 6 * math.Ceil(math.Log10(n+1))
	dt := o.Sync.Seconds()
	m.NeededInBytesPerS = (n - 1) * m.ReportBytes / dt
	perRegion := n / float64(o.Regions)
	digests := pools * perRegion * 160 / o.DigestInterval.Seconds()
	m.WantedOutBytesPerS = (n*m.ReportBytes/dt + digests) * m.Retransmits
	m.GossipCapBytesPerS = fanout * packet / gossipEvery
	m.PushPullInterval = pushPull
	m.PushPullBytesPerS = 2 * (n*l*32 + pools*140) / pushPull
	return m
}
