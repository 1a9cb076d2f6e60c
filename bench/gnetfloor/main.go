// Command gnetfloor is a lower bound for a Go front door built on an event
// loop instead of a goroutine per connection: panjf2000/gnet's epoll loops,
// one per core, as nginx's workers are. Each caller connection is paired
// with its own keep-alive connection to Tier-1, registered on the same
// loop, so bytes move between the two without crossing goroutines. It reads
// each request's headers for its length (and answers /healthz itself), then
// passes the request on as it arrives and the response back untouched: no response
// parsing, authentication, limits or routing. What it costs is less than
// any front door that does a front door's work on the same loops. It lives
// in its own module so that the main module does not depend on gnet.
//
//	go build -o /tmp/gnetfloor .      (from bench/gnetfloor)
//	go run ./bench/latency --meridian /tmp/meridian --gnetfloor /tmp/gnetfloor -paths tier2,gnetfloor,nginx
package main

import (
	"bytes"
	"context"
	"flag"
	"log"
	"net"
	"strconv"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// pair is a caller's connection and its upstream connection, which lives
// on the same event loop. pending holds what the caller sent before the
// upstream connection was up.
type pair struct {
	client, up gnet.Conn
	pending    []byte
	body       int // bytes of the current request's body still to pass on
	closed     bool
}

type floor struct {
	gnet.BuiltinEventEngine
	upstream net.Addr
}

var healthz = []byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

func (f *floor) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	if p, ok := c.Context().(*pair); ok { // an upstream connection, registered below
		if p.closed {
			return nil, gnet.Close
		}
		p.up = c
		if len(p.pending) > 0 {
			c.Write(p.pending)
			p.pending = nil
		}
		return nil, gnet.None
	}
	p := &pair{client: c}
	c.SetContext(p)
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	done, err := c.EventLoop().Register(gnet.NewContext(ctx, p), f.upstream)
	if err != nil {
		cancel()
		return nil, gnet.Close
	}
	go func() { // a failed or slow dial ends the caller's connection
		defer cancel()
		select {
		case r := <-done:
			if r.Err != nil {
				c.Close()
			}
		case <-ctx.Done():
			c.Close()
		}
	}()
	return nil, gnet.None
}

const (
	dialTimeout = 5 * time.Second
	// maxPending bounds what a caller may send before its upstream
	// connection is up.
	maxPending = 16 << 20
)

func (f *floor) OnClose(c gnet.Conn, _ error) gnet.Action {
	p, ok := c.Context().(*pair)
	if !ok {
		return gnet.None
	}
	p.closed = true
	if c == p.client && p.up != nil {
		p.up.Close()
	} else if c == p.up {
		p.client.Close()
	}
	return gnet.None
}

func (f *floor) OnTraffic(c gnet.Conn) gnet.Action {
	p := c.Context().(*pair)
	if c == p.up { // the response, passed back as it comes
		b, _ := c.Next(-1)
		p.client.Write(b)
		return gnet.None
	}
	for c.InboundBuffered() > 0 {
		if p.body > 0 { // the rest of a body, passed on as it arrives
			b, _ := c.Next(min(p.body, c.InboundBuffered()))
			p.body -= len(b)
			p.send(b)
			continue
		}
		b, _ := c.Peek(-1)
		head, body, health := request(b)
		if head < 0 {
			return gnet.Close
		}
		if head == 0 {
			return gnet.None // wait for the rest of the headers
		}
		if health {
			c.Write(healthz)
			c.Discard(head + body)
			continue
		}
		n := min(head+body, len(b))
		p.send(b[:n])
		c.Discard(n)
		p.body = head + body - n
	}
	return gnet.None
}

// send passes a request's bytes upstream, or holds them until the upstream
// connection is up.
func (p *pair) send(b []byte) {
	switch {
	case p.up != nil:
		p.up.Write(b)
	case len(p.pending)+len(b) > maxPending:
		p.client.Close()
	default:
		p.pending = append(p.pending, b...)
	}
}

// request reads the request headers at the start of b: their length
// (0 while they are incomplete), the Content-Length of the body, and
// whether the request asks for /healthz; head < 0 for a request this floor
// does not carry.
func request(b []byte) (head, body int, health bool) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) > 64<<10 {
			return -1, 0, false
		}
		return 0, 0, false
	}
	h := b[:end+2]
	health = bytes.HasPrefix(h, []byte("GET /healthz "))
	for line := range bytes.SplitSeq(h, []byte("\r\n")) {
		k, v, found := bytes.Cut(line, []byte(":"))
		if found && bytes.EqualFold(k, []byte("Content-Length")) {
			l, err := strconv.Atoi(string(bytes.TrimSpace(v)))
			if err != nil || l < 0 {
				return -1, 0, false
			}
			body = l
		}
		if found && bytes.EqualFold(k, []byte("Transfer-Encoding")) {
			return -1, 0, false
		}
	}
	return end + 4, body, health
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	upstream := flag.String("upstream", "", "host:port of the Tier-1 to proxy to")
	flag.Parse()
	up, err := net.ResolveTCPAddr("tcp", *upstream)
	if err != nil || *upstream == "" {
		log.Fatalf("--upstream %q: want host:port (%v)", *upstream, err)
	}
	log.Fatal(gnet.Run(&floor{upstream: up}, "tcp://"+*listen, gnet.WithMulticore(true), gnet.WithTCPNoDelay(gnet.TCPNoDelay)))
}
