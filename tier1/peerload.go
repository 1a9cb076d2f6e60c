package tier1

import "sync"

// Peer in-flight accounting. Each Tier-1 replica counts what it sent to an
// endpoint since that endpoint's last scrape, but between scrapes it does
// not see what the other replicas sent, so replicas herd onto the same
// idle pod. Replicas therefore tell each other their in-flight count per
// endpoint (with the prefix events, tier1/peers); an endpoint's load adds
// what the other replicas' counts grew by since its own last scrape, the
// scrape having already seen what was there before it.

// peerCounts holds the last in-flight count each other replica reported
// for each endpoint of a pool.
type peerCounts struct {
	mu   sync.Mutex
	last map[peerKey]int64
}

type peerKey struct{ replica, endpoint string }

// ApplyPeerInFlight records that another replica has count requests in
// flight on the endpoint with this ID. Counts are absolute, so a lost or
// repeated report does no lasting harm. It reports false for an unknown
// endpoint. Meridian-mode decisions add, to an endpoint's waiting
// requests, how much the other replicas' counts there grew since its last
// scrape.
func (s *Scheduler) ApplyPeerInFlight(replica, endpoint string, count int64) bool {
	return s.pool.applyPeerInFlight(replica, endpoint, count)
}

// ForgetPeer drops what a replica reported (it stopped or its stream
// ended); its requests no longer count anywhere.
func (p *Pool) ForgetPeer(replica string) {
	p.peers.mu.Lock()
	defer p.peers.mu.Unlock()
	for k, n := range p.peers.last {
		if k.replica != replica {
			continue
		}
		if ep := p.Endpoint(k.endpoint); ep != nil {
			ep.peerInFlight.Add(-n)
		}
		delete(p.peers.last, k)
	}
}

func (p *Pool) applyPeerInFlight(replica, endpoint string, count int64) bool {
	ep := p.Endpoint(endpoint)
	if ep == nil {
		return false
	}
	count = max(count, 0)
	p.peers.mu.Lock()
	defer p.peers.mu.Unlock()
	if p.peers.last == nil {
		p.peers.last = map[peerKey]int64{}
	}
	k := peerKey{replica, endpoint}
	ep.peerInFlight.Add(count - p.peers.last[k])
	p.peers.last[k] = count
	return true
}
