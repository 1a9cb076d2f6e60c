package tier2

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
)

// loopFront: the tests that serve a front door (serveFront) serve it on a
// LoopServer. TestMain runs the package's tests twice, once on net/http's
// server and once on the event loops, so that every front-door test holds
// for both.
var loopFront bool

func TestMain(m *testing.M) {
	// A body the loops read is overwritten as its request ends: a stage
	// that used it later would send 0xdb bytes and fail its test.
	poisonReleasedBodies = true
	code := m.Run()
	if code == 0 {
		loopFront = true
		fmt.Println("tier2: the tests again, with the front door on event loops (LoopServer)")
		code = m.Run()
	}
	os.Exit(code)
}

// serveFront serves h (r's front door, perhaps wrapped) on 127.0.0.1 and
// returns its URL; done, when set, is called as each request ends.
func serveFront(tb testing.TB, r *Router, h http.Handler, done func()) string {
	tb.Helper()
	if !loopFront {
		if done != nil {
			inner := h
			h = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				defer done()
				inner.ServeHTTP(w, req)
			})
		}
		srv := httptest.NewServer(h)
		tb.Cleanup(srv.Close)
		return srv.URL
	}
	_, addr := startLoopServer(tb, r, h, done)
	return "http://" + addr
}

// startLoopServer serves h (r's front door) on a LoopServer on 127.0.0.1
// until the test ends; done, when set, is called as each request ends.
func startLoopServer(tb testing.TB, r *Router, h http.Handler, done func()) (*LoopServer, string) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := NewLoopServer(r, h, LoopConfig{})
	s.onDone = done
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	tb.Cleanup(func() {
		s.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			tb.Errorf("LoopServer.Serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}
