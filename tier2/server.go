package tier2

import (
	"net/http"
	"time"
)

// MaxHeaderBytes bounds a request's headers at the front door. Go's server
// allows 4 KiB over it and answers a plain-text 431 beyond, before any
// handler runs.
const MaxHeaderBytes = 64 << 10

// NewServer returns the http.Server that serves h (Router.Handler or
// Instance.Handler) as the front door: HTTP/1.1, and HTTP/2 over TLS and
// as h2c; request headers within 10 s and MaxHeaderBytes; idle
// keep-alive connections closed after 120 s. The body's deadline is the
// router's (Config.BodyReadTimeout), set once the request is
// authenticated; there is no write timeout, since a stream lasts as long
// as its completion.
func NewServer(h http.Handler) *http.Server {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	protos.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         &protos,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}
