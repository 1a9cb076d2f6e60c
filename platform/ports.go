package platform

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"

	"github.com/meridian-router/meridian/config"
)

// Port modes of the local platform (Config.Ports).
const (
	// PortsConfig listens where the configuration says, and moves a
	// listener whose port is taken to a free one.
	PortsConfig = "config"
	// PortsAuto moves every listener to a free port.
	PortsAuto = "auto"
)

// PortMove is one listen address the local platform moved.
type PortMove struct {
	What     string // "tier2/us-east-1", "tier1/us-east-1a", "health/…", "pod/…"
	From, To string
}

// upListeners lists the addresses the local platform listens on, from the
// configuration: every Region's first Tier-2, every cluster's Tier-1 and
// health feed, and every simulated pod. Gossip and metrics always take
// free ports (127.0.0.1:0), so they are not listed.
func upListeners(s *config.Snapshot, listen string) []PortMove {
	var out []PortMove
	for i, r := range s.Topology.Spec.Regions {
		switch {
		case i == 0 && listen != "":
			// --listen is the operator's choice: used as given.
		case len(r.Tier2) > 0:
			out = append(out, PortMove{What: "tier2/" + r.Name, From: r.Tier2[0]})
		}
		for _, c := range r.Clusters {
			if u, err := url.Parse(c.Tier1); err == nil && u.Host != "" {
				out = append(out, PortMove{What: "tier1/" + c.Name, From: u.Host})
			}
			if c.Health != "" {
				out = append(out, PortMove{What: "health/" + c.Name, From: c.Health})
			}
		}
	}
	for _, se := range s.StaticEndpoints {
		for _, ep := range se.Spec.Endpoints {
			out = append(out, PortMove{What: "pod/" + ep.Name, From: ep.Address})
		}
	}
	return out
}

// planPorts decides where each listener goes: in mode PortsAuto every one
// moves to a free port of the same host; in PortsConfig only those whose
// port cannot be bound now. The free ports are held until all are chosen,
// so no two listeners get the same one. It returns the moves made.
func planPorts(s *config.Snapshot, listen, mode string) ([]PortMove, error) {
	switch mode {
	case "", PortsConfig, PortsAuto:
	default:
		return nil, fmt.Errorf("up: --ports %q: want %s or %s", mode, PortsConfig, PortsAuto)
	}
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	var moves []PortMove
	seen := map[string]bool{}
	for _, l := range upListeners(s, listen) {
		if seen[l.From] {
			continue // one address named twice is one listener
		}
		seen[l.From] = true
		host, _, err := net.SplitHostPort(l.From)
		if err != nil {
			return nil, fmt.Errorf("up: %s: %w", l.What, err)
		}
		if mode != PortsAuto {
			ln, err := net.Listen("tcp", l.From)
			if err == nil {
				held = append(held, ln) // free: keep it from the next pick
				continue
			}
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("up: %s: no free port on %s: %w", l.What, host, err)
		}
		held = append(held, ln)
		l.To = ln.Addr().String()
		moves = append(moves, l)
	}
	return moves, nil
}

// moveDocs rewrites the Topology and StaticEndpoints documents so that
// every moved listener's address is its new one, keeping each document's
// canonical JSON in step.
func moveDocs(docs []config.Document, moves []PortMove) []config.Document {
	if len(moves) == 0 {
		return docs
	}
	to := make(map[string]string, len(moves))
	for _, m := range moves {
		to[m.From] = m.To
	}
	addr := func(a string) string {
		if n, ok := to[a]; ok {
			return n
		}
		return a
	}
	for i := range docs {
		switch v := docs[i].Value.(type) {
		case *config.Topology:
			for ri := range v.Spec.Regions {
				r := &v.Spec.Regions[ri]
				for j := range r.Tier2 {
					r.Tier2[j] = addr(r.Tier2[j])
				}
				for j := range r.Clusters {
					c := &r.Clusters[j]
					if u, err := url.Parse(c.Tier1); err == nil && u.Host != "" {
						u.Host = addr(u.Host)
						c.Tier1 = u.String()
					}
					if c.Health != "" {
						c.Health = addr(c.Health)
					}
				}
			}
		case *config.StaticEndpoints:
			for j := range v.Spec.Endpoints {
				v.Spec.Endpoints[j].Address = addr(v.Spec.Endpoints[j].Address)
			}
		default:
			continue
		}
		if b, err := json.Marshal(docs[i].Value); err == nil {
			docs[i].JSON = b
		}
	}
	return docs
}

// errNoTopology is returned for a configuration the local platform cannot run.
var errNoTopology = errors.New("up: the configuration has no Topology")
