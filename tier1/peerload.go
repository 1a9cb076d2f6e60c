package tier1

import "sync"

// Peer load accounting. Each Tier-1 replica counts what it sent to an
// endpoint since that endpoint's last scrape, but between scrapes it does
// not see what the other replicas sent, so replicas herd onto the same
// idle pod. Replicas therefore tell each other their load per endpoint
// (with the prefix events, tier1/peers): their in-flight count and their
// prefill backlog.
//
// The two are kept alike (per replica, the latest report replacing the
// previous one, dropped when the replica goes away) and differ only in
// what a scrape does to them, as this replica's own figures do: an
// endpoint's load adds what the other replicas' in-flight counts grew by
// since its last scrape, the scrape having already seen what was there
// before it; but it adds their whole backlog, as it does its own, since no
// scraped metric sizes the prefill work queued ahead.

// PeerLoad is a replica's load on one endpoint, as it tells the other
// replicas (Endpoint.LoadReport) and as they apply it
// (Scheduler.ApplyPeerInFlight).
type PeerLoad struct {
	// InFlight is its requests sent there and not yet done.
	InFlight int64
	// Backlog is its prefill backlog there, in prompt tokens: the
	// uncached prompt tokens of those requests whose first token it has
	// not seen (the latency model's backlog feature).
	Backlog int64
}

// maxPeerLoad bounds each figure a peer reports. A peer is another
// replica, but a bad one must not overflow the sums: this is far beyond
// any real pod's load, and the sum over any plausible number of replicas
// stays far from int64 overflow and exact as a float64.
const maxPeerLoad = 1 << 30

func (l PeerLoad) clamped() PeerLoad {
	return PeerLoad{InFlight: min(max(l.InFlight, 0), maxPeerLoad), Backlog: min(max(l.Backlog, 0), maxPeerLoad)}
}

// peerCounts holds the last load each other replica reported for each
// endpoint of a pool.
type peerCounts struct {
	mu   sync.Mutex
	last map[peerKey]peerReport
}

type peerKey struct{ replica, endpoint string }

// peerReport is a replica's last report on an endpoint, with the Endpoint
// it was added to: one re-added under the same ID since (a new server)
// starts from nothing, and ForgetPeer takes the report out of the one that
// holds it.
type peerReport struct {
	ep *Endpoint
	PeerLoad
}

// ApplyPeerInFlight records another replica's load on the endpoint with
// this ID. Reports are absolute, so a lost or repeated one does no lasting
// harm; figures are clamped to [0, 2^30]. It reports false for an unknown
// endpoint. Meridian-mode decisions add, to an endpoint's waiting
// requests, how much the other replicas' in-flight counts there grew since
// its last scrape, and to its prefill backlog their backlogs.
func (s *Scheduler) ApplyPeerInFlight(replica, endpoint string, l PeerLoad) bool {
	return s.pool.applyPeerInFlight(replica, endpoint, l)
}

// ForgetPeer drops what a replica reported (it stopped or its stream
// ended); its requests no longer count anywhere.
func (p *Pool) ForgetPeer(replica string) {
	p.peers.mu.Lock()
	defer p.peers.mu.Unlock()
	for k, r := range p.peers.last {
		if k.replica != replica {
			continue
		}
		r.ep.addPeerLoad(PeerLoad{InFlight: -r.InFlight, Backlog: -r.Backlog})
		delete(p.peers.last, k)
	}
}

func (p *Pool) applyPeerInFlight(replica, endpoint string, l PeerLoad) bool {
	ep := p.Endpoint(endpoint)
	if ep == nil {
		return false
	}
	l = l.clamped()
	p.peers.mu.Lock()
	defer p.peers.mu.Unlock()
	if p.peers.last == nil {
		p.peers.last = map[peerKey]peerReport{}
	}
	k := peerKey{replica, endpoint}
	old := p.peers.last[k]
	if old.ep != ep {
		if old.ep != nil {
			old.ep.addPeerLoad(PeerLoad{InFlight: -old.InFlight, Backlog: -old.Backlog})
		}
		old = peerReport{ep: ep}
	}
	ep.addPeerLoad(PeerLoad{InFlight: l.InFlight - old.InFlight, Backlog: l.Backlog - old.Backlog})
	p.peers.last[k] = peerReport{ep, l}
	return true
}
