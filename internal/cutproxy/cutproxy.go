// Package cutproxy is a TCP forwarder on loopback whose connections a
// test can cut at once, as a crashed or unreachable server would drop
// them, and restore later on the same address. The test kits of etcd
// (config/configtest) and Kubernetes (internal/kubetest) put their
// servers behind it. It decides nothing about what it carries.
package cutproxy

import (
	"io"
	"net"
	"sync"
)

// Proxy forwards every connection to its address on to To while up. Cut
// closes every connection at once; until Up, connections are closed as
// they arrive, as a down server's address would refuse them.
type Proxy struct {
	l      net.Listener
	mu     sync.Mutex
	to     string
	conns  map[net.Conn]bool // nil while cut
	accept sync.WaitGroup
	wg     sync.WaitGroup // forwarding goroutines (track)
}

// Listen binds a loopback port for a proxy to to, cut until Up.
func Listen(to string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{l: l, to: to}
	p.accept.Add(1)
	go func() {
		defer p.accept.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
	return p, nil
}

// Addr is the proxy's address (host:port), fixed for its life.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// SetTarget changes where new connections go.
func (p *Proxy) SetTarget(to string) {
	p.mu.Lock()
	p.to = to
	p.mu.Unlock()
}

// track records c for Cut, or closes it while the proxy is cut. With
// forwarding, it also counts a forwarding goroutine for Cut to wait for:
// counted under mu while not cut, so that no count is added once Cut has
// begun to wait.
func (p *Proxy) track(c net.Conn, forwarding bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		c.Close()
		return false
	}
	p.conns[c] = true
	if forwarding {
		p.wg.Add(1)
	}
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		if p.conns != nil {
			delete(p.conns, c)
		}
	}
}

// forward copies both ways between c and a connection to the target
// until either side ends, then closes both.
func (p *Proxy) forward(c net.Conn) {
	if !p.track(c, true) {
		return
	}
	defer p.wg.Done()
	p.mu.Lock()
	to := p.to
	p.mu.Unlock()
	s, err := net.Dial("tcp", to)
	if err != nil {
		p.untrack(c)
		return
	}
	if !p.track(s, false) {
		p.untrack(c)
		return
	}
	done := make(chan struct{}, 2)
	go func() { io.Copy(s, c); done <- struct{}{} }()
	go func() { io.Copy(c, s); done <- struct{}{} }()
	<-done
	p.untrack(c, s)
	<-done
}

// Up forwards connections from now on.
func (p *Proxy) Up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		p.conns = map[net.Conn]bool{}
	}
}

// Cut closes every connection, waits for the copies to end, and closes
// new connections until Up.
func (p *Proxy) Cut() {
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// Close stops accepting and cuts.
func (p *Proxy) Close() {
	p.l.Close()
	p.accept.Wait()
	p.Cut()
}
