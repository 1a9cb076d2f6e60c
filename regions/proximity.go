package regions

import (
	"sync"
	"time"
)

// Proximity knows the round trip from the local Region to every other,
// preferring what was measured (gossip probes between Tier-2 instances)
// over what was configured, and the configuration over a default.
type Proximity struct {
	local      string
	configured map[string]time.Duration // Region → configured RTT from local
	defaultRTT time.Duration
	maxAge     time.Duration
	now        func() time.Time

	mu       sync.Mutex
	measured map[string]measurement
}

type measurement struct {
	rtt time.Duration
	at  time.Time
}

// RTTSource says where a round trip came from.
type RTTSource uint8

const (
	RTTDefault RTTSource = iota
	RTTConfigured
	RTTMeasured
)

func (s RTTSource) String() string {
	switch s {
	case RTTMeasured:
		return "measured"
	case RTTConfigured:
		return "configured"
	}
	return "default"
}

func newProximity(cfg *Config) *Proximity {
	p := &Proximity{
		local:      cfg.LocalRegion,
		configured: make(map[string]time.Duration),
		defaultRTT: cfg.DefaultRTT,
		maxAge:     cfg.MeasuredRTTMaxAge,
		now:        cfg.Now,
		measured:   make(map[string]measurement),
	}
	for _, r := range cfg.RTTs {
		switch p.local {
		case r.A:
			p.configured[r.B] = r.RTT
		case r.B:
			p.configured[r.A] = r.RTT
		}
	}
	return p
}

// Observe records one measured round trip from this Tier-2 to a member in
// region. Measurements of one Region are smoothed (gain 1/4), so one slow
// probe or one distant member moves the estimate only a little.
func (p *Proximity) Observe(region string, rtt time.Duration) {
	if region == "" || rtt < 0 {
		return
	}
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if m, ok := p.measured[region]; ok && now.Sub(m.at) <= p.maxAge {
		rtt = m.rtt + (rtt-m.rtt)/4
	}
	p.measured[region] = measurement{rtt, now}
}

// RTT returns the round trip from the local Region to region and where the
// figure came from.
func (p *Proximity) RTT(region string) (time.Duration, RTTSource) {
	p.mu.Lock()
	m, ok := p.measured[region]
	p.mu.Unlock()
	if ok && p.now().Sub(m.at) <= p.maxAge {
		return m.rtt, RTTMeasured
	}
	if rtt, ok := p.configured[region]; ok {
		return rtt, RTTConfigured
	}
	if region == p.local {
		return 0, RTTDefault
	}
	return p.defaultRTT, RTTDefault
}
