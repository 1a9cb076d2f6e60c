package main

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/meridian-router/meridian/internal/tracing"
	"github.com/meridian-router/meridian/platform"
)

// defaultGCPercent is the Go garbage collector's target for the proxies
// (GOGC). A request's garbage is short-lived and the live heap small (the
// routing tables, the indexes, the pools), so collecting at 5× the live
// heap instead of 2× costs little memory and saves most of the collector's
// CPU: with 400, Tier-2 spent about 6% less CPU per request in
// bench/latency (docs/BENCHMARKS.md).
const defaultGCPercent = 400

// newProxyCmd is the command of one of the proxies (tier1, tier2): no
// arguments, the configuration source's flags (into source) and
// --gc-percent (into gcPercent); run starts the proxy once the flags are
// parsed, with the default logger.
func newProxyCmd(use, short, long, example string, source *platform.Source, gcPercent *int, run func(context.Context, *slog.Logger) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Long:    long,
		Example: example,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd.Context(), slog.Default())
		},
	}
	registerSource(cmd, source)
	registerGC(cmd, gcPercent)
	return cmd
}

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

// tracingFlags adds the flags that turn tracing on (internal/tracing).
func tracingFlags(fs *pflag.FlagSet, c *tracing.Config) {
	fs.StringVar(&c.Endpoint, "otlp-endpoint", "", "export OpenTelemetry spans to this OTLP collector: http://HOST:4317 (gRPC, plaintext) or https://… (TLS); empty: tracing off")
	fs.StringVar(&c.Protocol, "otlp-protocol", "grpc", "OTLP protocol: grpc or http/protobuf (then the endpoint is the collector's HTTP port, e.g. http://HOST:4318)")
	fs.Float64Var(&c.SampleRatio, "trace-sample-ratio", 1, "fraction of new traces recorded (0 to 1); a request with a traceparent follows its caller's sampled flag")
}
