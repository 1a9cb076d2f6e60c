package tier2

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Events are flushed in batches (those that arrived together leave in one
// write), but never held behind a read: here the first event arrives with
// the start of the second, and the upstream sends the rest only once the
// caller has the first. A relay that waited for more before flushing
// would never deliver it (the test's 30 s bound fails it).
func TestStreamEventNotHeldBehindARead(t *testing.T) {
	got := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(`data: {"id":"c","model":"chat-model","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n" + `data: {"id":"c",`))
		w.(http.Flusher).Flush()
		select {
		case <-got:
		case <-r.Context().Done():
			return
		}
		w.Write([]byte(`"model":"chat-model","choices":[{"index":0,"delta":{"content":"there"}}]}` + "\n\n" + "data: [DONE]\n\n"))
	}))
	defer up.Close()
	d := newDoor(t, nil, up.URL)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp := d.post(t, ctx, d.token(t, "team", nil), "/v1/chat/completions",
		`{"model":"chat-model","stream":true,"messages":[{"role":"user","content":"x"}]}`, nil)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.Contains(first, `"content":"hi"`) {
		t.Fatalf("first event %q, %v: it was held until more arrived", first, err)
	}
	close(got)
	rest, err := io.ReadAll(br)
	if err != nil || !strings.Contains(string(rest), `"content":"there"`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("rest of the stream %q, %v", rest, err)
	}
}

// countingConn counts the writes made on a connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int32
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

type countingListener struct {
	net.Listener
	writes *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, l.writes}, nil
}

// Every write on loopback wakes the other side: a streamed request (whose
// body Tier-2 edits, asking for usage) leaves for the Tier-1 in one write,
// headers and body together, and a stream whose events all arrived before
// upstream's end leaves for the caller in one write, its end included
// (before, four writes upstream and two to the caller).
func TestStreamWrites(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, s := range []string{"hi", " there", "!"} {
			w.Write([]byte(`data: {"id":"c","model":"chat-model","choices":[{"index":0,"delta":{"content":"` + s + `"}}]}` + "\n\n"))
		}
		w.Write([]byte("data: [DONE]\n\n")) // all in one write when the handler returns
	}))
	defer up.Close()
	var upWrites, callerWrites atomic.Int32
	d := newDoorRouter(t, func(c *Config) {
		tr := NewTransport()
		dial := tr.DialContext
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{c, &upWrites}, nil
		}
		c.Transport = tr
	}, up.URL)
	srv := httptest.NewUnstartedServer(d.r.Handler())
	srv.Listener = countingListener{srv.Listener, &callerWrites}
	srv.Start()
	defer srv.Close()
	d.url = srv.URL
	resp := d.post(t, t.Context(), d.token(t, "team", nil), "/v1/chat/completions",
		`{"model":"chat-model","stream":true,"messages":[{"role":"user","content":"x"}]}`, nil)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !strings.Contains(string(body), `" there"`) || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("stream %q, %v", body, err)
	}
	if n := upWrites.Load(); n != 1 {
		t.Errorf("the request left for the Tier-1 in %d writes, want 1 (headers and body together)", n)
	}
	if n := callerWrites.Load(); n != 1 {
		t.Errorf("the stream left for the caller in %d writes, want 1 (its events and its end together)", n)
	}
}

// The stream's last event leaves with the response's end in one write
// when upstream ends right after it, even if it arrived on its own; and
// when upstream sends [DONE] and then never ends, the caller still gets
// [DONE] and a clean end after doneGrace, with no error event.
func TestDoneLeavesWithTheEnd(t *testing.T) {
	for _, tc := range []struct {
		name       string
		stall      bool
		wantWrites int32
	}{
		{"upstream ends after [DONE]", false, 2},
		{"upstream stalls after [DONE]", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release, gotFirst := make(chan struct{}), make(chan struct{})
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				w.Write([]byte(`data: {"id":"c","model":"chat-model","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n"))
				w.(http.Flusher).Flush()
				select { // the caller has the first event: what follows arrives apart
				case <-gotFirst:
				case <-r.Context().Done():
					return
				}
				w.Write([]byte("data: [DONE]\n\n"))
				w.(http.Flusher).Flush() // [DONE] on its own, then the end
				// Not synchronisation: the end arrives apart from [DONE],
				// as from a pod that takes a moment to finish; a relay
				// that flushed [DONE] at once makes a third write.
				time.Sleep(50 * time.Millisecond)
				if tc.stall {
					select {
					case <-release:
					case <-r.Context().Done():
					}
				}
			}))
			defer up.Close()
			defer close(release)
			var callerWrites atomic.Int32
			d := newDoorRouter(t, nil, up.URL)
			srv := httptest.NewUnstartedServer(d.r.Handler())
			srv.Listener = countingListener{srv.Listener, &callerWrites}
			srv.Start()
			defer srv.Close()
			d.url = srv.URL
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			resp := d.post(t, ctx, d.token(t, "team", nil), "/v1/chat/completions",
				`{"model":"chat-model","stream":true,"messages":[{"role":"user","content":"x"}]}`, nil)
			br := bufio.NewReader(resp.Body)
			first, err := br.ReadString('\n')
			if err != nil || !strings.Contains(first, `"hi"`) {
				t.Fatalf("first line %q, %v", first, err)
			}
			close(gotFirst)
			rest, err := io.ReadAll(br)
			resp.Body.Close()
			body := first + string(rest)
			if err != nil || !strings.HasSuffix(body, "data: [DONE]\n\n") || strings.Contains(body, `"error"`) {
				t.Fatalf("stream %q, %v; want it to end with [DONE] and no error", body, err)
			}
			if n := callerWrites.Load(); tc.wantWrites > 0 && n != tc.wantWrites {
				t.Errorf("the stream left in %d writes, want %d (the first event; [DONE] with the end)", n, tc.wantWrites)
			}
		})
	}
}
