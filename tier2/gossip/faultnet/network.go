// Package faultnet is a memberlist transport that injects network faults
// into real gossip nodes on loopback: per-packet delay, random loss and partitions between named
// nodes or whole Regions. Every node keeps a real memberlist NetTransport
// (UDP and TCP on 127.0.0.1); the faults are applied by a wrapper on the
// sending side, so all nodes of a test must share one Network.
//
// meridian up runs on it (several Regions on loopback with a delay between
// them), and so do the tests of the packages that build on tier2/gossip
// (regions, ratelimit, tier2).
package faultnet

import (
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/meridian-router/meridian/tier2/gossip"
)

// ErrPartitioned is returned when a stream is dialled across a partition.
var ErrPartitioned = errors.New("faultnet: partitioned")

// Selector picks a set of nodes: one by name, all of a Region, or the
// complement of either.
type Selector struct {
	node, region string
	not          bool
}

// Node selects the node with this name.
func Node(name string) Selector { return Selector{node: name} }

// Region selects every node of a Region.
func Region(name string) Selector { return Selector{region: name} }

// Not selects every node s does not.
func Not(s Selector) Selector { s.not = !s.not; return s }

func (s Selector) matches(e endpoint) bool {
	var in bool
	if s.node != "" {
		in = e.name == s.node
	} else {
		in = e.region == s.region
	}
	return in != s.not
}

func (s Selector) String() string {
	var v string
	if s.node != "" {
		v = "node " + s.node
	} else {
		v = "region " + s.region
	}
	if s.not {
		v = "not " + v
	}
	return v
}

type endpoint struct{ name, region string }

type rule struct {
	a, b  Selector
	delay time.Duration
	drop  float64
	cut   bool
}

func (r rule) matches(src, dst endpoint) bool {
	return (r.a.matches(src) && r.b.matches(dst)) || (r.a.matches(dst) && r.b.matches(src))
}

// Network is a set of loopback transports whose traffic obeys shared fault
// rules. The zero value is not usable; call NewNetwork.
type Network struct {
	mu     sync.RWMutex
	byAddr map[string]endpoint
	rules  []rule

	rngMu sync.Mutex
	rng   *rand.Rand

	dropped atomic.Uint64
	delayed atomic.Uint64
}

// NewNetwork returns an empty network with no faults.
func NewNetwork() *Network {
	return &Network{byAddr: make(map[string]endpoint), rng: rand.New(rand.NewPCG(1, 2))}
}

// Delay adds d to every packet and stream dial between a and b, in both
// directions (so a probe's round trip grows by 2d). The longest matching
// delay applies.
func (n *Network) Delay(a, b Selector, d time.Duration) { n.add(rule{a: a, b: b, delay: d}) }

// Drop loses this fraction (0..1) of packets between a and b, in both
// directions. Streams are not affected.
func (n *Network) Drop(a, b Selector, fraction float64) { n.add(rule{a: a, b: b, drop: fraction}) }

// Partition cuts a from b: packets are lost and stream dials fail, in both
// directions, until Heal.
func (n *Network) Partition(a, b Selector) { n.add(rule{a: a, b: b, cut: true}) }

// Heal removes every partition and drop rule; delays stay.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	kept := n.rules[:0]
	for _, r := range n.rules {
		if !r.cut && r.drop == 0 {
			kept = append(kept, r)
		}
	}
	n.rules = kept
}

// Dropped counts packets lost to Drop and Partition rules so far.
func (n *Network) Dropped() uint64 { return n.dropped.Load() }

// Delayed counts packets held back by Delay rules so far.
func (n *Network) Delayed() uint64 { return n.delayed.Load() }

func (n *Network) add(r rule) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.rules = append(n.rules, r)
}

// verdict is what happens to one packet or dial from src to addr.
func (n *Network) verdict(src endpoint, addr string) (cut bool, delay time.Duration) {
	n.mu.RLock()
	dst, known := n.byAddr[addr]
	if !known {
		n.mu.RUnlock()
		return false, 0
	}
	var drop float64
	for _, r := range n.rules {
		if !r.matches(src, dst) {
			continue
		}
		cut = cut || r.cut
		drop = max(drop, r.drop)
		delay = max(delay, r.delay)
	}
	n.mu.RUnlock()
	if !cut && drop > 0 {
		n.rngMu.Lock()
		cut = n.rng.Float64() < drop
		n.rngMu.Unlock()
	}
	return cut, delay
}

// Transport binds a memberlist NetTransport on 127.0.0.1 with a free port
// and wraps it with this network's faults. name and region must be those of
// the gossip node that will use it.
func (n *Network) Transport(name, region string) (*Transport, error) {
	inner, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{"127.0.0.1"},
		BindPort:  0,
		Logger:    log.New(io.Discard, "", 0),
	})
	if err != nil {
		return nil, fmt.Errorf("faultnet: transport for %s: %w", name, err)
	}
	t := &Transport{net: n, inner: inner, self: endpoint{name, region}}
	addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(inner.GetAutoBindPort()))
	n.mu.Lock()
	n.byAddr[addr] = t.self
	n.mu.Unlock()
	return t, nil
}

// TB is the part of testing.TB that Start uses. It is declared here so
// that programs using Network outside tests (meridian up's loopback
// Regions) do not link package testing.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// Start starts one gossip node per config on this network and closes them
// when the test ends. Each config needs Name and Region; Transport is set
// here, an empty Profile means local timings (with a 10 s StreamTimeout,
// for loaded test machines), and an empty Join means the
// first node's address (the first node starts the cluster).
func (n *Network) Start(tb TB, cfgs ...gossip.Config) []*gossip.Node {
	tb.Helper()
	nodes := make([]*gossip.Node, 0, len(cfgs))
	for i, cfg := range cfgs {
		t, err := n.Transport(cfg.Name, cfg.Region)
		if err != nil {
			tb.Fatal(err)
		}
		cfg.Transport = t
		if cfg.Profile == "" {
			cfg.Profile = gossip.ProfileLocal
			// Local timings, but patient with a loaded test machine: a
			// join that times out fails the test, a slow probe only
			// raises a suspicion.
			if cfg.StreamTimeout == 0 {
				cfg.StreamTimeout = 10 * time.Second
			}
		}
		if cfg.Join == nil && i > 0 {
			cfg.Join = []string{nodes[0].Addr()}
		}
		node, err := gossip.New(cfg)
		if err != nil {
			_ = t.Shutdown()
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = node.Close() })
		nodes = append(nodes, node)
	}
	return nodes
}

// Transport is one node's memberlist transport on a Network.
type Transport struct {
	net   *Network
	inner *memberlist.NetTransport
	self  endpoint
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// FinalAdvertiseAddr implements memberlist.Transport.
func (t *Transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.inner.FinalAdvertiseAddr(ip, port)
}

// WriteTo implements memberlist.Transport.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	cut, delay := t.net.verdict(t.self, a.Addr)
	switch {
	case cut:
		t.net.dropped.Add(1)
		return time.Now(), nil // lost on the wire: the sender cannot tell
	case delay > 0:
		t.net.delayed.Add(1)
		cp := append([]byte(nil), b...)
		time.AfterFunc(delay, func() { _, _ = t.inner.WriteToAddress(cp, a) })
		return time.Now(), nil
	}
	return t.inner.WriteToAddress(b, a)
}

// PacketCh implements memberlist.Transport.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.inner.PacketCh() }

// DialTimeout implements memberlist.Transport.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport. A delayed
// link costs one round trip before the connection is handed over.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	cut, delay := t.net.verdict(t.self, a.Addr)
	if cut {
		return nil, fmt.Errorf("faultnet: dial %s from %s: %w", a.Addr, t.self.name, ErrPartitioned)
	}
	if delay > 0 {
		if 2*delay >= timeout {
			return nil, fmt.Errorf("faultnet: dial %s from %s: round trip %v exceeds timeout %v", a.Addr, t.self.name, 2*delay, timeout)
		}
		time.Sleep(2 * delay) // emulated latency, not synchronisation
	}
	c, err := t.inner.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, t: t, addr: a.Addr}, nil
}

// StreamCh implements memberlist.Transport.
func (t *Transport) StreamCh() <-chan net.Conn { return t.inner.StreamCh() }

// Shutdown implements memberlist.Transport.
func (t *Transport) Shutdown() error { return t.inner.Shutdown() }

// conn fails reads and writes once a partition separates its ends.
type conn struct {
	net.Conn
	t    *Transport
	addr string
}

func (c *conn) check() error {
	n := c.t.net
	n.mu.RLock()
	dst, known := n.byAddr[c.addr]
	var cut bool
	for _, r := range n.rules {
		if known && r.cut && r.matches(c.t.self, dst) {
			cut = true
		}
	}
	n.mu.RUnlock()
	if cut {
		return fmt.Errorf("faultnet: stream %s → %s: %w", c.t.self.name, c.addr, ErrPartitioned)
	}
	return nil
}

func (c *conn) Read(b []byte) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *conn) Write(b []byte) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}
