package main

import (
	"log/slog"
	"os"
	"path/filepath"
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

// A container's memory.max bounds the heap the later target may grow to;
// "max", a missing file or garbage mean no limit.
func TestCgroupMemoryMax(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		content string
		want    int64
		ok      bool
	}{
		{"1073741824\n", 1 << 30, true},
		{"max\n", 0, false},
		{"", 0, false},
		{"-5", 0, false},
		{"12abc", 0, false},
	} {
		p := filepath.Join(dir, "memory.max")
		if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, ok := cgroupMemoryMax(p); got != tc.want || ok != tc.ok {
			t.Errorf("memory.max %q: %d, %v; want %d, %v", tc.content, got, ok, tc.want, tc.ok)
		}
	}
	if _, ok := cgroupMemoryMax(filepath.Join(dir, "absent")); ok {
		t.Error("a missing memory.max read as a limit")
	}
}
