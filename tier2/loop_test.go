package tier2

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
)

// loopDoor is newDoor's front door served by a LoopServer whichever pass
// TestMain runs: for what only the event loops do.
func loopDoor(t *testing.T, upstreams ...string) (*door, *LoopServer) {
	t.Helper()
	d := newDoorRouter(t, nil, upstreams...)
	s, addr := startLoopServer(t, d.r, d.r.Handler(), func() { d.handled <- struct{}{} })
	d.url = "http://" + addr
	return d, s
}

// rawExchange writes req on a new connection and reads n responses.
func rawExchange(t *testing.T, addr, req string, n int) []*http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second)) // a hang fails, slowly
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var out []*http.Response
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d of %d: %v", len(out)+1, n, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(strings.NewReader(string(b)))
		out = append(out, resp)
	}
	return out
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// The event loops read HTTP/1.1 as net/http's server does: pipelined
// requests answered in order, a malformed head a 400, headers past the
// limit a 431, a chunked body decoded, 100 Continue for a caller that
// waits for it, h2c handed to net/http.
func TestLoopServerHTTP(t *testing.T) {
	var got atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(string(b))
		usageUpstream(w, r)
	}))
	defer up.Close()
	d, _ := loopDoor(t, up.URL)
	addr := strings.TrimPrefix(d.url, "http://")
	tok := d.token(t, "team", nil)

	rs := rawExchange(t, addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 2)
	for i, r := range rs {
		if r.StatusCode != 200 || body(t, r) != "ok\n" {
			t.Fatalf("pipelined response %d: %d", i, r.StatusCode)
		}
	}
	if r := rawExchange(t, addr, "GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 1)[0]; r.StatusCode != 400 || !r.Close {
		t.Fatalf("malformed header: %d (close %v), want 400 and close", r.StatusCode, r.Close)
	}
	if r := rawExchange(t, addr, "GET /healthz HTTP/1.1\r\n\r\n", 1)[0]; r.StatusCode != 400 {
		t.Fatalf("no Host: %d, want 400", r.StatusCode)
	}
	if r := rawExchange(t, addr, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: "+strings.Repeat("x", 80<<10)+"\r\n\r\n", 1)[0]; r.StatusCode != 431 {
		t.Fatalf("80 KiB of headers: %d, want 431", r.StatusCode)
	}

	const req = `{"model":"chat-model","prompt":"x"}`
	chunked := "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: " + tok + "\r\nTransfer-Encoding: chunked\r\n\r\n" +
		fmt.Sprintf("%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n", 10, req[:10], len(req)-10, req[10:])
	if r := rawExchange(t, addr, chunked, 1)[0]; r.StatusCode != 200 || got.Load() != req || r.Close {
		t.Fatalf("chunked body: %d (close %v), upstream read %q", r.StatusCode, r.Close, got.Load())
	}
	// Chunks and a length both: the chunks are read, and the connection
	// closes after (what follows cannot be trusted to be a request).
	smuggle := strings.Replace(chunked, "Transfer-Encoding: chunked\r\n", "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", 1)
	if r := rawExchange(t, addr, smuggle, 1)[0]; r.StatusCode != 200 || got.Load() != req || !r.Close {
		t.Fatalf("chunked body with a length: %d (close %v), upstream read %q", r.StatusCode, r.Close, got.Load())
	}

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", tok, len(req))
	br := bufio.NewReader(c)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("before the body: %q, %v; want 100 Continue", line, err)
	}
	br.ReadString('\n')
	io.WriteString(c, req)
	if r, err := http.ReadResponse(br, nil); err != nil || r.StatusCode != 200 {
		t.Fatalf("after 100 Continue: %v %v", r, err)
	}

	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h2 := &http.Client{Transport: &http.Transport{Protocols: &protos}}
	resp, err := h2.Get(d.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 || resp.StatusCode != 200 || body(t, resp) != "ok\n" {
		t.Fatalf("h2c: %s %d", resp.Proto, resp.StatusCode)
	}
	resp.Body.Close()
}

// A loop keeps its Tier-1 connections: requests in turn use one, and a
// connection the Tier-1 closed while idle is replaced without a failed
// request.
func TestLoopServerUpstreamConnections(t *testing.T) {
	var conns atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(usageUpstream))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	up.Start()
	defer up.Close()
	d, _ := loopDoor(t, up.URL)
	tok := d.token(t, "team", nil)
	post := func() {
		t.Helper()
		resp := d.post(t, t.Context(), tok, "/v1/completions", `{"model":"chat-model","prompt":"x"}`, nil)
		if b := body(t, resp); resp.StatusCode != 200 || !strings.Contains(b, `"total_tokens":300`) {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		resp.Body.Close()
		<-d.handled
	}
	// The first request verifies the token on a goroutine (and reaches
	// the Tier-1 with net/http's client); the second opens the loop's
	// connection.
	post()
	post()
	n0 := conns.Load()
	for range 5 {
		post()
	}
	if n := conns.Load(); n != n0 {
		t.Fatalf("5 requests in turn opened %d more Tier-1 connections, want none", n-n0)
	}
	up.CloseClientConnections() // the Tier-1 drops its idle connections
	post()
	if n := conns.Load(); n != n0+1 {
		t.Fatalf("after the Tier-1 closed its connections: %d new ones, want 1", n-n0)
	}
}

// Shutdown lets a stream in flight finish, and then returns; a caller
// that connects meanwhile is not served.
func TestLoopServerShutdown(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(`data: {"id":"c","model":"chat-model","choices":[{"index":0,"text":"a"}]}` + "\n\n"))
		w.(http.Flusher).Flush()
		<-release
		w.Write([]byte("data: [DONE]\n\n"))
	}))
	defer up.Close()
	d, s := loopDoor(t, up.URL)
	resp := d.post(t, t.Context(), d.token(t, "team", nil), "/v1/completions", `{"model":"chat-model","prompt":"x","stream":true}`, nil)
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first event %q", line)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	testkit.Eventually(t, "Shutdown began", s.draining.Load)
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) with a stream in flight", err)
	default:
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the stream's end: %q", rest)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if _, err := http.Get(d.url + "/healthz"); err == nil {
		t.Fatal("a caller was served after Shutdown")
	}
}

// A LoopServer closed while its loops start (a process told to stop as it
// comes up) ends Serve with http.ErrServerClosed, at once, rather than with
// a start-up error after the probe's timeout.
func TestLoopServerClosedWhileStarting(t *testing.T) {
	t.Run("probe", func(t *testing.T) {
		// A socket that takes the probe's connection and never opens it on
		// a loop: the window between the engine's boot and its loops.
		sock := filepath.Join(t.TempDir(), "loops.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		s := &LoopServer{sock: sock, running: make(chan struct{}), closing: make(chan struct{})}
		s.closeDown()
		if err := s.probe(); !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("probe after Close: %v, want http.ErrServerClosed", err)
		}
	})
	t.Run("serve", func(t *testing.T) {
		d := newDoorRouter(t, nil, "http://127.0.0.1:1") // never called
		for i := range 8 {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			s := NewLoopServer(d.r, d.r.Handler(), LoopConfig{})
			served := make(chan error, 1)
			go func() { served <- s.Serve(ln) }()
			if i%2 == 1 {
				select { // inside the window, or just after it
				case <-s.booted:
				case <-time.After(time.Minute):
					t.Fatal("the engine did not boot")
				}
			}
			s.Close()
			if err := <-served; !errors.Is(err, http.ErrServerClosed) {
				t.Fatalf("round %d: Serve: %v, want http.ErrServerClosed", i, err)
			}
		}
	})
}

// parseResponseHead reads what net/http reads of a response head, and
// refuses what it cannot frame.
func TestParseResponseHead(t *testing.T) {
	good := []string{
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 12\r\ncontent-type: application/json\r\nX-A: 1\r\nX-A: 2\r\n\r\n",
		"HTTP/1.1 200 OK\r\nDate: Sat, 05 Dec 2026 04:00:00 GMT\r\nContent-Type: text/plain\r\nContent-Type: text/html\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\n",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\n",
		"HTTP/1.1 200\r\nContent-Length: 1\r\n\r\n",
	}
	for _, head := range good {
		h, err := parseResponseHead([]byte(head), map[string]string{}, nil)
		if err != nil {
			t.Fatalf("%q: %v", head, err)
		}
		header := http.Header{}
		for _, f := range h.fields {
			header[f.k] = append(header[f.k], f.v)
		}
		want, err := http.ReadResponse(bufio.NewReader(strings.NewReader(head)), nil)
		if err != nil {
			t.Fatal(err)
		}
		chunked := len(want.TransferEncoding) > 0
		if h.status != want.StatusCode || h.chunked != chunked || h.close != want.Close ||
			(!chunked && h.length != want.ContentLength) || fmt.Sprint(dropFraming(header)) != fmt.Sprint(dropFraming(want.Header)) ||
			h.contentType != want.Header.Get("Content-Type") || h.date != (want.Header.Get("Date") != "") {
			t.Errorf("%q: got %d %v %d close %v %v; net/http %d %v %d close %v %v", head, h.status, h.chunked, h.length, h.close, header,
				want.StatusCode, want.TransferEncoding, want.ContentLength, want.Close, want.Header)
		}
	}
	for _, head := range []string{
		"HTTP/2 200 OK\r\n\r\n",
		"HTTP/1.1 2x0 OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n",
		"HTTP/1.1 200 OK\r\nBad Key: 1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-A: 1",
	} {
		if _, err := parseResponseHead([]byte(head), map[string]string{}, nil); err == nil {
			t.Errorf("%q: accepted", head)
		}
	}
}

// dropFraming is a response's headers without those of its framing,
// which the caller never sees (net/http moves some out of the map).
func dropFraming(h http.Header) http.Header {
	out := h.Clone()
	for _, k := range []string{"Transfer-Encoding", "Connection"} {
		delete(out, k)
	}
	return out
}

// chunkDecoder decodes a chunked body however its bytes are split.
func TestChunkDecoder(t *testing.T) {
	enc := "5\r\nhello\r\n1;ext=1\r\n \r\n10\r\n0123456789abcdef\r\n0\r\nTrailer: x\r\n\r\nNEXT"
	for split := 1; split <= len(enc); split++ {
		var d chunkDecoder
		var got []byte
		pending := ""
		done := false
		for i := 0; i < len(enc) && !done; i += split {
			pending += enc[i:min(i+split, len(enc))]
			n, fin, err := d.decode([]byte(pending), &got, 1<<20)
			if err != nil {
				t.Fatalf("split %d: %v", split, err)
			}
			pending, done = pending[n:], fin
		}
		if string(got) != "hello 0123456789abcdef" || !done || !strings.HasPrefix(pending, "NEXT"[:min(len(pending), 4)]) {
			t.Fatalf("split %d: %q done %v left %q", split, got, done, pending)
		}
	}
	for _, bad := range []string{"x\r\n", "5\r\nhelloXX", "fffffffffffffffff\r\n", strings.Repeat("1", 5000)} {
		var d chunkDecoder
		var got []byte
		if _, _, err := d.decode([]byte(bad), &got, 1<<20); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
	var d chunkDecoder
	var got []byte
	if _, _, err := d.decode([]byte("10\r\n0123456789abcdef\r\n"), &got, 8); !errors.Is(err, errChunkTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
}

// parseRequestHead reads the heads it accepts exactly as net/http does,
// and leaves the others to it.
func TestParseRequestHead(t *testing.T) {
	accepted := []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: a:1\r\nAuthorization: Bearer x.y.z\r\nContent-Type: application/json\r\nContent-Length: 42\r\n\r\n",
		"GET /healthz HTTP/1.1\r\nhost: x\r\nuser-agent: curl/8\r\naccept: */*\r\n\r\n",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, close\r\nX-A:  1 \r\nX-A: 2\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
	}
	// Each head is read fresh, then (a second pass) into the request the
	// head before it was read into, as the loops reuse an ended call's:
	// the same either way, nothing of the other head left.
	var prev *parsedRequest
	for i := range 2 * len(accepted) {
		head := accepted[i%len(accepted)]
		var reuse *parsedRequest
		if i >= len(accepted) {
			reuse = prev
		}
		h, ok := parseRequestHead([]byte(head), map[string]string{}, reuse)
		if !ok {
			t.Fatalf("%q: refused", head)
		}
		if reuse != nil && h != reuse {
			t.Fatalf("%q: the ended request was not reused", head)
		}
		prev = h
		got := &h.req
		want, err := http.ReadRequest(bufio.NewReader(strings.NewReader(head)))
		if err != nil {
			t.Fatal(err)
		}
		if got.Method != want.Method || got.URL.String() != want.URL.String() || got.RequestURI != want.RequestURI || got.Host != want.Host ||
			got.ContentLength != want.ContentLength || got.Close != want.Close || got.Proto != want.Proto ||
			fmt.Sprint(got.Header) != fmt.Sprint(want.Header) || (got.ContentLength == 0 && want.Body != http.NoBody) {
			t.Errorf("%q:\n got %s %s %q cl %d close %v %v\nwant %s %s %q cl %d close %v %v", head,
				got.Method, got.URL, got.Host, got.ContentLength, got.Close, got.Header,
				want.Method, want.URL, want.Host, want.ContentLength, want.Close, want.Header)
		}
	}
	for _, head := range []string{
		"PUT / HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a?b HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a%20b HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nBad Key: 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\n\r\n",
	} {
		if _, ok := parseRequestHead([]byte(head), map[string]string{}, nil); ok {
			t.Errorf("%q: accepted", head)
		}
	}
}

// A response cut in its body, streamed or whole, and a caller that leaves
// mid-response each end the cluster's in-flight count, on both front
// doors.
func TestCutResponsesEndInFlight(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if strings.Contains(r.Header.Get("X-Test"), "stream") {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Write([]byte(`data: {"id":"c","model":"chat-model","choices":[{"index":0,"text":"a"}]}` + "\n\n"))
			w.(http.Flusher).Flush()
		} else {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "100")
			w.Write([]byte(`{"id":`))
			w.(http.Flusher).Flush()
		}
		c, _, _ := http.NewResponseController(w).Hijack()
		c.Close() // cut before the end
	}))
	defer up.Close()
	d := newDoor(t, nil, up.URL)
	for _, kind := range []string{"whole", "stream"} {
		resp, err := http.DefaultClient.Do(func() *http.Request {
			req, _ := http.NewRequest(http.MethodPost, d.url+"/v1/completions", strings.NewReader(`{"model":"chat-model","prompt":"x"}`))
			req.Header.Set("Authorization", d.token(t, "team", nil))
			req.Header.Set("X-Test", kind)
			return req
		}())
		if err == nil {
			io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		<-d.handled
	}
	for _, st := range d.r.cfg.Fleet.Status() {
		if st.InFlight != 0 {
			t.Fatalf("cluster %s: %d requests still in flight after both ended", st.Cluster, st.InFlight)
		}
	}
}

// The loops read bodies into reused buffers: a request sends Tier-1
// exactly its own body, never what a longer one before it left in the
// buffer, and a body handed to a goroutine (a token not yet verified) is
// not reused under it.
func TestLoopServerReusedBodies(t *testing.T) {
	var mu sync.Mutex
	var got []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, string(b))
		mu.Unlock()
		usageUpstream(w, r)
	}))
	defer up.Close()
	d, _ := loopDoor(t, up.URL)
	addr := strings.TrimPrefix(d.url, "http://")
	a, b := d.token(t, "team", nil), d.token(t, "support", nil)
	long := `{"model":"chat-model","prompt":"` + strings.Repeat("secret of team ", 1000) + `"}`
	short := `{"model":"chat-model","prompt":"hello"}`
	post := func(tok, body string) string {
		return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: " + tok + "\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	// One connection: the first of each token goes to a goroutine (its
	// verification), the rest are served on the loop, in turn.
	rs := rawExchange(t, addr, post(a, long)+post(a, long)+post(b, short)+post(b, short)+post(a, long), 5)
	for i, r := range rs {
		if r.StatusCode != 200 {
			t.Fatalf("response %d: %d %s", i, r.StatusCode, body(t, r))
		}
		body(t, r)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{long, long, short, short, long}
	if len(got) != len(want) {
		t.Fatalf("Tier-1 got %d requests, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d reached Tier-1 as %.80q…, want %.80q…", i, got[i], want[i])
		}
	}
}

// The calls on a connection share one response header map, cleared
// between them: a header one response carried (here an upstream's, set on
// one request only) is not in the next response on the same connection.
func TestLoopServerResponseHeadersNotCarriedOver(t *testing.T) {
	var n atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 2 { // the first loop-served request (the first goes to a goroutine: token verification)
			w.Header().Set("X-Team-Secret", "for team only")
		}
		usageUpstream(w, r)
	}))
	defer up.Close()
	d, _ := loopDoor(t, up.URL)
	addr := strings.TrimPrefix(d.url, "http://")
	a := d.token(t, "team", nil)
	req := "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: " + a + "\r\nContent-Length: 39\r\n\r\n" + `{"model":"chat-model","prompt":"hello"}`
	rs := rawExchange(t, addr, req+req+req+req, 4)
	for i, r := range rs {
		body(t, r)
		if r.StatusCode != 200 {
			t.Fatalf("response %d: %d", i, r.StatusCode)
		}
		if got, want := r.Header.Get("X-Team-Secret") != "", i == 1; got != want {
			t.Errorf("response %d carries X-Team-Secret: %v; want %v", i, got, want)
		}
		if r.Header.Get("X-Meridian-Cluster") == "" {
			t.Errorf("response %d lost its own headers: %v", i, r.Header)
		}
	}
}

// A connection's requests on the loop share one parsed request: a header
// one request carried never reaches Tier-1 with the next.
func TestLoopServerRequestHeadersNotCarriedOver(t *testing.T) {
	var mu sync.Mutex
	var notes []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		note, ok := r.Header["X-Team-Note"]
		if !ok {
			note = []string{"(none)"}
		}
		notes = append(notes, strings.Join(note, ","))
		mu.Unlock()
		usageUpstream(w, r)
	}))
	defer up.Close()
	d, _ := loopDoor(t, up.URL)
	addr := strings.TrimPrefix(d.url, "http://")
	a := d.token(t, "team", nil)
	req := func(note string) string {
		h := "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: " + a + "\r\n"
		if note != "" {
			h += "X-Team-Note: " + note + "\r\n"
		}
		return h + "Content-Length: 39\r\n\r\n" + `{"model":"chat-model","prompt":"hello"}`
	}
	// The first request of a token is verified on a goroutine; the loop
	// serves the others.
	sent := []string{"", "for team only", "", "again", ""}
	var all string
	want := make([]string, len(sent))
	for i, n := range sent {
		all += req(n)
		if want[i] = n; n == "" {
			want[i] = "(none)"
		}
	}
	for i, r := range rawExchange(t, addr, all, len(sent)) {
		if body(t, r); r.StatusCode != 200 {
			t.Fatalf("response %d: %d", i, r.StatusCode)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(notes, want) {
		t.Fatalf("Tier-1 saw X-Team-Note %q; the requests carried %q", notes, want)
	}
}

// The calls on a connection share its watchdog timer: a stream that goes
// quiet is ended with its error event whether it is the connection's
// first request or a later one (the timer stopped by the request before
// is armed again). The idle limit is 50 ms of real time; the upstream
// holds the quiet stream open until the test ends, so the only way the
// response can end is the watchdog.
func TestLoopServerWatchdogAcrossRequests(t *testing.T) {
	var calls atomic.Int32
	stop := make(chan struct{}) // a quiet stream the watchdog missed ends with the test
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(`data: {"id":"c","model":"chat-model","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n"))
		if calls.Add(1)%2 == 1 { // every other stream ends; the rest go quiet
			w.Write([]byte("data: [DONE]\n\n"))
			return
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	defer up.Close()
	defer close(stop)
	d := newDoorRouter(t, func(c *Config) { c.StreamIdleTimeout = 50 * time.Millisecond }, up.URL)
	_, addr := startLoopServer(t, d.r, d.r.Handler(), nil)
	tok := d.token(t, "team", nil)
	chat := `{"model":"chat-model","stream":true,"messages":[{"role":"user","content":"x"}]}`
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: " + tok + "\r\nContent-Length: " + strconv.Itoa(len(chat)) + "\r\n\r\n" + chat
	// The first request of a token is verified on a goroutine: the loop
	// serves the next ones, on one connection.
	rs := rawExchange(t, addr, req+req+req+req+req, 5)
	for i, r := range rs {
		b := body(t, r)
		ended, quiet := strings.Contains(b, "data: [DONE]"), strings.Contains(b, "stream_idle_timeout")
		if r.StatusCode != 200 || ended == quiet {
			t.Errorf("response %d: %d, [DONE] %v, idle error %v: %q", i, r.StatusCode, ended, quiet, b)
		}
	}
}

// A body's buffer grows with what its caller sent, not with what it
// announced (the body is read before the request is authenticated): four
// times what arrived at most, past the first bodyStart bytes; the bytes
// come out as they went in, and a 220 KB prompt read in 64 KiB pieces
// moves once.
func TestBodyBufferGrowsWithWhatArrives(t *testing.T) {
	read := func(announced int, pieces ...int) (cc *clientConn, caps []int) {
		cc = &clientConn{bodyLen: int64(announced), head: &http.Request{ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{}}}
		cc.startBody()
		caps = append(caps, cap(cc.body))
		sent := 0
		for _, n := range pieces {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(sent + i)
			}
			sent += n
			cc.pre = b
			cc.readBody(b)
			if cap(cc.body) != caps[len(caps)-1] {
				caps = append(caps, cap(cc.body))
			}
			if got := cap(cc.body); got > max(bodyStart, 8*sent) { // 4×, and a pooled size rounds up at most 2×
				t.Fatalf("announced %d, sent %d: the buffer holds %d", announced, sent, got)
			}
		}
		for i, c := range cc.body {
			if c != byte(i) {
				t.Fatalf("announced %d: byte %d is %d, want %d", announced, i, c, byte(i))
			}
		}
		return cc, caps
	}
	// Announced 4 MiB, 10 bytes sent: the buffer is bodyStart at most.
	if _, caps := read(4<<20, 10); caps[0] > bodyStart || len(caps) != 1 {
		t.Errorf("4 MiB announced, 10 bytes sent: buffers %v", caps)
	}
	// Sent in full, in uneven pieces: every byte in place.
	pieces := []int{10, 65526, 1}
	for sent := 65537; sent < 4<<20; sent += 70000 {
		pieces = append(pieces, min(70000, 4<<20-sent))
	}
	if cc, _ := read(4<<20, pieces...); len(cc.body) != 4<<20 {
		t.Errorf("4 MiB sent: %d bytes read", len(cc.body))
	}
	// 225,280 bytes in 64 KiB reads: one move, into a buffer that holds it.
	if cc, caps := read(225280, 65536, 65536, 65536, 28672); len(caps) != 2 || len(cc.body) != 225280 {
		t.Errorf("225,280 bytes in 64 KiB reads: buffers %v, %d bytes read", caps, len(cc.body))
	}
}
