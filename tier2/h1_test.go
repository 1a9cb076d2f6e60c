package tier2

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// countingH1 is Tier-2's transport with its dials counted.
func countingH1(t *testing.T) (*h1Transport, *atomic.Int32) {
	t.Helper()
	tr := newH1Transport(newHTTPTransport())
	var dials atomic.Int32
	dial := tr.dial
	tr.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr, &dials
}

func post(t *testing.T, ctx context.Context, tr http.RoundTripper, url, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
	return tr.RoundTrip(req)
}

// fetch posts body and reads the whole answer.
func fetch(t *testing.T, ctx context.Context, tr http.RoundTripper, url, body string) string {
	t.Helper()
	resp, err := post(t, ctx, tr, url, body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Requests read to their end share one connection, streamed (chunked) or
// not; the body sent is the body received.
func TestH1ReusesConnections(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/stream" {
			w.Write(b)
			w.(http.Flusher).Flush() // chunked
			w.Write([]byte(" and more"))
			return
		}
		w.Write(b)
	}))
	defer up.Close()
	tr, dials := countingH1(t)
	for i, path := range []string{"/plain", "/stream", "/plain", "/stream"} {
		got := fetch(t, t.Context(), tr, up.URL+path, "hello")
		want := "hello"
		if path == "/stream" {
			want += " and more"
		}
		if got != want {
			t.Fatalf("request %d to %s: %q, want %q", i, path, got, want)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("4 requests dialled %d connections, want 1", n)
	}
}

// A connection the Tier-1 closed while it was idle is found out when it is
// used: the request is sent again on a new connection, and the caller
// never sees the error.
func TestH1RetriesStaleConnection(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("ok"))
	}))
	up.Start()
	defer up.Close()
	tr, dials := countingH1(t)
	if got := fetch(t, t.Context(), tr, up.URL, "a"); got != "ok" {
		t.Fatalf("first: %q", got)
	}
	up.CloseClientConnections() // the Tier-1 drops its idle connections
	if got := fetch(t, t.Context(), tr, up.URL, "b"); got != "ok" {
		t.Fatalf("after the Tier-1 closed the idle connection: %q", got)
	}
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials, want 2 (the stale connection replaced once)", n)
	}
}

// A body closed before its end, a response that says Connection: close,
// and a connection idle past the idle timeout are never reused.
func TestH1DoesNotReuse(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/close" {
			w.Header().Set("Connection", "close")
		}
		w.Write([]byte(strings.Repeat("x", 100)))
	}))
	defer up.Close()
	t.Run("closed early", func(t *testing.T) {
		tr, dials := countingH1(t)
		resp, err := post(t, t.Context(), tr, up.URL, "a")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Read(make([]byte, 10))
		resp.Body.Close()
		fetch(t, t.Context(), tr, up.URL, "b")
		if n := dials.Load(); n != 2 {
			t.Errorf("%d dials, want 2", n)
		}
	})
	t.Run("connection close", func(t *testing.T) {
		tr, dials := countingH1(t)
		fetch(t, t.Context(), tr, up.URL+"/close", "a")
		fetch(t, t.Context(), tr, up.URL, "b")
		if n := dials.Load(); n != 2 {
			t.Errorf("%d dials, want 2", n)
		}
	})
	t.Run("idle too long", func(t *testing.T) {
		tr, dials := countingH1(t)
		now := time.Now()
		tr.now = func() time.Time { return now }
		fetch(t, t.Context(), tr, up.URL, "a")
		now = now.Add(tr.idleTimeout + time.Second)
		fetch(t, t.Context(), tr, up.URL, "b")
		if n := dials.Load(); n != 2 {
			t.Errorf("%d dials, want 2", n)
		}
	})
}

// A request's context ends the exchange wherever it is: waiting for the
// response headers, and reading the body. The connection is dropped.
func TestH1ContextEndsExchange(t *testing.T) {
	arrived := make(chan struct{}, 2)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/body" {
			w.Write([]byte("first"))
			w.(http.Flusher).Flush()
		}
		arrived <- struct{}{}
		<-r.Context().Done() // a hung Tier-1
	}))
	defer up.Close()
	tr, _ := countingH1(t)

	ctx, cancel := context.WithCancelCause(t.Context())
	go func() {
		<-arrived
		cancel(errors.New("header timeout"))
	}()
	if _, err := post(t, ctx, tr, up.URL+"/headers", "a"); err == nil {
		t.Fatal("a hung Tier-1's headers: no error")
	}

	ctx, cancel2 := context.WithCancel(t.Context())
	resp, err := post(t, ctx, tr, up.URL+"/body", "a")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first" {
		t.Fatalf("first bytes %q, %v", buf, err)
	}
	<-arrived
	cancel2()
	if _, err := resp.Body.Read(buf); err == nil {
		t.Fatal("reading a cancelled stream: no error")
	}
	resp.Body.Close()
	for _, conns := range tr.idle {
		if len(conns) > 0 {
			t.Errorf("a connection whose exchange was cancelled went back to the pool")
		}
	}
}

// A Tier-1 whose response headers do not fit in 16 KiB fails the attempt
// (Tier-2 then tries the next cluster) instead of being read without end.
func TestH1ResponseHeaderLimit(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Big", strings.Repeat("y", maxResponseHeader))
		w.Write([]byte("ok"))
	}))
	defer up.Close()
	tr, _ := countingH1(t)
	_, err := post(t, t.Context(), tr, up.URL, "a")
	if err == nil || !strings.Contains(err.Error(), "response headers exceed") {
		t.Fatalf("%v, want the header limit's error", err)
	}
}

// https Tier-1s go through net/http's transport (HTTP/2 by ALPN).
func TestH1FallbackForTLS(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte(r.Proto))
	}))
	up.EnableHTTP2 = true
	up.StartTLS()
	defer up.Close()
	inner := newHTTPTransport()
	inner.TLSClientConfig = up.Client().Transport.(*http.Transport).TLSClientConfig
	tr := newH1Transport(inner)
	defer tr.CloseIdleConnections()
	if got := fetch(t, t.Context(), tr, up.URL, "a"); got != "HTTP/2.0" {
		t.Errorf("https Tier-1 answered over %q, want HTTP/2.0", got)
	}
}

// Connections to a Tier-1 no longer used (its cluster removed) are closed
// once they have been idle past the idle timeout, when any connection goes
// back to the pool.
func TestH1SweepsIdleHosts(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("ok"))
	})
	gone, kept := httptest.NewServer(handler), httptest.NewServer(handler)
	defer gone.Close()
	defer kept.Close()
	tr, _ := countingH1(t)
	now := time.Now()
	tr.now = func() time.Time { return now }
	fetch(t, t.Context(), tr, gone.URL, "a")
	fetch(t, t.Context(), tr, kept.URL, "a")
	now = now.Add(tr.idleTimeout + time.Second)
	fetch(t, t.Context(), tr, kept.URL, "b") // its stale connection replaced, the sweep runs on put
	if n := len(tr.idle[gone.Listener.Addr().String()]); n != 0 {
		t.Errorf("%d connections to the unused Tier-1 still open past the idle timeout", n)
	}
	if n := len(tr.idle[kept.Listener.Addr().String()]); n != 1 {
		t.Errorf("%d idle connections to the Tier-1 in use, want 1", n)
	}
}
