package tier2

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/meridian-router/meridian/internal/trust"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/request"
)

// inference serves an inference request on its connection's loop, or
// hands it (whole, or from admission on) to a goroutine when a stage
// would wait.
func (s *LoopServer) inference(cc *clientConn, req *http.Request, raw []byte) {
	r := s.r
	n := 0
	for _, vs := range req.Header {
		n += len(vs)
	}
	auth := r.auth.Load()
	var cached *Caller
	if auth != nil {
		var ok bool
		if cached, ok = auth.cachedAuthorization(req.Header.Get("Authorization")); !ok {
			n = -1 // not verified yet: the handler verifies it
		}
	}
	if n < 0 || n > r.cfg.MaxHeaders {
		cc.goServe(req, raw, s.h.ServeHTTP)
		return
	}
	stripInternal(req.Header)
	st := r.snap.Load()
	lc := &loopCall{s: s, r: r, st: st, cc: cc, req: req, parsed: cc.parsed, h: cc.responseHeader()}
	c := &lc.call // one allocation for both
	c.start = r.cfg.Now()
	lc.c = c
	cc.last = lc
	// The stages, as serveStages runs them, each deciding at once.
	var e *request.APIError
	if auth == nil {
		c.caller, e = r.identify(st, req)
	} else {
		c.caller, e = r.knownTenant(st, cached)
	}
	if e != nil {
		lc.reject(e)
		return
	}
	c.chargeLabel = st.tenantLabel(c.caller.Tenant)
	var err error
	if cc.tooLarge {
		err = fmt.Errorf("request: %w: %d bytes announced, limit %d", request.ErrTooLarge, req.ContentLength, r.cfg.MaxBodyBytes)
	} else {
		c.raw = raw
		c.body, err = request.Parse(raw, r.cfg.MaxBodyBytes)
	}
	w := headerWriter{lc.h}
	if e = r.parsed(c, err); e == nil {
		e = r.resolve(st, c, w, req)
	}
	if e != nil {
		lc.reject(e)
		return
	}
	pr, e := r.banded(st, c)
	if e != nil {
		lc.reject(e)
		return
	}
	if r.cfg.Priority == nil {
		lc.admitted()
		return
	}
	// Admission decides at once, or releases the request later from
	// another goroutine: then the loop goes on with it.
	lc.pr, lc.home = pr, cc.ls
	cancel := r.cfg.Priority.SubmitTo(c.resolved.Target, pr, lc)
	if lc.admState.CompareAndSwap(0, 1) { // waiting in admission's queue
		lc.cancelAdmit = cancel
		lc.queued = true
		cc.cur = lc
		return
	}
	lc.admitted()
}

// Release takes admission's outcome (priority.Releaser): from within
// SubmitTo, or later from another goroutine, which hands the call back to
// its loop.
func (lc *loopCall) Release(t *priority.Ticket, err error) {
	lc.admT, lc.admSpill, lc.admErr = spilled(lc.pr, t, err)
	if lc.admState.CompareAndSwap(0, 2) {
		return
	}
	lc.home.later(lc)
}

// admitted goes on with a request admission decided on (lc.adm*).
func (lc *loopCall) admitted() {
	r, st, c, cc := lc.r, lc.st, lc.c, lc.cc
	lc.queued = false
	if r.cfg.Priority != nil {
		if e := r.admitted(c, lc.admT, lc.admSpill, lc.admErr); e != nil {
			lc.reject(e)
			return
		}
	}
	if cc.closed { // the caller left while it waited
		c.ticket.Done()
		cc.done()
		return
	}
	// The rate-limit headers go on whatever this call answers: written
	// into its head directly (appendHead), or into lc.h for an error.
	lc.rlOwed = r.cfg.Limiter != nil
	if e := r.rateLimit(st, c, nil, lc.req); e != nil {
		lc.reject(e)
		return
	}
	c.forwarded = true
	targets, body, e := r.prepare(st, c, lc.tbuf[:0])
	if e != nil {
		lc.reject(e)
		c.ticket.Done()
		return
	}
	if !r.loopTransport || !lc.s.plaintext(targets) {
		// A Tier-1 over TLS (or a transport of the caller's): net/http's
		// client, on a goroutine.
		lc.shared = true
		cc.goServe(lc.req, c.raw, func(w http.ResponseWriter, req *http.Request) {
			for k, vs := range lc.h {
				w.Header()[k] = vs
			}
			if lc.rlOwed {
				c.rl.Headers(headerSetter(w.Header()))
			}
			defer func() {
				if !c.settled {
					r.settle(c, 0)
				}
			}()
			defer c.ticket.Done()
			r.attempts(st, c, w, req, targets, body)
		})
		return
	}
	lc.targets, lc.body = targets, body
	lc.budget = r.cfg.Fleet.Retries()
	lc.budget.Request()
	cc.cur = lc
	lc.ls = lc.s.pool(cc.c.EventLoop())
	lc.ls.active[lc] = struct{}{} // Abort ends it (LoopServer.watchAbort)
	lc.attempt()
	if r.stopping.Err() != nil && !lc.ended { // Abort came first
		lc.expire(lc.gen, errShutdown)
	}
}

// watchAbort ends every call on the loops when the router's Abort is
// called, as send's context does for a goroutine's.
func (s *LoopServer) watchAbort(done <-chan struct{}) {
	select {
	case <-done:
		return
	case <-s.r.stopping.Done():
	}
	s.pools.Range(func(_, v any) bool {
		ls := v.(*loopState)
		ls.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
			for lc := range ls.active {
				lc.expire(lc.gen, errShutdown)
			}
			return nil
		}))
		return true
	})
}

// plaintext reports whether every target is a plain http:// Tier-1.
func (s *LoopServer) plaintext(ts []regions.Target) bool {
	for _, t := range ts {
		if a := s.tier1(t.Tier1); a == nil {
			return false
		}
	}
	return true
}

// tier1Addr is a Tier-1 URL as the loop dials it.
type tier1Addr struct {
	hostport, host, prefix string
}

// tier1 parses (once) a plaintext Tier-1's URL; nil for any other.
func (s *LoopServer) tier1(u string) *tier1Addr {
	if a, ok := s.tier1s.Load(u); ok {
		return a.(*tier1Addr)
	}
	pu, err := url.Parse(u)
	if err != nil || pu.Scheme != "http" || pu.Host == "" || pu.User != nil {
		return nil
	}
	a := &tier1Addr{hostport: pu.Host, host: pu.Host, prefix: strings.TrimSuffix(pu.Path, "/")}
	if pu.Port() == "" {
		a.hostport = net.JoinHostPort(pu.Hostname(), "80")
	}
	s.tier1s.Store(u, a)
	return a
}

// headerWriter is a ResponseWriter whose only use is its headers (the
// stages set rate-limit headers on the response to come).
type headerWriter struct{ h http.Header }

func (w headerWriter) Header() http.Header       { return w.h }
func (headerWriter) Write(p []byte) (int, error) { return len(p), nil }
func (headerWriter) WriteHeader(int)             {}

// loopCall is one inference request served on a loop, from the stages to
// the end of its response. Its fields belong to the loop.
type loopCall struct {
	s   *LoopServer
	r   *Router
	st  *state
	cc  *clientConn
	c   *call
	req *http.Request
	// parsed is req's parsedRequest when parseRequestHead read it: the
	// connection's next request may overwrite it once this call ended
	// (clientConn.endedRequest).
	parsed *parsedRequest
	h      http.Header // the caller's response headers
	// rlOwed: the rate limiter decided, and its headers are not in h
	// (they go on the response's head, or into h for an error).
	rlOwed bool
	// shared: h went to a goroutine (goServe), and is not reused
	// (clientConn.responseHeader).
	shared bool

	tbuf    [8]regions.Target
	targets []regions.Target
	i       int // the target being tried
	budget  *regions.RetryBudget
	last    *attemptErr
	body    sendBody

	// Admission's outcome, and how to leave its queue. admState is 0 while
	// in Submit, 1 once Submit returned first, 2 if released within Submit.
	pr          priority.Request // as submitted
	home        *loopState       // the caller's loop, to come back to
	admState    atomic.Int32
	admT        *priority.Ticket
	admSpill    bool
	admErr      error
	queued      bool
	cancelAdmit func() bool

	up    *upConn
	gen   uint64 // counts attempts: a late event of an earlier one is ignored
	stale bool   // the attempt's connection was reused (a close before any byte is retried on a new one)
	ended bool

	// The response.
	phase    int // upHead, upBody
	status   int
	framing  int
	left     int64 // Content-Length bytes still to come
	dec      chunkDecoder
	reusable bool // the connection may carry another request after this response
	sse      bool
	upFields []hfield // the Tier-1 response's header lines (their values pin its head)
	upType   bool     // they carry a Content-Type
	upDate   bool     // they carry a Date
	first    bool
	acct     streamAccount
	filter   eventFilter
	partial  []byte // an event line not yet ended
	whole    []byte // a response that is not a stream, until its end
	out      []byte // what this read relays to the caller (the loop's scratch)
	head     []byte // the response head, until the first events go with it

	ls        *loopState
	iov       [5][]byte
	chunkHead [18]byte
	upf       [12]hfield // upFields' array
	call      call       // c's
}

const (
	upHead = 1 + iota
	upBody
)

const (
	framedLength = 1 + iota
	framedChunked
	framedClose
)

// maxWholeResponse bounds a response that is not a stream (relay's limit).
const maxWholeResponse = 64 << 20

// maxEventLine bounds one event-stream line.
const maxEventLine = 16 << 20

// maxCallerBacklog bounds what waits to be written to a caller that does
// not read: beyond, its stream ends.
const maxCallerBacklog = 16 << 20

func (lc *loopCall) reject(e *request.APIError) {
	lc.r.reject(lc.st, lc.c, e, headerWriter{lc.h})
	lc.respondError(e)
}

// respondError writes e with the response headers set so far.
func (lc *loopCall) respondError(e *request.APIError) {
	if lc.rlOwed {
		lc.rlOwed = false
		lc.c.rl.Headers(headerSetter(lc.h))
	}
	w := &bufferWriter{h: lc.h}
	e.Write(w)
	lc.cc.respond(w.code, w.h, w.body)
}

// attempt tries the next target, or answers that none served.
func (lc *loopCall) attempt() {
	r := lc.r
	for lc.i < len(lc.targets) {
		if lc.i > 0 && !r.retry(lc.budget, lc.last) {
			break
		}
		t := lc.targets[lc.i]
		r.cfg.Fleet.Begin(t)
		lc.connect(t, false)
		return
	}
	e := r.exhausted(lc.st, lc.c, lc.last)
	lc.end()
	lc.respondError(e)
}

// connect sends the attempt on an idle connection to t's Tier-1, or on a
// new one (fresh: never a reused one, after a stale one failed).
func (lc *loopCall) connect(t regions.Target, fresh bool) {
	lc.gen++
	lc.phase, lc.status = upHead, 0
	a := lc.s.tier1(t.Tier1)
	pool := lc.s.pool(lc.cc.c.EventLoop())
	lc.ls = pool
	var up *upConn
	if !fresh {
		up = pool.get(a.hostport, time.Now())
	}
	lc.stale = up != nil
	lc.cc.watch(&lc.c.watch)
	lc.c.watch.arm(lc.r.headerTimeout(lc.c), lc.timeoutFunc())
	if up != nil {
		up.owner = lc
		lc.up = up
		lc.send(a)
		return
	}
	up = &upConn{s: lc.s, pool: pool, addr: a.hostport, owner: lc}
	lc.up = up
	gen := lc.gen
	el := lc.cc.c.EventLoop()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
		defer cancel()
		nc, err := lc.s.dialer.DialContext(ctx, "tcp", a.hostport)
		if err == nil {
			var done <-chan gnet.RegisteredResult
			if done, err = el.Enroll(gnet.NewContext(ctx, up), nc); err == nil {
				if res := <-done; res.Err != nil {
					err = res.Err
				}
			} else {
				nc.Close()
			}
		}
		if err != nil {
			el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
				if up.owner == lc && lc.gen == gen {
					lc.failed(&attemptErr{reason: "connect", result: regions.Failure, cause: err})
				}
				return nil
			}))
		}
	}()
}

// watch lends w the connection's watchdog timer (made on first use),
// unless w has its own.
func (cc *clientConn) watch(w *watchdog) {
	if w.t != nil {
		return
	}
	if cc.watchT == nil {
		cc.watchT = time.AfterFunc(time.Duration(1<<62), func() {
			if w := cc.watching.Load(); w != nil {
				w.fire() // a firing meant for an earlier call finds this one's limits and re-arms
			}
		})
	}
	w.t = cc.watchT
	cc.watching.Store(w)
}

// timeoutFunc is the watchdog's cancel for the current attempt: the loop
// learns of it.
func (lc *loopCall) timeoutFunc() context.CancelCauseFunc {
	gen, el := lc.gen, lc.cc.c.EventLoop()
	return func(cause error) {
		el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error { lc.expire(gen, cause); return nil }))
	}
}

// connected: the attempt's new connection is up.
func (lc *loopCall) connected() {
	lc.send(lc.s.tier1(lc.targets[lc.i].Tier1))
}

// send writes the request to the attempt's connection.
func (lc *loopCall) send(a *tier1Addr) {
	r, c := lc.r, lc.c
	b := lc.ls.scratch[:0]
	b = append(b, "POST "...)
	b = append(b, a.prefix...)
	b = append(b, lc.req.URL.EscapedPath()...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, a.host...)
	b = append(b, "\r\n"...)
	for k, vs := range lc.req.Header {
		if passedOn(k) && !identityHeader(k) {
			b = appendField(b, k, vs...)
		}
	}
	band := c.band.String()
	b = appendField(b, "X-Meridian-Tenant", c.caller.Tenant)
	b = appendField(b, "X-Meridian-Band", band)
	b = appendField(b, "X-Gateway-Inference-Fairness-Id", c.caller.Tenant)
	if r.cfg.Tier1Key != nil {
		b = appendField(b, trust.Header, trust.Sign(r.cfg.Tier1Key, c.caller.Tenant, band, r.cfg.Now()))
	}
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, lc.body.size(), 10)
	b = append(b, "\r\n\r\n"...)
	lc.ls.scratch = b[:0]
	iov := append(lc.iov[:0], b)
	iov = append(iov, lc.body.parts[:lc.body.n]...)
	lc.up.c.Writev(iov)
	clear(lc.iov[:])
}

// identityHeader reports whether k is one of the headers upstreamHeader
// sets for Tier-2 (the caller's were stripped on arrival; these are never
// passed on).
func identityHeader(k string) bool {
	switch k {
	case "X-Meridian-Tenant", "X-Meridian-Band", "X-Gateway-Inference-Fairness-Id", trust.Header:
		return true
	}
	return false
}

// appendField appends header lines "k: v". Values are the caller's (checked
// as net/http's server checks them) or Tier-1's (parsed by net/http);
// line breaks are made spaces all the same, as Header.Write does.
func appendField(b []byte, k string, vs ...string) []byte {
	for _, v := range vs {
		b = append(b, k...)
		b = append(b, ": "...)
		for i := 0; i < len(v); i++ {
			ch := v[i]
			if ch == '\r' || ch == '\n' {
				ch = ' '
			}
			b = append(b, ch)
		}
		b = append(b, "\r\n"...)
	}
	return b
}

// failed: the attempt ended before the first response byte.
func (lc *loopCall) failed(aerr *attemptErr) {
	r, t := lc.r, lc.targets[lc.i]
	lc.c.watch.stop()
	if lc.up != nil {
		lc.up.drop()
		lc.up = nil
	}
	r.cfg.Fleet.End(t, aerr.result)
	lc.last = aerr
	if errors.Is(aerr.cause, errShutdown) {
		lc.end()
		lc.cc.keep = false
		lc.cc.c.Close()
		lc.cc.done()
		return
	}
	r.log.Warn("tier2: cluster failed before responding; failing over", "cluster", t.Cluster, "region", t.Region, "reason", aerr.reason)
	lc.i++
	lc.attempt()
}

// expire: the watchdog fired for attempt gen (a header timeout, the
// stream idle), or Tier-2 is stopping.
func (lc *loopCall) expire(gen uint64, cause error) {
	if lc.ended || lc.gen != gen {
		return
	}
	if lc.phase == upHead {
		reason, status := "timeout", http.StatusGatewayTimeout
		if errors.Is(cause, errShutdown) {
			reason, status = "shutdown", 0
		}
		lc.failed(&attemptErr{reason: reason, status: status, result: regions.Failure, cause: cause})
		return
	}
	if lc.up != nil {
		lc.up.drop()
		lc.up = nil
	}
	lc.midStream(cause)
}

// upstreamGone: the attempt's connection closed.
func (lc *loopCall) upstreamGone(err error) {
	lc.up = nil
	switch {
	case lc.phase == upHead && lc.stale && lc.status == 0:
		// An idle connection the Tier-1 had closed: the request again, on
		// a new one, as net/http's transport does.
		lc.connect(lc.targets[lc.i], true)
	case lc.phase == upHead:
		lc.failed(&attemptErr{reason: "connect", result: regions.Failure, cause: fmt.Errorf("the Tier-1 closed the connection before responding: %v", err)})
	case lc.framing == framedClose:
		lc.complete()
	default:
		lc.midStream(errors.New("upstream closed mid-response"))
	}
}

// traffic handles what the attempt's Tier-1 sent.
func (lc *loopCall) traffic(c gnet.Conn) {
	if lc.phase == upHead {
		buf, _ := c.Peek(-1)
		end := bytes.Index(buf, []byte("\r\n\r\n"))
		if end < 0 {
			if len(buf) > maxResponseHeader {
				lc.failed(&attemptErr{reason: "connect", result: regions.Failure, cause: errors.New("response headers too long")})
			}
			return
		}
		resp, err := parseResponseHead(buf[:end+4], lc.ls.keys, lc.upf[:0])
		c.Discard(end + 4)
		lc.stale = false
		if err != nil {
			lc.failed(&attemptErr{reason: "connect", result: regions.Failure, cause: err})
			return
		}
		if resp.status < 200 { // 100 Continue and the like: the real head follows
			lc.traffic(c)
			return
		}
		lc.status = resp.status
		switch {
		case resp.status >= 500:
			lc.failed(&attemptErr{reason: "5xx", status: resp.status, result: regions.Failure})
			return
		case resp.status == http.StatusTooManyRequests:
			lc.failed(&attemptErr{reason: "429", status: resp.status, result: regions.Overloaded})
			return
		}
		lc.begin(resp)
		if lc.ended || lc.up == nil {
			return
		}
	}
	buf, _ := c.Peek(-1)
	if len(buf) == 0 {
		return
	}
	lc.c.watch.touch()
	n, fin, err := lc.consume(buf)
	c.Discard(n)
	switch {
	case lc.ended:
	case err != nil:
		lc.up.drop()
		lc.up = nil
		lc.midStream(err)
	case fin:
		lc.complete()
	default:
		lc.flush()
	}
}

// appendHead appends the caller's response head: the headers the call
// set (lc.h), the Tier-1's as Router.responseHeader passes them on (its
// fields written as they came, without a map), the rate limiter's, and
// the cluster that served. length and sniff are appendHead's.
func (lc *loopCall) appendHead(b, sniff []byte, length int64) []byte {
	r, c := lc.r, lc.c
	if lc.upType {
		sniff = nil
	}
	b = appendStatus(b, lc.status, lc.h, sniff, !lc.upDate)
	for _, f := range lc.upFields {
		if !passedBack(f.k, r.cfg.ExposeUpstream) || lc.rlOwed && rateLimitHeader(f.k) {
			continue
		}
		if _, set := lc.h[f.k]; set {
			continue
		}
		b = appendField(b, f.k, f.v)
	}
	if lc.rlOwed {
		b = c.rl.AppendHeaders(b)
	}
	b = appendField(b, "X-Meridian-Region", c.served.Region)
	b = appendField(b, "X-Meridian-Cluster", c.served.Cluster)
	return appendFraming(b, lc.status, length, lc.cc.keep)
}

// begin starts relaying a response whose head arrived.
func (lc *loopCall) begin(resp upstreamHead) {
	r, c := lc.r, lc.c
	lc.phase = upBody
	lc.reusable = !resp.close
	switch {
	case resp.chunked:
		lc.framing, lc.dec = framedChunked, chunkDecoder{}
	case resp.length >= 0:
		lc.framing, lc.left = framedLength, resp.length
	default:
		lc.framing, lc.reusable = framedClose, false
	}
	r.served(c, lc.targets[0], lc.targets[lc.i])
	lc.upFields, lc.upType, lc.upDate = resp.fields, resp.contentType != "", resp.date
	c.watch.streaming(r.cfg.StreamIdleTimeout)
	lc.sse = strings.HasPrefix(resp.contentType, "text/event-stream")
	if lc.sse {
		lc.filter = newEventFilter(c)
		lc.head = lc.appendHead(lc.cc.headBuffer(), nil, -1) // leaves with the first events
		lc.out = lc.ls.scratch[:0]
	}
	if lc.framing == framedLength && lc.left == 0 {
		lc.complete()
	}
}

// consume takes body bytes of the response: how many it used, and
// whether the response ended as framed.
func (lc *loopCall) consume(b []byte) (int, bool, error) {
	switch lc.framing {
	case framedLength:
		n := int(min(int64(len(b)), lc.left))
		lc.left -= int64(n)
		lc.data(b[:n])
		if n < len(b) {
			lc.reusable = false // more than announced
			n = len(b)
		}
		return n, lc.left == 0, nil
	case framedChunked:
		n, done, err := lc.dec.feed(b, func(p []byte) error { lc.data(p); return nil })
		if done && n < len(b) {
			lc.reusable = false
			n = len(b)
		}
		return n, done, err
	}
	lc.data(b)
	return len(b), false, nil
}

// data takes decoded body bytes.
func (lc *loopCall) data(p []byte) {
	if len(p) == 0 || lc.ended {
		return
	}
	if !lc.sse {
		if len(lc.whole)+len(p) > maxWholeResponse {
			p = p[:maxWholeResponse-len(lc.whole)]
		}
		lc.whole = append(lc.whole, p...)
		return
	}
	lc.markFirst("true")
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(lc.partial)+len(p) > maxEventLine {
				lc.partial = lc.partial[:0]
				return
			}
			lc.partial = append(lc.partial, p...)
			return
		}
		line := p[:i+1]
		p = p[i+1:]
		if len(lc.partial) > 0 {
			lc.partial = append(lc.partial, line...)
			line = lc.partial
		}
		lc.line(line)
		lc.partial = lc.partial[:0]
	}
}

// line relays one event-stream line.
func (lc *loopCall) line(line []byte) {
	line, ev, drop := lc.filter.line(&lc.acct, line)
	if !drop {
		lc.out = append(lc.out, line...)
	}
	lc.acct.commit(ev)
}

// flush writes what this read relays to the caller, as one chunk.
func (lc *loopCall) flush() {
	if len(lc.out) == 0 || lc.ended {
		return
	}
	lc.emit(nil)
	cc := lc.cc
	if !cc.closed && cc.c.OutboundBuffered() > maxCallerBacklog {
		if lc.up != nil {
			lc.up.drop()
			lc.up = nil
		}
		lc.settleAndEnd(lc.acct.tokens(lc.c))
		lc.r.finished(lc.st, lc.c, lc.targets[lc.i], lc.status)
		cc.keep = false
		cc.c.Close()
		cc.done()
	}
}

// emit writes, in one system call, the response head if it has not left
// yet, what this read relays (one chunk), and end.
func (lc *loopCall) emit(end []byte) {
	cc := lc.cc
	out := lc.out
	lc.out = lc.out[:0]
	lc.ls.scratch = lc.out // its capacity, for the loop's next call
	if cc.closed {
		return
	}
	iov := lc.iov[:0]
	head := lc.head
	if head != nil {
		iov = append(iov, head)
		lc.head = nil
	}
	if len(out) > 0 {
		h := strconv.AppendInt(lc.chunkHead[:0], int64(len(out)), 16)
		iov = append(iov, append(h, '\r', '\n'), out, crlf)
	}
	if len(end) > 0 {
		iov = append(iov, end)
	}
	if len(iov) > 0 {
		cc.c.Writev(iov) // what the socket did not take is copied
	}
	if head != nil {
		cc.headBuf = head[:0] // written: the connection's next response head goes there
	}
	clear(lc.iov[:])
}

var (
	crlf      = []byte("\r\n")
	lastChunk = []byte("0\r\n\r\n")
)

func (lc *loopCall) markFirst(streamed string) {
	if !lc.first {
		lc.first = true
		c := lc.c
		lc.r.m.firstByte(ttftLabels{c.resolved.Public, c.resolved.Target, streamed}).Observe(lc.r.cfg.Now().Sub(c.start).Seconds())
	}
}

// complete: the response ended as framed. The account is settled before
// anything is written: a write that fails closes the caller's connection
// at once (callerGone), and the call must have ended by then.
func (lc *loopCall) complete() {
	r, c, cc := lc.r, lc.c, lc.cc
	if up := lc.up; up != nil {
		lc.up = nil
		if lc.reusable {
			up.release()
		} else {
			up.drop()
		}
	}
	t := lc.targets[lc.i]
	if !lc.sse {
		lc.markFirst("false")
		b := lc.whole
		if c.resolved.Target != c.resolved.Public {
			from, to := renamePair(c)
			b = bytes.Replace(b, from, to, 1)
		}
		lc.settleAndEnd(usageTokens(b))
		r.finished(lc.st, c, t, lc.status)
		cc.cur = nil
		if !cc.closed {
			head := lc.appendHead(make([]byte, 0, 512+len(b)), b, int64(len(b)))
			cc.c.Write(append(head, b...))
		}
		cc.done()
		return
	}
	if len(lc.partial) > 0 { // the last line, without its newline
		lc.line(lc.partial)
		lc.partial = lc.partial[:0]
	}
	lc.settleAndEnd(lc.acct.tokens(c))
	r.finished(lc.st, c, t, lc.status)
	lc.emit(lastChunk)
	cc.done()
}

// midStream: the response was cut after it began (cause). A stream ends
// with an error event the OpenAI SDKs surface; a whole response cannot be
// answered any more, and its connection closes.
func (lc *loopCall) midStream(cause error) {
	r, c, cc := lc.r, lc.c, lc.cc
	if !lc.sse {
		lc.settleAndEnd(0)
		r.cfg.Fleet.End(lc.targets[lc.i], regions.Success) // it answered; the relay's abort is not its failure
		cc.keep = false
		cc.c.Close()
		cc.done()
		return
	}
	msg, code := "the upstream cluster failed mid-stream", "upstream_failed"
	switch {
	case errors.Is(cause, errStreamIdle):
		msg, code = fmt.Sprintf("the upstream stream sent nothing for %s", r.cfg.StreamIdleTimeout), "stream_idle_timeout"
	case errors.Is(cause, errShutdown):
		msg, code = "the front door is shutting down; retry the request", "shutting_down"
	}
	lc.settleAndEnd(lc.acct.tokens(c))
	r.finished(lc.st, c, lc.targets[lc.i], lc.status)
	lc.out = append(lc.out, `data: {"error":{"message":"`+msg+`","type":"server_error","param":null,"code":"`+code+`"}}`+"\n\n"...)
	lc.emit(lastChunk)
	cc.done()
}

// callerGone: the caller's connection closed with the request in flight.
// What reached it is charged; the attempt ends.
func (lc *loopCall) callerGone() {
	if lc.ended {
		return
	}
	r, c := lc.r, lc.c
	if lc.queued {
		if lc.cancelAdmit() { // left the queue: nothing was admitted or charged
			lc.queued = false
			lc.reject(request.Unavailable("admission", "priority: gave up waiting for admission: the caller went away"))
		}
		return // otherwise admitted just now: admitted sees the caller gone
	}
	if lc.targets == nil || lc.i >= len(lc.targets) { // answering already
		lc.cc.done()
		return
	}
	if lc.up != nil {
		lc.up.drop()
		lc.up = nil
	}
	t := lc.targets[lc.i]
	switch {
	case lc.phase == upHead:
		r.cfg.Fleet.End(t, regions.Failure)
		lc.settleAndEnd(0)
	case lc.sse:
		lc.settleAndEnd(lc.acct.tokens(c))
		r.finished(lc.st, c, t, lc.status)
	default:
		lc.settleAndEnd(0)
		r.finished(lc.st, c, t, lc.status)
	}
	lc.cc.done()
}

// settleAndEnd settles the tokens served and ends the call's hold on
// admission and its timers.
func (lc *loopCall) settleAndEnd(used int64) {
	lc.r.settle(lc.c, used)
	lc.end()
}

func (lc *loopCall) end() {
	if lc.ended {
		return
	}
	lc.ended = true
	lc.c.watch.stop()
	if lc.ls != nil {
		delete(lc.ls.active, lc)
	}
	lc.c.ticket.Done()
	if !lc.c.settled {
		lc.r.settle(lc.c, 0)
	}
}

// upConn is a keep-alive connection to a Tier-1 on one loop.
type upConn struct {
	s     *LoopServer
	pool  *loopState
	addr  string
	c     gnet.Conn
	owner *loopCall // nil while idle
	used  time.Time // when it went idle
	done  bool      // closed, or closing
}

func (u *upConn) open(c gnet.Conn) {
	u.c = c
	if u.owner == nil || u.owner.up != u || u.owner.ended {
		u.owner = nil
		u.drop()
		return
	}
	u.owner.connected()
}

func (u *upConn) traffic() {
	if u.owner == nil { // an idle connection has nothing to say
		u.drop()
		return
	}
	u.owner.traffic(u.c)
}

func (u *upConn) gone(err error) {
	u.done = true
	if lc := u.owner; lc != nil {
		u.owner = nil
		if lc.up == u && !lc.ended {
			lc.upstreamGone(err)
		}
		return
	}
	u.pool.remove(u)
}

// drop closes the connection, whoever held it.
func (u *upConn) drop() {
	u.owner = nil
	if !u.done {
		u.done = true
		if u.c != nil {
			u.c.Close()
		}
	}
	u.pool.remove(u)
}

// release returns the connection to its pool.
func (u *upConn) release() {
	u.owner = nil
	if u.done || u.c.InboundBuffered() > 0 {
		u.drop()
		return
	}
	u.used = time.Now()
	u.pool.put(u)
}

// enter and leave bracket the loop's handlers. A request admission
// releases meanwhile (most often by a ticket the handler itself returned)
// goes on before the handler returns, instead of waking the loop through
// its queue (a write to an eventfd and another turn of epoll_wait).
func (ls *loopState) enter() {
	ls.mu.Lock()
	ls.running = true
	ls.mu.Unlock()
}

func (ls *loopState) leave() {
	for {
		ls.mu.Lock()
		if len(ls.released) == 0 {
			ls.running = false
			ls.mu.Unlock()
			return
		}
		batch := ls.released
		ls.released = nil
		ls.mu.Unlock()
		for _, lc := range batch {
			lc.admitted()
		}
	}
}

// later continues lc, released by admission, on its loop. It is called
// from any goroutine.
func (ls *loopState) later(lc *loopCall) {
	ls.mu.Lock()
	if ls.running {
		ls.released = append(ls.released, lc)
		ls.mu.Unlock()
		return
	}
	ls.mu.Unlock()
	ls.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
		ls.enter()
		lc.admitted()
		ls.leave()
		return nil
	}))
}

// loopState is one loop's: its idle Tier-1 connections, by address, and
// the buffer the relay of its current read builds in.
type loopState struct {
	el     gnet.EventLoop
	active map[*loopCall]struct{} // calls on the loop, past admission
	keys   map[string]string      // response header keys, interned

	mu       sync.Mutex
	running  bool        // a handler of the loop runs, and will run released before it returns
	released []*loopCall // admitted while it ran
	idle     map[string][]*upConn
	swept    time.Time
	scratch  []byte
}

// maxIdlePerHost and upIdleTimeout are NewTransport's.
const (
	maxIdlePerHost = 256
	upIdleTimeout  = 90 * time.Second
)

func (s *LoopServer) pool(el gnet.EventLoop) *loopState {
	if p, ok := s.pools.Load(el); ok {
		return p.(*loopState)
	}
	p, _ := s.pools.LoadOrStore(el, &loopState{el: el, idle: map[string][]*upConn{}, keys: map[string]string{}, active: map[*loopCall]struct{}{}})
	return p.(*loopState)
}

func (p *loopState) get(addr string, now time.Time) *upConn {
	if now.Sub(p.swept) > upIdleTimeout/2 {
		p.swept = now
		for _, cs := range p.idle {
			for _, u := range cs {
				if now.Sub(u.used) > upIdleTimeout {
					u.drop()
				}
			}
		}
	}
	cs := p.idle[addr]
	for len(cs) > 0 {
		u := cs[len(cs)-1]
		cs = cs[:len(cs)-1]
		p.idle[addr] = cs
		if !u.done && now.Sub(u.used) <= upIdleTimeout {
			return u
		}
		u.drop()
		cs = p.idle[addr]
	}
	return nil
}

func (p *loopState) put(u *upConn) {
	cs := p.idle[u.addr]
	if len(cs) >= maxIdlePerHost {
		u.drop()
		return
	}
	p.idle[u.addr] = append(cs, u)
}

func (p *loopState) remove(u *upConn) {
	cs := p.idle[u.addr]
	for i, x := range cs {
		if x == u {
			p.idle[u.addr] = append(cs[:i], cs[i+1:]...)
			return
		}
	}
}
