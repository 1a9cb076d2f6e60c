package tier2

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/net/http/httpguts"

	"github.com/meridian-router/meridian/request"
)

// LoopServer serves the front door on event loops (panjf2000/gnet's epoll
// loops, one per core, as nginx's workers are) instead of a goroutine per
// connection. An inference request whose every stage decides at once (a
// token in the cache, admission without a queue, a plaintext Tier-1) is
// served on its connection's loop from its first byte to its last: the
// stages, the request to Tier-1 on a keep-alive connection registered on
// the same loop, and the relay of the response with its accounting. No
// goroutine is woken for it, which is what a goroutine-per-connection
// server pays several times a request.
//
// Everything else is served by the front door's http.Handler on a
// goroutine, from the same bytes: the other routes, a token not yet
// verified (its keys may have to be fetched), a request that waits in
// admission (it continues there from admission on), and a Tier-1 reached
// over TLS. Callers speaking HTTP/2 without TLS (h2c) are handed to
// net/http whole. The guarantees are the handler's: both paths run the
// same stages.
type LoopServer struct {
	gnet.BuiltinEventEngine
	r   *Router
	h   http.Handler
	log *slog.Logger
	cfg LoopConfig

	eng         gnet.Engine
	sock        string // the engine's own listener, a Unix socket
	booted      chan struct{}
	running     chan struct{} // a connection opened on a loop: they all run
	runningOnce sync.Once
	closing     chan struct{} // Shutdown or Close began
	closingOnce sync.Once
	ran         chan error // gnet.Run's result

	mu       sync.Mutex
	ln       net.Listener
	conns    map[*clientConn]struct{} // enrolled caller connections
	draining atomic.Bool
	active   atomic.Int64 // requests in flight
	h2       *http.Server // h2c callers
	h2ln     *handoffListener

	pools  sync.Map // gnet.EventLoop → *upPool
	tier1s sync.Map // Tier-1 URL → *tier1Addr
	dialer net.Dialer
	heads  sync.Pool // *bufio.Reader for parsing heads

	onDone func() // tests: called as each request ends
}

// LoopConfig configures a LoopServer. Zero fields take the defaults in
// comments (those of Tier-2's net/http front door).
type LoopConfig struct {
	// ReadHeaderTimeout bounds reading a request's headers. Zero: 10 s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long. Zero:
	// 120 s.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (431 beyond). Zero: 64 KiB.
	MaxHeaderBytes int
	// Loops is the number of event loops. Zero: one fewer than GOMAXPROCS
	// (at least one), which leaves a core to the runtime and the
	// goroutines the loops hand work to: on two cores one loop served
	// more requests per CPU second than two (docs/BENCHMARKS.md).
	Loops int
}

// NewLoopServer returns a server for r's front door; h is r.Handler() (or
// what wraps it), which serves what the loops hand to goroutines.
func NewLoopServer(r *Router, h http.Handler, cfg LoopConfig) *LoopServer {
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = 10 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 120 * time.Second
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = 64 << 10
	}
	if cfg.Loops <= 0 {
		cfg.Loops = max(1, runtime.GOMAXPROCS(0)-1)
	}
	s := &LoopServer{r: r, h: h, log: r.log, cfg: cfg, booted: make(chan struct{}), running: make(chan struct{}), closing: make(chan struct{}), ran: make(chan error, 1),
		conns: map[*clientConn]struct{}{}, dialer: net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	s.h2ln = newHandoffListener()
	s.h2 = &http.Server{Handler: h, Protocols: &protos, ReadHeaderTimeout: cfg.ReadHeaderTimeout, IdleTimeout: cfg.IdleTimeout,
		MaxHeaderBytes: cfg.MaxHeaderBytes, ErrorLog: slog.NewLogLogger(r.log.Handler(), slog.LevelWarn)}
	s.heads.New = func() any { return bufio.NewReaderSize(nil, 4096) }
	return s
}

// dialTimeout bounds connecting to a Tier-1, as NewTransport's does: an
// unreachable cluster fails over quickly.
const dialTimeout = 2 * time.Second

// startTimeout bounds the loops' start (Serve's probe): generous, since
// it only fails a start on a machine too loaded to schedule them.
const startTimeout = 10 * time.Second

// closeDown marks the server closing: no new request is kept alive, and
// a Serve still starting its loops stops waiting for them.
func (s *LoopServer) closeDown() {
	s.draining.Store(true)
	s.closingOnce.Do(func() { close(s.closing) })
}

// Serve accepts callers on ln until Shutdown or Close; it returns
// http.ErrServerClosed then, as http.Server.Serve does, and closes ln
// whatever it returns.
func (s *LoopServer) Serve(ln net.Listener) error {
	defer ln.Close()
	s.mu.Lock()
	if s.ln != nil {
		s.mu.Unlock()
		return errors.New("tier2: LoopServer.Serve called twice")
	}
	s.ln = ln
	s.mu.Unlock()
	if s.draining.Load() { // closed before it began
		return http.ErrServerClosed
	}
	// The engine needs a listener of its own: a Unix socket in a
	// directory of its own, which takes no port and no caller can reach
	// from the network. Callers arrive through ln and are enrolled on a
	// loop.
	dir, err := os.MkdirTemp("", "meridian-tier2-")
	if err != nil {
		return fmt.Errorf("tier2: event loops: %w", err)
	}
	s.sock = filepath.Join(dir, "loops.sock")
	go func() {
		defer os.RemoveAll(dir)
		s.ran <- gnet.Run(s, "unix://"+s.sock, gnet.WithMulticore(true), gnet.WithNumEventLoop(s.cfg.Loops),
			gnet.WithLoadBalancing(gnet.LeastConnections), gnet.WithTCPNoDelay(gnet.TCPNoDelay),
			gnet.WithLogger(gnetLogger{s.log}))
	}()
	select {
	case <-s.booted:
	case err := <-s.ran:
		return fmt.Errorf("tier2: event loops: %w", err)
	}
	// OnBoot comes before the loops exist: a connection to the engine's
	// own listener, once opened on a loop, says they all run.
	err = s.probe()
	if s.draining.Load() { // closed while the loops started
		s.stop()
		return http.ErrServerClosed
	}
	if err != nil {
		s.stop()
		return fmt.Errorf("tier2: event loops: %w", err)
	}
	go s.h2.Serve(s.h2ln)
	go s.watchAbort(s.h2ln.done)
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.draining.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond) // out of file descriptors: as net/http does, back off
				continue
			}
			return err
		}
		go s.enroll(nc)
	}
}

// probe connects to the engine's listener and waits for the connection
// to open on a loop, for Shutdown or Close, or for startTimeout.
func (s *LoopServer) probe() error {
	nc, err := net.DialTimeout("unix", s.sock, startTimeout)
	if err != nil {
		return err
	}
	defer nc.Close()
	select {
	case <-s.running:
		return nil
	case <-s.closing:
		return http.ErrServerClosed
	case <-time.After(startTimeout):
		return fmt.Errorf("no event loop opened a connection in %s", startTimeout)
	}
}

func (s *LoopServer) OnBoot(eng gnet.Engine) gnet.Action {
	s.eng = eng
	close(s.booted)
	return gnet.None
}

// h2Preface is what an h2c caller sends first.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// enroll reads a caller's first bytes (to tell HTTP/2 from HTTP/1.1) and
// hands the connection to a loop, or to net/http for h2c.
func (s *LoopServer) enroll(nc net.Conn) {
	nc.SetReadDeadline(time.Now().Add(s.cfg.ReadHeaderTimeout))
	buf := make([]byte, 4096)
	n := 0
	for {
		k, err := nc.Read(buf[n:])
		n += k
		if err != nil {
			nc.Close()
			return
		}
		if n >= len(h2Preface) || !bytes.HasPrefix([]byte(h2Preface), buf[:n]) {
			break
		}
	}
	nc.SetReadDeadline(time.Time{})
	if bytes.HasPrefix(buf[:n], []byte(h2Preface)) {
		s.h2ln.hand(&prefixConn{Conn: nc, pre: buf[:n]})
		return
	}
	cc := &clientConn{s: s, pre: buf[:n:n], remote: nc.RemoteAddr().String()}
	ctx := gnet.NewContext(gnet.NewNetConnContext(context.Background(), nc), cc)
	done, err := s.eng.Register(ctx)
	if err != nil {
		nc.Close()
		return
	}
	if res := <-done; res.Err != nil {
		nc.Close()
	}
}

// Shutdown stops accepting, closes idle connections, and waits (until ctx
// ends) for the requests in flight; the connections that carried them are
// closed as they finish. Then the loops stop.
func (s *LoopServer) Shutdown(ctx context.Context) error {
	s.closeDown()
	s.mu.Lock()
	ln := s.ln
	var conns []*clientConn
	for cc := range s.conns {
		conns = append(conns, cc)
	}
	s.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	s.h2ln.Close()
	for _, cc := range conns {
		cc.closeIfIdle()
	}
	h2done := make(chan error, 1)
	go func() { h2done <- s.h2.Shutdown(ctx) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for s.active.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	if err := <-h2done; err != nil {
		return err
	}
	return s.stop()
}

// Close closes every connection at once.
func (s *LoopServer) Close() error {
	s.closeDown()
	s.mu.Lock()
	if s.ln != nil {
		s.ln.Close()
	}
	s.mu.Unlock()
	s.h2ln.Close()
	s.h2.Close()
	return s.stop()
}

func (s *LoopServer) stop() error {
	select {
	case <-s.booted:
	default:
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.eng.Stop(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil // stopped already
	}
	return nil
}

func (s *LoopServer) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	switch x := c.Context().(type) {
	case *clientConn:
		x.open(c)
	case *upConn:
		x.open(c)
	default: // a connection to the engine's own socket: Serve's probe
		s.runningOnce.Do(func() { close(s.running) })
		cc := &clientConn{s: s, remote: "@" + s.sock}
		c.SetContext(cc)
		cc.open(c)
	}
	return nil, gnet.None
}

func (s *LoopServer) OnClose(c gnet.Conn, err error) gnet.Action {
	switch x := c.Context().(type) {
	case *clientConn:
		if x.ls == nil { // closed before it opened
			x.gone()
			break
		}
		x.ls.enter()
		x.gone()
		x.ls.leave()
	case *upConn:
		x.pool.enter()
		x.gone(err)
		x.pool.leave()
	}
	return gnet.None
}

func (s *LoopServer) OnTraffic(c gnet.Conn) gnet.Action {
	switch x := c.Context().(type) {
	case *clientConn:
		x.ls.enter()
		x.serve()
		x.ls.leave()
	case *upConn:
		x.pool.enter()
		x.traffic()
		x.pool.leave()
	}
	return gnet.None
}

// clientConn is a caller's connection. Its fields belong to its loop.
type clientConn struct {
	s      *LoopServer
	c      gnet.Conn
	ls     *loopState
	pre    []byte // read before the connection was enrolled; served first
	remote string
	closed bool
	busy   bool // a request is being served: later bytes wait
	keep   bool // keep the connection after the response being served
	// last is the connection's last call on the loop; its response
	// header map is the next one's (responseHeader).
	last *loopCall
	// parsed is the request readHead read last, when parseRequestHead
	// read it (its call keeps it: endedRequest).
	parsed *parsedRequest
	// headBuf is where a streamed response's head is written until it
	// leaves with the first events (headBuffer).
	headBuf []byte

	// The request being read.
	head      *http.Request
	body      []byte
	bodyBuf   *[]byte // body's pooled buffer (request.GetBuffer), or nil
	bodyLen   int64   // the announced Content-Length; -1 chunked
	tooLarge  bool    // announced longer than MaxBodyBytes: not read
	smuggled  bool    // chunked and a Content-Length both: closed after the response
	dec       chunkDecoder
	continued bool // 100 Continue sent

	cur *loopCall // the inference served on the loop
	// served is the pooled buffer of the request in flight, returned when
	// it ends (done). A body handed to a goroutine (goServe) is never
	// returned: what runs there, net/http's transport included, may hold
	// it past the response. On the loop, nothing refers to a body once
	// its request has ended: Parse copies what it keeps, and every late
	// event (a dial, a timer) checks that its call has not ended.
	served *[]byte
	cancel context.CancelFunc // the context of a request served on a goroutine

	// The watchdog timer of the calls served on the loop, one per
	// connection (a call's own would be made and dropped per request):
	// it fires the watchdog of the call in flight.
	watchT   *time.Timer
	watching atomic.Pointer[watchdog]

	// One timer bounds the reads: the idle wait for a request, its
	// headers, its body. gen tells a firing from an earlier arming.
	timer *time.Timer
	gen   uint64
	armed atomic.Uint64
	phase int
}

const (
	readIdle = 1 + iota
	readHeader
	readBody
)

func (cc *clientConn) open(c gnet.Conn) {
	cc.c = c
	s := cc.s
	cc.ls = s.pool(c.EventLoop())
	s.mu.Lock()
	s.conns[cc] = struct{}{}
	s.mu.Unlock()
	cc.timer = time.AfterFunc(time.Hour, cc.fire)
	if len(cc.pre) > 0 {
		c.Wake(nil) // serve what was read before enrollment
	} else {
		cc.arm(readIdle, s.cfg.IdleTimeout)
	}
}

func (cc *clientConn) arm(phase int, d time.Duration) {
	cc.gen++
	cc.armed.Store(cc.gen)
	cc.phase = phase
	cc.timer.Reset(d)
}

func (cc *clientConn) disarm() {
	cc.gen++
	cc.phase = 0
	cc.timer.Stop()
}

// fire runs on the timer's goroutine: the loop decides.
func (cc *clientConn) fire() {
	g := cc.armed.Load()
	cc.c.EventLoop().Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
		if cc.closed || cc.gen != g {
			return nil
		}
		if cc.phase == readBody && cc.head != nil {
			cc.keep = false
			cc.busy = true
			cc.s.active.Add(1)
			cc.respondError(cc.s.r.bodyTimeout())
			return nil
		}
		cc.c.Close()
		return nil
	}))
}

// gone: the connection closed (by either side).
func (cc *clientConn) gone() {
	if cc.closed {
		return
	}
	cc.closed = true
	if cc.timer != nil {
		cc.timer.Stop()
	}
	if cc.watchT != nil {
		cc.watchT.Stop()
	}
	if cc.cur != nil {
		cc.cur.callerGone()
	}
	if cc.cancel != nil {
		cc.cancel()
	}
	s := cc.s
	s.mu.Lock()
	delete(s.conns, cc)
	s.mu.Unlock()
}

// closeIfIdle closes the connection from any goroutine unless a request
// is in flight (that one closes it when done: draining).
func (cc *clientConn) closeIfIdle() {
	cc.c.EventLoop().Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
		if !cc.closed && !cc.busy {
			cc.c.Close()
		}
		return nil
	}))
}

// buffered returns what the caller sent and the loop has not consumed.
func (cc *clientConn) buffered() []byte {
	if cc.pre != nil {
		if cc.c.InboundBuffered() > 0 {
			b, _ := cc.c.Next(-1)
			cc.pre = append(cc.pre, b...)
		}
		return cc.pre
	}
	b, _ := cc.c.Peek(-1)
	return b
}

func (cc *clientConn) consume(n int) {
	if cc.pre != nil {
		if cc.pre = cc.pre[n:]; len(cc.pre) == 0 {
			cc.pre = nil
		}
		return
	}
	cc.c.Discard(n)
}

// maxPipelined bounds what a caller may send beyond the request being
// served.
const maxPipelined = 1 << 20

// serve reads and dispatches requests until one is in flight or the
// buffered bytes end.
func (cc *clientConn) serve() {
	s := cc.s
	for !cc.closed {
		if cc.busy {
			if cc.c.InboundBuffered()+len(cc.pre) > maxPipelined {
				cc.c.Close()
			}
			return
		}
		buf := cc.buffered()
		if cc.head == nil {
			if len(buf) == 0 {
				if cc.phase != readIdle {
					cc.arm(readIdle, s.cfg.IdleTimeout)
				}
				return
			}
			limit := s.cfg.MaxHeaderBytes + 4096 // net/http's slack for the request line
			end := bytes.Index(buf[:min(len(buf), limit+4)], []byte("\r\n\r\n"))
			if end < 0 {
				if len(buf) > limit {
					cc.plainError(http.StatusRequestHeaderFieldsTooLarge)
					return
				}
				if cc.phase != readHeader {
					cc.arm(readHeader, s.cfg.ReadHeaderTimeout)
				}
				return
			}
			req, status := cc.readHead(buf[:end+4])
			cc.consume(end + 4)
			if status != 0 {
				cc.plainError(status)
				return
			}
			cc.head, cc.body, cc.bodyBuf, cc.continued, cc.tooLarge, cc.smuggled = req, nil, nil, false, false, false
			switch {
			case len(req.TransferEncoding) > 0:
				cc.bodyLen = -1
				cc.dec = chunkDecoder{}
				// A length beside the chunks is how requests are smuggled
				// past a proxy that reads the other one: this one reads the
				// chunks (RFC 9112 §6.3) and closes the connection after.
				cc.smuggled = headerLines(buf[:end+4], "content-length") > 0
			case req.ContentLength > s.r.cfg.MaxBodyBytes:
				cc.bodyLen, cc.tooLarge = 0, true // refused unread, after authentication
			default:
				cc.bodyLen = max(req.ContentLength, 0)
				cc.startBody()
			}
			cc.arm(readBody, s.r.cfg.BodyReadTimeout)
			continue
		}
		if !cc.readBody(buf) {
			return
		}
		req, body := cc.head, cc.body
		cc.served = cc.bodyBuf
		cc.head, cc.body, cc.bodyBuf = nil, nil, nil
		cc.dispatch(req, body)
	}
}

// readBody consumes body bytes from buf; true once the body is whole.
func (cc *clientConn) readBody(buf []byte) bool {
	s := cc.s
	if cc.bodyLen >= 0 {
		need := int(cc.bodyLen) - len(cc.body)
		n := min(need, len(buf))
		if len(cc.body)+n > cap(cc.body) {
			cc.growBody(len(cc.body) + n)
		}
		cc.body = append(cc.body, buf[:n]...)
		cc.consume(n)
		if n < need {
			cc.continueBody()
			return false
		}
		return true
	}
	n, done, err := cc.dec.decode(buf, &cc.body, s.r.cfg.MaxBodyBytes)
	cc.consume(n)
	switch {
	case errors.Is(err, errChunkTooLarge):
		cc.tooLarge, cc.body = true, nil
		cc.keep = false
		return true
	case err != nil:
		cc.plainError(http.StatusBadRequest)
		return false
	case !done:
		cc.continueBody()
		return false
	}
	return true
}

// bodyStart is the most a body's buffer holds before its bytes arrive.
// The body is read before the request is authenticated (the stages run on
// the whole request): a buffer of the announced length would let anyone
// make Tier-2 hold 4 MiB per connection for the price of a header line.
const bodyStart = 64 << 10

// startBody makes room for what arrives first of a body of known length;
// more comes as more arrives (growBody).
func (cc *clientConn) startBody() {
	if cc.bodyLen > 0 {
		cc.bodyBuf = request.GetBuffer(int(min(cc.bodyLen, bodyStart)))
		cc.body = (*cc.bodyBuf)[:0]
	}
}

// growBody moves the body into a pooled buffer for at least want bytes:
// four times want, up to the announced length. What a body holds is so
// at most four times what its caller sent (and bodyStart), and a long
// prompt moves once or twice (a 220 KB one, once: 64 KiB).
func (cc *clientConn) growBody(want int) {
	size := int(cc.bodyLen)
	if want <= size/4 {
		size = 4 * want
	}
	nb := request.GetBuffer(size)
	*nb = append((*nb)[:0], cc.body...)
	if cc.bodyBuf != nil {
		request.PutBuffer(cc.bodyBuf) // nothing else refers to it: the request is still being read
	}
	cc.bodyBuf, cc.body = nb, *nb
}

// continueBody answers a caller waiting for 100 Continue.
func (cc *clientConn) continueBody() {
	if !cc.continued && cc.head.ProtoAtLeast(1, 1) && httpguts.HeaderValuesContainsToken(cc.head.Header["Expect"], "100-continue") {
		cc.continued = true
		cc.c.Write([]byte("HTTP/1.1 100 Continue\r\n\r\n"))
	}
}

// readHead parses a request's headers with net/http's parser and the
// checks its server makes; status is the error to answer, or 0.
func (cc *clientConn) readHead(b []byte) (*http.Request, int) {
	cc.parsed = nil
	if h, ok := parseRequestHead(b, cc.ls.keys, cc.endedRequest()); ok {
		cc.parsed = h
		return cc.checkHead(&h.req)
	}
	br := cc.s.heads.Get().(*bufio.Reader)
	br.Reset(bytes.NewReader(b))
	req, err := http.ReadRequest(br)
	br.Reset(nil)
	cc.s.heads.Put(br)
	if err != nil {
		return nil, http.StatusBadRequest
	}
	if req.ProtoMajor != 1 {
		return nil, http.StatusHTTPVersionNotSupported
	}
	// http.ReadRequest drops the Host header (into req.Host): net/http's
	// server counts it before, and so does this.
	hosts := headerLines(b, "host")
	if req.ProtoAtLeast(1, 1) && hosts == 0 || hosts > 1 || hosts == 1 && !httpguts.ValidHostHeader(req.Host) {
		return nil, http.StatusBadRequest
	}
	for k, vs := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, http.StatusBadRequest
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil, http.StatusBadRequest
			}
		}
	}
	return cc.checkHead(req)
}

// checkHead is what the front door checks of a head either parser read.
func (cc *clientConn) checkHead(req *http.Request) (*http.Request, int) {
	if ex := req.Header["Expect"]; len(ex) > 0 && !(len(ex) == 1 && httpguts.HeaderValuesContainsToken(ex, "100-continue")) {
		return nil, http.StatusExpectationFailed
	}
	req.RemoteAddr = cc.remote
	return req, 0
}

// poisonReleasedBodies overwrites a body's buffer as it returns to the pool
// (tests: a use after the request ended reads 0xdb, not a stale prompt).
var poisonReleasedBodies bool

// headerLines counts the header lines of a request's head named name
// (lower case).
func headerLines(head []byte, name string) int {
	n := 0
	for len(head) > 0 {
		i := bytes.IndexByte(head, '\n')
		if i < 0 {
			break
		}
		line := head[:i]
		head = head[i+1:]
		if len(line) > len(name) && line[len(name)] == ':' && bytes.EqualFold(line[:len(name)], []byte(name)) {
			n++
		}
	}
	return n
}

// plainError answers a request that could not be read as net/http's
// server does, and closes the connection.
func (cc *clientConn) plainError(status int) {
	cc.busy, cc.keep = true, false
	cc.disarm()
	text := strconv.Itoa(status) + " " + http.StatusText(status)
	cc.c.Write([]byte("HTTP/1.1 " + text + "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n" + text))
	cc.c.Close()
}

// dispatch serves a whole request: on the loop when it is an inference
// request, otherwise by the handler on a goroutine.
func (cc *clientConn) dispatch(req *http.Request, body []byte) {
	cc.disarm()
	cc.busy = true
	cc.keep = !req.Close && !cc.s.draining.Load() && !cc.tooLarge && !cc.smuggled
	cc.s.active.Add(1)
	if req.Method == http.MethodPost && (req.URL.Path == "/v1/chat/completions" || req.URL.Path == "/v1/completions") {
		cc.s.inference(cc, req, body)
		return
	}
	cc.goServe(req, body, cc.s.h.ServeHTTP)
}

// done ends the request in flight: the next one is read, or the
// connection closes.
func (cc *clientConn) done() {
	if !cc.busy {
		return // ended already (a failed write closed the connection on the way)
	}
	cc.busy = false
	cc.cur = nil
	if b := cc.served; b != nil {
		cc.served = nil
		if poisonReleasedBodies {
			all := (*b)[:cap(*b)]
			for i := range all {
				all[i] = 0xdb
			}
		}
		request.PutBuffer(b)
	}
	if cc.cancel != nil {
		cc.cancel()
		cc.cancel = nil
	}
	cc.s.active.Add(-1)
	if cc.s.onDone != nil {
		cc.s.onDone()
	}
	if cc.closed {
		return
	}
	if !cc.keep || cc.s.draining.Load() {
		cc.c.Close()
		return
	}
	cc.serve()
}

// responseHeader returns an empty header map for the response of a new
// call on the loop: the previous call's, cleared, unless that went to a
// goroutine. A connection serves one request at a time, and a call's
// last use of its map is writing its response head, before the
// connection reads the next request; timers and admission of an ended
// call do nothing (loopCall.ended, and the caller gone when admission
// releases late).
func (cc *clientConn) responseHeader() http.Header {
	p := cc.last
	cc.last = nil
	if p == nil || p.shared || p.h == nil {
		return make(http.Header, 16) // sized for the rate-limit, upstream and routing headers: no growth
	}
	h := p.h
	if poisonReleasedBodies {
		p.h = nil // tests: a late write to the old call's headers panics
	}
	clear(h)
	return h
}

// endedRequest returns the parsed request of the connection's last call
// on the loop for the next head to overwrite, unless that request went to
// a goroutine: as with responseHeader, a call ended on the loop uses its
// request no more once its response is written (timers and admission of
// an ended call do nothing).
func (cc *clientConn) endedRequest() *parsedRequest {
	p := cc.last
	if p == nil || p.shared || p.parsed == nil {
		return nil
	}
	h := p.parsed
	p.parsed = nil
	if poisonReleasedBodies {
		p.req = nil // tests: a late use of the old call's request panics
	}
	return h
}

// headBuffer returns an empty buffer for a streamed response's head, the
// connection's own: it serves one response at a time, and a head is
// handed back (loopCall.emit) once written.
func (cc *clientConn) headBuffer() []byte {
	b := cc.headBuf
	cc.headBuf = nil
	if b == nil {
		b = make([]byte, 0, 512)
	}
	return b
}

// goServe serves req with serve on a goroutine; its response is written
// through the loop, and the loop reads on once it ends.
func (cc *clientConn) goServe(req *http.Request, body []byte, serve func(http.ResponseWriter, *http.Request)) {
	cc.served = nil // the goroutine may hold the body past the response: never reused
	ctx, cancel := context.WithCancel(context.Background())
	cc.cancel = cancel
	req = req.WithContext(ctx)
	req.TransferEncoding = nil
	req.ContentLength = int64(len(body))
	if len(body) == 0 {
		req.Body = http.NoBody
	} else {
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	if cc.tooLarge { // announced (or sent in chunks) over the limit: refused unread
		req.Body, req.ContentLength = http.NoBody, max(req.ContentLength, cc.s.r.cfg.MaxBodyBytes+1)
	}
	w := &asyncWriter{c: cc.c, h: http.Header{}, keep: cc.keep, head: req.Method == http.MethodHead}
	go func() {
		defer func() {
			if p := recover(); p != nil {
				if p != http.ErrAbortHandler {
					cc.s.log.Error("tier2: panic serving a request", "path", req.URL.Path, "panic", p)
				}
				w.c.Close()
			} else {
				w.finish()
			}
			cc.c.EventLoop().Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
				if !w.keep {
					cc.keep = false
				}
				cc.done()
				return nil
			}))
		}()
		serve(w, req)
	}()
}

// asyncWriter is a ResponseWriter for a handler on a goroutine: what it
// writes reaches the caller's connection through the loop (AsyncWrite
// copies nothing; every buffer handed over is the loop's).
type asyncWriter struct {
	c          gnet.Conn
	h          http.Header
	code       int
	keep, head bool
	sent       bool // the head is written: the body is chunked
	buf        []byte
	err        error
	queued     atomic.Int64 // handed to the loop and not yet written
}

func (w *asyncWriter) Header() http.Header { return w.h }

func (w *asyncWriter) WriteHeader(code int) {
	if w.code != 0 || code < 200 {
		return
	}
	w.code = code
}

func (w *asyncWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.head || !bodyAllowed(w.code) {
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	if len(w.buf) >= 32<<10 {
		w.FlushError()
	}
	return len(p), w.err
}

func (w *asyncWriter) Flush() { w.FlushError() }

func (w *asyncWriter) FlushError() error {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return w.err
	}
	var out []byte
	if !w.sent {
		w.sent = true
		out = appendHead(nil, w.code, w.h, w.buf, -1, w.keep)
	}
	if len(w.buf) > 0 {
		out = appendChunk(out, w.buf)
		w.buf = nil
	}
	if len(out) > 0 {
		w.send(out)
	}
	return w.err
}

func (w *asyncWriter) finish() {
	if w.code == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return
	}
	if !w.sent {
		out := appendHead(nil, w.code, w.h, w.buf, int64(len(w.buf)), w.keep)
		w.send(append(out, w.buf...))
		return
	}
	out := w.buf
	if len(out) > 0 {
		out = appendChunk(nil, w.buf)
	}
	w.send(append(out, "0\r\n\r\n"...))
}

func (w *asyncWriter) send(b []byte) {
	if w.queued.Add(int64(len(b))) > maxCallerBacklog {
		// The caller does not read: its response ends here, as a
		// blocked write would end it on net/http's server.
		w.err, w.keep = errSlowCaller, false
		w.c.Close()
		return
	}
	n := int64(len(b))
	wrote := func(c gnet.Conn, _ error) error {
		w.queued.Add(-n)
		if c.OutboundBuffered() > maxCallerBacklog { // on the loop: what the socket did not take
			c.Close()
		}
		return nil
	}
	if err := w.c.AsyncWrite(b, wrote); err != nil {
		w.err = err
		w.keep = false
	}
}

// errSlowCaller ends a response whose caller left maxCallerBacklog unread.
var errSlowCaller = errors.New("tier2: the caller does not read its response")

func bodyAllowed(code int) bool {
	return code != http.StatusNoContent && code != http.StatusNotModified && code >= 200
}

// appendHead appends a response's status line and headers. length is the
// body's Content-Length, or -1 for a chunked body; sniff is the first of
// the body, for a Content-Type the handler did not set (as net/http does).
func appendHead(b []byte, code int, h http.Header, sniff []byte, length int64, keep bool) []byte {
	b = appendStatus(b, code, h, sniff, true)
	return appendFraming(b, code, length, keep)
}

// appendStatus appends appendHead's status line and h's fields (with a
// Content-Type sniffed from sniff if h has none, and a Date if date and h
// has none): a head that more fields may follow before appendFraming.
func appendStatus(b []byte, code int, h http.Header, sniff []byte, date bool) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(code)...)
	b = append(b, "\r\n"...)
	if _, ok := h["Content-Type"]; !ok && len(sniff) > 0 && bodyAllowed(code) {
		h.Set("Content-Type", http.DetectContentType(sniff))
	}
	if _, ok := h["Date"]; !ok && date {
		b = append(b, "Date: "...)
		b = time.Now().UTC().AppendFormat(b, http.TimeFormat)
		b = append(b, "\r\n"...)
	}
	for k, vs := range h {
		if !framingField(k) {
			b = appendField(b, k, vs...)
		}
	}
	return b
}

// appendFraming ends a head appendStatus began: the body's framing, the
// connection's, and the blank line.
func appendFraming(b []byte, code int, length int64, keep bool) []byte {
	switch {
	case !bodyAllowed(code):
	case length >= 0:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, length, 10)
		b = append(b, "\r\n"...)
	default:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	if !keep {
		b = append(b, "Connection: close\r\n"...)
	}
	return append(b, "\r\n"...)
}

// framingField reports the headers appendHead writes itself, and those
// of a hop (never passed on).
func framingField(k string) bool {
	switch k {
	case "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive":
		return true
	}
	return false
}

// appendChunk appends p as one chunk of a chunked body.
func appendChunk(b, p []byte) []byte {
	b = strconv.AppendInt(b, int64(len(p)), 16)
	b = append(b, "\r\n"...)
	b = append(b, p...)
	return append(b, "\r\n"...)
}

// respond writes a response the loop answered itself (an error, a whole
// body) and ends the request.
func (cc *clientConn) respond(code int, h http.Header, body []byte) {
	cc.cur = nil
	if !cc.closed {
		b := appendHead(make([]byte, 0, 512+len(body)), code, h, body, int64(len(body)), cc.keep)
		cc.c.Write(append(b, body...))
	}
	cc.done()
}

// respondError answers e from the loop.
func (cc *clientConn) respondError(e interface{ Write(http.ResponseWriter) }) {
	w := &bufferWriter{h: http.Header{}}
	e.Write(w)
	cc.respond(w.code, w.h, w.body)
}

// bufferWriter collects a response written at once.
type bufferWriter struct {
	h    http.Header
	code int
	body []byte
}

func (w *bufferWriter) Header() http.Header { return w.h }
func (w *bufferWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *bufferWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	w.body = append(w.body, p...)
	return len(p), nil
}

// handoffListener is a net.Listener of connections handed to it (callers
// speaking h2c, for net/http).
type handoffListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newHandoffListener() *handoffListener {
	return &handoffListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *handoffListener) hand(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// prefixConn is a connection whose first bytes were read already.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// gnetLogger sends gnet's own log lines to the front door's logger.
type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(string, ...any) {}
func (g gnetLogger) Infof(string, ...any)  {}
func (g gnetLogger) Warnf(f string, a ...any) {
	g.l.Warn("tier2: event loop: " + fmt.Sprintf(f, a...))
}
func (g gnetLogger) Errorf(f string, a ...any) {
	g.l.Error("tier2: event loop: " + fmt.Sprintf(f, a...))
}
func (g gnetLogger) Fatalf(f string, a ...any) {
	g.l.Error("tier2: event loop: " + fmt.Sprintf(f, a...))
}
