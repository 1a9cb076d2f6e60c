package priority

import (
	"fmt"
	"sync/atomic"

	"github.com/meridian-router/meridian/config"
)

// UnknownTenant is the metric label for tenants that have no Tenant object,
// so that unconfigured callers cannot grow label cardinality.
const UnknownTenant = "unknown"

// Tenants holds each tenant's highest band and fair-queueing weight. It is
// safe for concurrent use; Update swaps the whole table atomically, so a
// reload never shows a half-applied policy. One Tenants is shared by every
// Gate of a process and by the code that resolves a request's band. A nil
// *Tenants gives every tenant the defaults (MaxBand Standard, weight 1).
type Tenants struct {
	t       atomic.Pointer[map[string]tenantPolicy]
	metrics *Metrics
}

type tenantPolicy struct {
	maxBand Band
	weight  float64
}

// NewTenants builds the policy from a snapshot's tenants (keyed by name, as
// config.Snapshot.Tenants). Downgrades are counted in m when m is not nil.
func NewTenants(tenants map[string]*config.Tenant, m *Metrics) (*Tenants, error) {
	t := &Tenants{metrics: m}
	if err := t.Update(tenants); err != nil {
		return nil, err
	}
	return t, nil
}

// Update replaces the policy. On error the previous policy stays.
func (t *Tenants) Update(tenants map[string]*config.Tenant) error {
	next := make(map[string]tenantPolicy, len(tenants))
	for name, tn := range tenants {
		if tn == nil {
			return fmt.Errorf("priority: tenant %q is nil", name)
		}
		if tn.Metadata.Name != "" {
			name = tn.Metadata.Name
		}
		mb, err := ParseBand(tn.Spec.MaxBand)
		if err != nil {
			return fmt.Errorf("priority: tenant %q: spec.maxBand: %w", name, err)
		}
		w := tn.Spec.Weight
		switch {
		case w < 0:
			return fmt.Errorf("priority: tenant %q: spec.weight must be ≥ 0, got %v", name, w)
		case w == 0:
			w = 1
		}
		next[name] = tenantPolicy{maxBand: mb, weight: w}
	}
	t.t.Store(&next)
	return nil
}

func (t *Tenants) lookup(tenant string) (tenantPolicy, bool) {
	if t != nil {
		if m := t.t.Load(); m != nil {
			if p, ok := (*m)[tenant]; ok {
				return p, true
			}
		}
	}
	return tenantPolicy{maxBand: Standard, weight: 1}, false
}

// Band returns the band a tenant's request gets: its claim, lowered to the
// tenant's MaxBand. A lowered claim is counted in
// meridian_priority_downgrades_total; a claim is never trusted above what
// the tenant's policy allows.
func (t *Tenants) Band(tenant string, claimed Band) Band {
	p, known := t.lookup(tenant)
	if claimed <= p.maxBand {
		return claimed
	}
	if t != nil {
		label := tenant
		if !known {
			label = UnknownTenant
		}
		t.metrics.downgrade(label, claimed, p.maxBand)
	}
	return p.maxBand
}

// Weight returns the tenant's share in fair queueing (1 unless configured).
func (t *Tenants) Weight(tenant string) float64 {
	p, _ := t.lookup(tenant)
	return p.weight
}

// label returns the tenant's metric label.
func (t *Tenants) label(tenant string) string {
	if _, ok := t.lookup(tenant); ok {
		return tenant
	}
	return UnknownTenant
}
