package tier2

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// serveFront serves h (a front door, perhaps wrapped) on 127.0.0.1 with
// the front door's server (NewServer) and returns its URL; done, when
// set, is called as each request ends.
func serveFront(tb testing.TB, h http.Handler, done func()) string {
	tb.Helper()
	if done != nil {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			defer done()
			inner.ServeHTTP(w, req)
		})
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Config = NewServer(h)
	srv.Start()
	tb.Cleanup(srv.Close)
	return srv.URL
}
