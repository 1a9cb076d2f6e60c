package main

import (
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
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
// set in the environment.
func applyGC(percent int, log *slog.Logger) {
	if env := os.Getenv("GOGC"); env != "" {
		log.Info("garbage collector target from GOGC; --gc-percent ignored", "GOGC", env)
		return
	}
	debug.SetGCPercent(percent)
}
