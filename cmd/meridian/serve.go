package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// defaultGCPercent is the Go garbage collector's target for the proxies
// (GOGC). A request's garbage is short-lived and the live heap small (the
// routing tables, the indexes, the pools), so collecting at 5× the live
// heap instead of 2× costs little memory and saves most of the collector's
// CPU: with 400, Tier-2 spent about 6% less CPU per request in
// bench/latency (docs/BENCHMARKS.md).
const defaultGCPercent = 400

// registerGC adds --gc-percent to a proxy command.
func registerGC(cmd *cobra.Command, p *int) {
	cmd.Flags().IntVar(p, "gc-percent", defaultGCPercent, "Go garbage collector target (as GOGC: collect when the heap has grown by this percentage since the last collection; negative: off); the GOGC environment variable, when set, wins")
}

// applyGC sets the collector's target from --gc-percent unless GOGC is
// set in the environment. In a container with a memory limit (cgroup v2
// memory.max), unless GOMEMLIMIT is set, the collector also works harder
// as the heap nears 90% of that limit, so the later target cannot cost an
// out-of-memory kill.
func applyGC(percent int, log *slog.Logger) {
	if env := os.Getenv("GOGC"); env != "" {
		log.Info("garbage collector target from GOGC; --gc-percent ignored", "GOGC", env)
	} else {
		debug.SetGCPercent(percent)
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	if limit, ok := cgroupMemoryMax(cgroupMemoryMaxFile); ok {
		debug.SetMemoryLimit(limit / 10 * 9)
		log.Info("garbage collector memory limit set from the container's", "memory.max", limit, "limit", limit/10*9)
	}
}

// cgroupMemoryMaxFile is cgroup v2's memory limit of this process's group.
const cgroupMemoryMaxFile = "/sys/fs/cgroup/memory.max"

// cgroupMemoryMax reads a cgroup v2 memory.max: a byte count, or "max"
// (no limit, ok false); a missing or unreadable file is no limit.
func cgroupMemoryMax(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

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
	if err := s.srv.Shutdown(sctx); err == nil {
		return
	}
	log.Warn("shutdown did not drain in time; closing", "server", s.name)
	if s.abort != nil {
		s.abort()
		gctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if s.srv.Shutdown(gctx) == nil {
			return
		}
	}
	s.srv.Close()
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
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	bi := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_build_info", Help: "Always 1; labels name the build."}, []string{"version"})
	bi.WithLabelValues(versionString()).Set(1)
	reg.MustRegister(bi)
	return reg
}

func metricsHandler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}
