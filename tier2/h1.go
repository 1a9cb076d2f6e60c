package tier2

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// h1Transport carries requests to plaintext (http://) Tier-1s over pooled
// HTTP/1.1 connections, on the caller's goroutine. net/http's Transport
// hands every request to a writer goroutine and every response to a
// reader goroutine of its connection, and parks each in the network poller
// once more than the exchange needs; on Tier-2's path that was a fifth of
// its CPU per request. The wire format is net/http's own (Request.Write,
// http.ReadResponse); only the connection handling is here. Anything else
// (https, with HTTP/2 by ALPN) goes to the fallback transport.
//
// A request's context ends the exchange at any point: its connection's
// deadline is set in the past, the read or write in progress fails, and
// the connection is closed, never reused.
type h1Transport struct {
	fallback    http.RoundTripper
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	idleTimeout time.Duration
	maxIdle     int              // per host
	now         func() time.Time // the idle clock (tests)

	mu   sync.Mutex
	idle map[string][]*h1Conn // by host:port, most recently used last
	// swept is when idle connections of every host were last checked
	// against the idle timeout, so that a Tier-1 no longer used (a cluster
	// removed) does not keep its connections open.
	swept time.Time
}

// maxResponseHeader bounds a Tier-1's response headers (its connection's
// read buffer): a response whose headers do not fit fails the attempt.
const maxResponseHeader = 16 << 10

type h1Conn struct {
	nc   net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	used time.Time // when it went idle
}

func newH1Transport(fallback *http.Transport) *h1Transport {
	return &h1Transport{
		fallback:    fallback,
		dial:        fallback.DialContext,
		idleTimeout: fallback.IdleConnTimeout,
		maxIdle:     fallback.MaxIdleConnsPerHost,
		now:         time.Now,
		idle:        map[string][]*h1Conn{},
	}
}

// errStaleConn: a reused connection ended before any response byte (the
// Tier-1 had closed it while idle); the request is sent again on a new one.
var errStaleConn = errors.New("tier2: idle connection closed by the Tier-1")

func (t *h1Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" {
		return t.fallback.RoundTrip(req)
	}
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	for attempt := 0; ; attempt++ {
		c, reused := t.get(addr)
		if c == nil {
			nc, err := t.dial(req.Context(), "tcp", addr)
			if err != nil {
				closeBody(req)
				return nil, err
			}
			c = &h1Conn{nc: nc, br: bufio.NewReaderSize(nc, maxResponseHeader), bw: bufio.NewWriterSize(nc, 8<<10)}
		}
		resp, err := t.exchange(c, addr, req, reused)
		if !errors.Is(err, errStaleConn) || attempt > 0 || req.GetBody == nil {
			if err != nil {
				closeBody(req)
			}
			return resp, err
		}
		body, gerr := req.GetBody()
		if gerr != nil {
			return nil, err
		}
		req = req.Clone(req.Context())
		req.Body = body
	}
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// exchange sends req on c and reads the response headers. The response
// body returns c to the pool when read to its end.
func (t *h1Transport) exchange(c *h1Conn, addr string, req *http.Request, reused bool) (*http.Response, error) {
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		c.nc.Close()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (*http.Response, error) {
		stop()
		c.nc.Close()
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	if err := req.Write(c.bw); err != nil {
		return fail(err)
	}
	if err := c.bw.Flush(); err != nil {
		if reused {
			return fail(errStaleConn)
		}
		return fail(err)
	}
	if err := waitHeader(c.br); err != nil {
		if reused && c.br.Buffered() == 0 && (errors.Is(err, io.EOF) || isReset(err)) {
			return fail(errStaleConn)
		}
		return fail(err)
	}
	resp, err := http.ReadResponse(c.br, req)
	if err != nil {
		return fail(err)
	}
	if resp.StatusCode < 200 {
		resp.Body.Close()
		return fail(fmt.Errorf("tier2: unexpected informational response %s from a Tier-1", resp.Status))
	}
	resp.Body = &h1Body{rc: resp.Body, t: t, c: c, addr: addr, stop: stop, keep: !resp.Close}
	return resp, nil
}

// waitHeader waits until br holds a whole response header (through the
// blank line), or fails when it does not fit in br's buffer.
func waitHeader(br *bufio.Reader) error {
	for seen := 0; ; {
		if n := br.Buffered(); n > 0 {
			b, _ := br.Peek(n)
			if bytes.Contains(b[max(seen-3, 0):], []byte("\r\n\r\n")) {
				return nil
			}
			if n >= br.Size() {
				return fmt.Errorf("tier2: a Tier-1's response headers exceed %d bytes", maxResponseHeader)
			}
			seen = n
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil { // waits for more
			return err
		}
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

// h1Body is a response body on a pooled connection.
type h1Body struct {
	rc   io.ReadCloser
	t    *h1Transport
	c    *h1Conn
	addr string
	stop func() bool
	keep bool // the connection may carry another request once this body ends
	done bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	if err != nil {
		b.finish(err == io.EOF)
	}
	return n, err
}

func (b *h1Body) Close() error {
	if !b.done {
		b.finish(false) // not read to its end: the connection cannot be reused
	}
	return nil
}

// finish hands the connection back (a body read to its end, whose context
// did not end it) or closes it.
func (b *h1Body) finish(clean bool) {
	b.done = true
	if b.stop() && clean && b.keep {
		b.t.put(b.addr, b.c)
		return
	}
	b.c.nc.Close()
}

// get takes the most recently used idle connection to addr, dropping those
// idle longer than the idle timeout.
func (t *h1Transport) get(addr string) (*h1Conn, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	conns := t.idle[addr]
	for len(conns) > 0 {
		c := conns[len(conns)-1]
		conns[len(conns)-1] = nil
		conns = conns[:len(conns)-1]
		if t.idleTimeout > 0 && t.now().Sub(c.used) > t.idleTimeout {
			c.nc.Close()
			continue
		}
		t.idle[addr] = conns
		return c, true
	}
	t.idle[addr] = conns
	return nil, false
}

func (t *h1Transport) put(addr string, c *h1Conn) {
	c.used = t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.idleTimeout > 0 && c.used.Sub(t.swept) > t.idleTimeout {
		t.sweep(c.used)
	}
	if len(t.idle[addr]) >= t.maxIdle {
		c.nc.Close()
		return
	}
	t.idle[addr] = append(t.idle[addr], c)
}

// sweep closes the connections idle longer than the idle timeout, of
// every host (t.mu held). Each host's list is oldest first.
func (t *h1Transport) sweep(now time.Time) {
	t.swept = now
	for addr, conns := range t.idle {
		k := 0
		for k < len(conns) && now.Sub(conns[k].used) > t.idleTimeout {
			conns[k].nc.Close()
			k++
		}
		if k == len(conns) {
			delete(t.idle, addr)
			continue
		}
		t.idle[addr] = append(conns[:0], conns[k:]...)
	}
}

// CloseIdleConnections closes every idle connection (http.Client calls
// it; so does a Tier-2 stopping).
func (t *h1Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = map[string][]*h1Conn{}
	t.mu.Unlock()
	for _, conns := range idle {
		for _, c := range conns {
			c.nc.Close()
		}
	}
	if ci, ok := t.fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}
