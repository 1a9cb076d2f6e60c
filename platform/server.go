package platform

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/meridian-router/meridian/internal/tracing"
)

// ErrUsage marks an error in how a process was asked to start (a setting
// that contradicts another, a file of keys that cannot be read), not in
// the world it runs in: meridian exits 2 for it.
var ErrUsage = errors.New("usage")

type usageError struct{ err error }

func (e usageError) Error() string        { return e.err.Error() }
func (e usageError) Unwrap() error        { return e.err }
func (e usageError) Is(target error) bool { return target == ErrUsage }

// usage marks err as an ErrUsage, keeping its text.
func usage(err error) error { return usageError{err} }

// drainTimeout bounds how long a shutdown waits for in-flight streams.
const drainTimeout = 30 * time.Second

// server is one HTTP listener with graceful shutdown.
type server struct {
	name string
	srv  *http.Server
	ln   net.Listener
	// abort, when set, is called when a drain's deadline passes, before
	// the remaining connections are closed.
	abort func()
	// drainAfter bounds the drain; zero means drainTimeout.
	drainAfter time.Duration
}

// listeners are a process's HTTP listeners: its main one (the proxy or
// the front door) first, then its metrics listener when it has one.
type listeners []*server

// Addr is the main listener's address.
func (l listeners) Addr() string { return l[0].Addr() }

// MetricsAddr is the metrics listener's address ("" when off).
func (l listeners) MetricsAddr() string {
	if len(l) < 2 {
		return ""
	}
	return l[1].Addr()
}

// listen binds addr now, so that a port conflict is reported before
// anything else starts.
func listen(name, addr string, h http.Handler) (*server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen %s: %w", name, addr, err)
	}
	return &server{name: name, ln: ln, srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
	}}, nil
}

func (s *server) Addr() string { return s.ln.Addr().String() }

// serve runs until ctx ends, then drains in-flight requests.
func (s *server) serve(ctx context.Context, log *slog.Logger) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s: %w", s.name, err)
	case <-ctx.Done():
	}
	s.drain(log)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// drain stops accepting and waits up to drainAfter for in-flight
// requests; then abort (if set) ends them with an error event, given a
// moment to be written, and the rest is closed.
func (s *server) drain(log *slog.Logger) {
	d := s.drainAfter
	if d <= 0 {
		d = drainTimeout
	}
	sctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	srv := s.srv
	if err := srv.Shutdown(sctx); err == nil {
		return
	}
	log.Warn("shutdown did not drain in time; closing", "server", s.name)
	if s.abort != nil {
		s.abort()
		gctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if srv.Shutdown(gctx) == nil {
			return
		}
	}
	srv.Close()
}

// serveTLS is serve over TLS (HTTP/2 negotiated by ALPN).
func (s *server) serveTLS(ctx context.Context, log *slog.Logger, cert, key string) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.ServeTLS(s.ln, cert, key) }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s: %w", s.name, err)
	case <-ctx.Done():
	}
	s.drain(log)
	<-errc
	return nil
}

// newRegistry returns a registry with the process, Go and build series.
func newRegistry(version string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	bi := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_build_info", Help: "Always 1; labels name the build."}, []string{"version"})
	bi.WithLabelValues(cmp.Or(version, "devel")).Set(1)
	reg.MustRegister(bi)
	return reg
}

// metricsMux serves reg at /metrics; the caller adds its admin pages.
func metricsMux(reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// startTracing starts exporting spans as c says (nothing when it is off),
// as service unless c names another, with attrs on the resource.
func startTracing(ctx context.Context, c tracing.Config, service string, attrs map[string]string) (*tracing.Provider, error) {
	c.Service = cmp.Or(c.Service, service)
	if c.Attributes == nil {
		c.Attributes = attrs
	}
	return tracing.Start(ctx, c)
}

// shutdownTracing exports the spans left, within 5 s.
func shutdownTracing(tp *tracing.Provider, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: spans not exported at shutdown", "error", err)
	}
}
