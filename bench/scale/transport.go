package main

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/meridian-router/meridian/tier2/gossip/faultnet"
)

// meter counts one instance's gossip traffic: packets (gossip, probes)
// and stream bytes (joins, push/pull), both ways.
type meter struct {
	bytesOut, bytesIn atomic.Uint64
	pktsOut, pktsIn   atomic.Uint64
}

// meters finds an instance's meter by its gossip address. Every count is
// taken on the sending or dialling side, so "in" includes what the fault
// rules then dropped on the way (at most the configured loss).
type meters struct {
	mu     sync.RWMutex
	byAddr map[string]*meter
}

func (ms *meters) add(addr string, m *meter) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.byAddr[addr] = m
}

func (ms *meters) get(addr string) *meter {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	return ms.byAddr[addr]
}

// meteredTransport is faultnet's transport with every byte counted.
type meteredTransport struct {
	*faultnet.Transport
	self *meter
	all  *meters
}

var _ memberlist.NodeAwareTransport = (*meteredTransport)(nil)

func (t *meteredTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *meteredTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	t.self.bytesOut.Add(uint64(len(b)))
	t.self.pktsOut.Add(1)
	if m := t.all.get(a.Addr); m != nil {
		m.bytesIn.Add(uint64(len(b)))
		m.pktsIn.Add(1)
	}
	return t.Transport.WriteToAddress(b, a)
}

func (t *meteredTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *meteredTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := t.Transport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	peer := t.all.get(a.Addr)
	if peer == nil {
		peer = &meter{}
	}
	return &meteredConn{Conn: c, self: t.self, peer: peer}, nil
}

// meteredConn counts a stream from its dialling side, for both ends.
type meteredConn struct {
	net.Conn
	self, peer *meter
}

func (c *meteredConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.self.bytesIn.Add(uint64(n))
	c.peer.bytesOut.Add(uint64(n))
	return n, err
}

func (c *meteredConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.self.bytesOut.Add(uint64(n))
	c.peer.bytesIn.Add(uint64(n))
	return n, err
}
