package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/trust"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/request"
	"github.com/meridian-router/meridian/tier1/gateway"
)

// With a Tier2Key, x-meridian-tenant and x-meridian-band are accepted only
// with a valid signature from a Tier-2: a caller that reaches Tier-1
// directly cannot claim another tenant's policy or a band.
func TestTenantHeadersMustBeSigned(t *testing.T) {
	key := bytes.Repeat([]byte("k"), 32)
	gw, eps, _ := newGateway(t, gateway.Config{Tier2Key: key}, "")
	load(gw, eps, map[string]int{"a": 0, "b": 0})
	now := time.Now()
	signed := func(tenant, band string, at time.Time) http.Header {
		h := header("x-meridian-tenant", tenant, "x-meridian-band", band)
		h.Set(trust.Header, trust.Sign(key, tenant, band, at))
		return h
	}
	forged := signed("docs", "Standard", now)
	forged.Set("x-meridian-band", "Critical") // signature over Standard
	other := header("x-meridian-tenant", "docs", "x-meridian-band", "Critical")
	other.Set(trust.Header, trust.Sign(bytes.Repeat([]byte("x"), 32), "docs", "Critical", now))
	cases := []struct {
		name string
		h    http.Header
		ok   bool
	}{
		{"signed", signed("docs", "Critical", now), true},
		{"no identity headers (GIE)", header("x-gateway-inference-objective", "-1"), true},
		{"unsigned tenant", header("x-meridian-tenant", "docs"), false},
		{"unsigned band", header("x-meridian-band", "Critical"), false},
		{"band changed after signing", forged, false},
		{"another key", other, false},
		{"stale signature", signed("docs", "Critical", now.Add(-trust.MaxAge-time.Minute)), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := gw.Route(context.Background(), body, gateway.Meta{Header: tc.h, Bytes: 100})
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				d.Release()
				return
			}
			var ae *request.APIError
			if !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized || ae.Code != "untrusted_identity" {
				t.Fatalf("Route = %v, want 401 untrusted_identity", err)
			}
			if _, err := gw.Decide(body, gateway.Meta{Header: tc.h}); !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
				t.Fatalf("Decide = %v, want 401", err)
			}
		})
	}
}

// With a Tier2Key, GIE's x-gateway-inference-objective without a signed
// identity may lower a request's band but not raise it: a caller that
// reaches Tier-1 directly cannot make itself Critical.
func TestUnsignedObjectiveCannotRaiseBand(t *testing.T) {
	key := bytes.Repeat([]byte("k"), 32)
	gw, _, _ := newGateway(t, gateway.Config{Tier2Key: key}, tenantsYAML) // payments may be Critical
	for _, tc := range []struct {
		objective string
		want      priority.Band
	}{{"100", priority.Standard}, {"0", priority.Standard}, {"-1", priority.Sheddable}} {
		_, band, err := gw.Band(header("x-gateway-inference-fairness-id", "payments", "x-gateway-inference-objective", tc.objective))
		if err != nil || band != tc.want {
			t.Errorf("objective %s: band %v, %v; want %v", tc.objective, band, err, tc.want)
		}
	}
	open, _, _ := newGateway(t, gateway.Config{}, tenantsYAML) // no Tier-2 in front: GIE's meaning
	if _, band, err := open.Band(header("x-gateway-inference-fairness-id", "payments", "x-gateway-inference-objective", "100")); err != nil || band != priority.Critical {
		t.Errorf("without a Tier2Key, objective 100: band %v, %v; want Critical", band, err)
	}
}
