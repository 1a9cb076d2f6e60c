package main

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// MERIDIAN_CPUPROFILE: the profile is written when the run ends, under a
// name with the process id in place of %p, and it is a gzipped profile; an unwritable path is an error before anything runs.
func TestCPUProfile(t *testing.T) {
	dir := t.TempDir()
	stop, err := startCPUProfile(filepath.Join(dir, "m-%p.prof"))
	if err != nil {
		t.Fatal(err)
	}
	stop()
	path := filepath.Join(dir, "m-"+strconv.Itoa(os.Getpid())+".prof")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A pprof profile is a gzipped protocol buffer.
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b, err := io.ReadAll(z); err != nil || len(b) == 0 {
		t.Fatalf("%s: %d bytes, %v", path, len(b), err)
	}
	if _, err := startCPUProfile(filepath.Join(dir, "missing", "m.prof")); err == nil {
		t.Fatal("a profile path in a missing directory was accepted")
	}
	if stop, err := startCPUProfile(""); err != nil {
		t.Fatal(err)
	} else {
		stop() // unset: nothing to stop
	}
}
