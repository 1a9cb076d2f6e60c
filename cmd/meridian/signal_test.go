package main

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// SIGHUP neither kills the process nor goes unnoticed: it is logged. The
// child is this test binary, re-run to send itself SIGHUP.
func TestHangupIgnoredAndLogged(t *testing.T) {
	if os.Getenv("MERIDIAN_HUP_CHILD") == "1" {
		ignoreHangup()
		syscall.Kill(os.Getpid(), syscall.SIGHUP)
		io.Copy(io.Discard, os.Stdin) // alive until the parent has seen the log line
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHangupIgnoredAndLogged$")
	cmd.Env = append(os.Environ(), "MERIDIAN_HUP_CHILD=1")
	stdin, _ := cmd.StdinPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	logged := false
	for sc.Scan() {
		if strings.Contains(sc.Text(), "SIGHUP ignored") {
			logged = true
			break
		}
	}
	stdin.Close()
	err := cmd.Wait()
	if !logged || err != nil {
		t.Fatalf("child: logged %v, exit %v: want the SIGHUP logged and a clean exit", logged, err)
	}
}
