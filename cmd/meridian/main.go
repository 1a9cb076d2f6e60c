// Command meridian is Meridian's one binary: the Tier-1 endpoint picker,
// the Tier-2 global router, the simulator, the replay tool and the
// operator commands. It wires packages together and holds no logic a test
// would want to reach.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/meridian-router/meridian/platform"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

// exitError carries a process exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func main() {
	os.Exit(run())
}

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ignoreHangup()
	stopProfile, err := startCPUProfile(os.Getenv("MERIDIAN_CPUPROFILE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stopProfile()
	root := newRootCmd()
	err = root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(os.Stderr, err)
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, platform.ErrUsage):
		return 2
	}
	return 1
}

// startCPUProfile writes a CPU profile of the whole run to path (an
// "%p" in it becomes the process id, for several processes started with
// one environment) when path is set: MERIDIAN_CPUPROFILE, for profiling a
// tier under real load and for refreshing default.pgo (docs/BENCHMARKS.md).
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	path = strings.ReplaceAll(path, "%p", strconv.Itoa(os.Getpid()))
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("MERIDIAN_CPUPROFILE: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("MERIDIAN_CPUPROFILE: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// ignoreHangup keeps SIGHUP from killing the process (its default
// action): configuration is applied as its files or etcd keys change, so
// there is nothing for a SIGHUP to reload. Each one is logged.
func ignoreHangup() {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			slog.Info("SIGHUP ignored: configuration changes are applied as the files or etcd keys change")
		}
	}()
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "meridian",
		Short:         "A global router for LLM inference",
		Long:          "Meridian routes LLM inference requests: Tier-1 picks the pod in a cluster, Tier-2 picks the cluster across Regions.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCmd(), newConfigCmd(), newDNSCmd())
	root.AddCommand(newPlanCmd())
	root.AddCommand(newDiagnoseCmd())
	for _, add := range extraCommands {
		root.AddCommand(add())
	}
	return root
}

// extraCommands lets subcommands defined in their own files register
// themselves (each file's init appends its constructor).
var extraCommands []func() *cobra.Command

func versionString() string {
	v := version
	if v == "" {
		v = "devel"
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					v += "+" + s.Value[:12]
				}
			}
		}
	}
	return v
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "meridian %s\n", versionString())
		},
	}
}
