package platform

import (
	"net/http"
	"net/url"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/tier2"
)

// delayTransport is the transport region's Tier-2 reaches the Tier-1s
// through: a request to a cluster of another Region waits d there and d
// back before it is sent, as it would across a real WAN; one to its own
// Region's clusters goes at once.
func delayTransport(region string, snap *config.Snapshot, d time.Duration) http.RoundTripper {
	far := map[string]bool{}
	for _, r := range snap.Topology.Spec.Regions {
		for _, c := range r.Clusters {
			if r.Name != region {
				if u, err := url.Parse(c.Tier1); err == nil {
					far[u.Host] = true
				}
			}
		}
	}
	return &delayed{inner: tier2.NewTransport(), far: far, d: d}
}

// delayed delays requests to the hosts in far by 2·d before the first byte.
type delayed struct {
	inner http.RoundTripper
	far   map[string]bool // host:port of another Region's Tier-1s
	d     time.Duration
}

func (t *delayed) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.far[r.URL.Host] && t.d > 0 {
		timer := time.NewTimer(2 * t.d) // there and back before the first byte
		select {
		case <-r.Context().Done():
			timer.Stop()
			return nil, r.Context().Err()
		case <-timer.C:
		}
	}
	return t.inner.RoundTrip(r)
}
