package testkit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// WireCase is raw bytes sent to an HTTP server over one connection, and
// what must come of them: what the caller reads back and what reaches the
// server's upstream. The differential suites of both tiers' front doors
// (tier2 and tier1/proxy) are tables of these.
//
// Once the caller has read the responses it expects (Statuses), it sends
// one more request on the connection, the sentinel (Wire.Sentinel), and
// reads its answer: a response the server wrote for bytes it should not
// have read as a request (a smuggled one) comes before the sentinel's and
// fails the case. A case that Stalls or HalfCloses sends no sentinel.
type WireCase struct {
	Name string
	// Pieces are written in order, each with its own write; a piece with
	// AwaitInterim first waits for an interim (1xx) response, as a client
	// that sent Expect: 100-continue does. Between two pieces the
	// connection rests for a moment, so that a server usually reads them
	// apart (a split size line, a body after its head). Whether it does
	// must not change the outcome: the wanted outcome holds either way.
	Pieces []WirePiece
	// Methods are the methods of the requests whose responses are read,
	// in order (HEAD responses have no body); missing entries mean POST.
	Methods []string
	// Stall: after its pieces the client sends nothing more and waits for
	// the server to give up on it (a slow or stalled client).
	Stall bool
	// HalfClose: after its pieces the client closes its side for writing
	// and reads what comes until the server closes the connection.
	HalfClose bool
	// Statuses are the final responses the caller reads, in order,
	// sentinel's excluded. Interim counts interim (1xx) responses.
	Statuses []int
	Interim  int
	// Upstream is what reaches the upstream, in order: one entry per
	// request, as the recorder names it (WireRecorder.Name). Empty:
	// nothing may reach it.
	Upstream []string
	// Check, when set, is called with each final response and its body.
	Check func(t *testing.T, i int, resp *http.Response, body []byte)
}

// WirePiece is one write of a WireCase.
type WirePiece struct {
	Bytes        []byte
	AwaitInterim bool
}

// Pieces makes a WireCase's pieces from strings.
func Pieces(ss ...string) []WirePiece {
	ps := make([]WirePiece, len(ss))
	for i, s := range ss {
		ps[i] = WirePiece{Bytes: []byte(s)}
	}
	return ps
}

// Wire is a server under test: its address, its handler (tracked, so
// that a check can wait for the requests it still serves once the
// caller's connection has ended), the recorder of its upstream, and the
// sentinel request it answers with SentinelBody.
type Wire struct {
	Addr         string
	Front        *Tracked
	Upstream     *WireRecorder
	Sentinel     string // a whole GET request
	SentinelBody string
	// ReadFor bounds every wait of one case.
	ReadFor time.Duration
}

// WireResult is what the caller read: final responses in order, with
// their bodies, and how many interim responses came before them.
type WireResult struct {
	Responses []*http.Response
	Bodies    [][]byte
	Interim   int
	// Sentinel: the sentinel was sent, and its answer is the last of
	// Responses if the server gave one.
	Sentinel bool
	// Closed: the server ended the connection (a response said so, or
	// the read ended at the connection's end).
	Closed bool
	// Err is why reading stopped, when not at the connection's end.
	Err error
}

// Send sends c's pieces over a new TCP connection and reads responses
// until the server closes the connection, the sentinel is answered, or
// ReadFor passes.
func (wr *Wire) Send(tb testing.TB, c WireCase) WireResult {
	tb.Helper()
	conn, err := net.DialTimeout("tcp", wr.Addr, wr.ReadFor)
	if err != nil {
		tb.Fatalf("%s: dial: %v", c.Name, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(wr.ReadFor))
	br := bufio.NewReader(conn)
	var (
		res          WireResult
		mu           sync.Mutex
		sentinelSent = make(chan struct{})
	)
	interim := make(chan struct{}, 16)
	answered := make(chan struct{}) // the responses c expects have been read
	readDone := make(chan struct{})
	method := func(i int) string {
		if i < len(c.Methods) && c.Methods[i] != "" {
			return c.Methods[i]
		}
		if i >= len(c.Statuses) {
			return http.MethodGet // the sentinel
		}
		return http.MethodPost
	}
	// The reader runs beside the writer: a server may answer (or refuse)
	// before the client has sent everything.
	go func() {
		defer close(readDone)
		signalled := false
		if len(c.Statuses) == 0 {
			close(answered)
			signalled = true
		}
		for {
			n := len(res.Responses)
			resp, err := http.ReadResponse(br, &http.Request{Method: method(n)})
			if err != nil {
				mu.Lock()
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
					res.Closed = true
				} else {
					res.Err = err
				}
				mu.Unlock()
				return
			}
			if resp.StatusCode >= 100 && resp.StatusCode < 200 {
				mu.Lock()
				res.Interim++
				mu.Unlock()
				interim <- struct{}{}
				continue
			}
			body, err := io.ReadAll(resp.Body)
			mu.Lock()
			res.Responses = append(res.Responses, resp)
			res.Bodies = append(res.Bodies, body)
			mu.Unlock()
			if err != nil || resp.Close {
				mu.Lock()
				res.Closed = res.Closed || resp.Close
				mu.Unlock()
				return
			}
			if n+1 >= len(c.Statuses) && !signalled {
				close(answered)
				signalled = true
			}
			if n+1 > len(c.Statuses) {
				select {
				case <-sentinelSent:
					return // the sentinel's answer, or one before it that should not be
				default:
				}
			}
		}
	}()
	for i, p := range c.Pieces {
		if p.AwaitInterim {
			select {
			case <-interim:
			case <-readDone:
			}
		} else if i > 0 {
			time.Sleep(20 * time.Millisecond) // not synchronisation: see WireCase.Pieces
		}
		if _, err := conn.Write(p.Bytes); err != nil {
			break // the server closed the connection: what it answered is read below
		}
	}
	switch {
	case c.Stall:
	case c.HalfClose:
		conn.(*net.TCPConn).CloseWrite()
	default:
		select {
		case <-answered:
			mu.Lock()
			res.Sentinel = true
			close(sentinelSent)
			mu.Unlock()
			conn.Write([]byte(wr.Sentinel))
		case <-readDone:
		}
	}
	<-readDone
	return res
}

// isReset reports a connection reset by the server: after it refused a
// request and closed with unread bytes, what the caller reads ends there.
func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && strings.Contains(ne.Err.Error(), "connection reset")
}

// Check sends c (Send) and checks what the caller read and what reached
// the upstream.
func (wr *Wire) Check(t *testing.T, c WireCase) {
	t.Helper()
	wr.Upstream.Reset()
	res := wr.Send(t, c)
	var got []int
	for _, r := range res.Responses {
		got = append(got, r.StatusCode)
	}
	// The sentinel is answered last, unless the server closed the
	// connection after the responses the case expects.
	want := slices.Clone(c.Statuses)
	if res.Sentinel && !(res.Closed && len(got) == len(c.Statuses)) {
		want = append(want, http.StatusOK)
		if n := len(res.Bodies); n == 0 || string(res.Bodies[n-1]) != wr.SentinelBody {
			t.Errorf("the last response is not the sentinel's (a request was read where none was sent)")
		}
	}
	if !slices.Equal(got, want) || res.Interim != c.Interim {
		var b strings.Builder
		for i, body := range res.Bodies {
			fmt.Fprintf(&b, "\n  %d: %.300q", got[i], body)
		}
		t.Errorf("caller read statuses %v with %d interim (read error: %v), want %v with %d (sentinel last: %v)%s",
			got, res.Interim, res.Err, want, c.Interim, res.Sentinel, b.String())
	}
	if c.Check != nil {
		for i, r := range res.Responses {
			if i < len(c.Statuses) {
				c.Check(t, i, r, res.Bodies[i])
			}
		}
	}
	// A request the front door still serves once the caller's connection
	// has ended may yet reach the upstream: wait for both to be idle.
	wr.Front.Wait()
	wr.Upstream.Wait()
	if seen := wr.Upstream.Seen(); !slices.Equal(seen, c.Upstream) {
		t.Errorf("upstream saw %q, want %q", seen, c.Upstream)
	}
}

// WireRecorder is an upstream's handler wrapper that records, in order,
// the name Name gives each request that reaches it. It answers what next
// answers.
type WireRecorder struct {
	// Name names a request as it reached the upstream, with its body
	// (read whole); it is what WireCase.Upstream lists.
	Name func(r *http.Request, body []byte) string
	next http.Handler

	mu   sync.Mutex
	seen []string
	Tracked
}

// NewWireRecorder records what reaches next.
func NewWireRecorder(next http.Handler, name func(r *http.Request, body []byte) string) *WireRecorder {
	rec := &WireRecorder{Name: name, next: next}
	rec.Tracked.Handler = http.HandlerFunc(rec.serve)
	return rec
}

func (rec *WireRecorder) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	name := rec.Name(r, body)
	if err != nil {
		name += " (body: " + err.Error() + ")"
	}
	rec.mu.Lock()
	rec.seen = append(rec.seen, name)
	rec.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	rec.next.ServeHTTP(w, r)
}

// Seen returns the names of the requests recorded since the last Reset.
func (rec *WireRecorder) Seen() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]string(nil), rec.seen...)
}

// Reset forgets what was seen.
func (rec *WireRecorder) Reset() {
	rec.mu.Lock()
	rec.seen = nil
	rec.mu.Unlock()
}

// Tracked is a handler that knows how many requests it is serving.
type Tracked struct {
	Handler http.Handler
	mu      sync.Mutex
	cond    *sync.Cond
	active  int
}

// Track wraps h.
func Track(h http.Handler) *Tracked { return &Tracked{Handler: h} }

func (h *Tracked) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.active++
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.active--
		if h.cond != nil {
			h.cond.Broadcast()
		}
		h.mu.Unlock()
	}()
	h.Handler.ServeHTTP(w, r)
}

// Wait returns once no request is being served.
func (h *Tracked) Wait() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cond == nil {
		h.cond = sync.NewCond(&h.mu)
	}
	for h.active > 0 {
		h.cond.Wait()
	}
}
