package main

import (
	"log/slog"
	"runtime/debug"
	"testing"
)

// --gc-percent sets the collector's target, and GOGC in the environment
// wins over it (an operator's explicit setting is never overridden).
func TestApplyGC(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	log := slog.New(slog.DiscardHandler)

	t.Setenv("GOGC", "")
	applyGC(250, log)
	if got := debug.SetGCPercent(100); got != 250 {
		t.Errorf("--gc-percent 250 without GOGC: target %d, want 250", got)
	}

	t.Setenv("GOGC", "50")
	applyGC(250, log)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("--gc-percent 250 with GOGC=50 set: target %d, want it left alone (100)", got)
	}
}

// The proxies ship the measured default.
func TestGCFlagDefault(t *testing.T) {
	for _, name := range []string{"tier1", "tier2"} {
		cmd, _, err := newRootCmd().Find([]string{name})
		if err != nil {
			t.Fatal(err)
		}
		f := cmd.Flags().Lookup("gc-percent")
		if f == nil || f.DefValue != "400" {
			t.Errorf("%s --gc-percent: %+v, want default 400", name, f)
		}
	}
}
