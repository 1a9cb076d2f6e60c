// Package testkit is what the tests and benchmarks of many packages share:
// waiting for a condition with a bound (Eventually), goroutines that loop
// until stopped (Loop, UnderTraffic), a fake clock (Clock), the AWS SDK
// kept off the machine's configuration (NoAWSConfig), measuring CPU time
// (CPUTime, StartCPU), building a configuration from YAML (Snapshot;
// Topology, Gateway, ChatScheduler, Tenant and StaticEndpoints write its
// documents), reading metrics (Metric, Value, Series) and OpenAI's error
// body (OpenAIError). It is imported only by test files
// (docs/architecture.md, rule 2).
package testkit

import (
	"os"
	"os/exec"
	"runtime/debug"
	"sync"
	"testing"
	"time"
)

// EventuallyTimeout bounds every Eventually: generous, because the tests
// run on loaded machines (gossip and readiness of the local platform under
// -race at load 75 on 2 cores took longer than 30 s), and still a bound.
const EventuallyTimeout = 2 * time.Minute

// Eventually polls cond until it holds, and fails tb naming what it waited
// for when it still does not after EventuallyTimeout. It polls every
// millisecond at first and backs off to every 20 ms, so a condition that
// is slow to hold (a whole platform starting) does not load the machine.
func Eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(EventuallyTimeout)
	wait := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for: %s", EventuallyTimeout, what)
		}
		<-time.After(wait) // a polling interval, not a synchronisation
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// NoAWSConfig keeps the AWS SDK off the machine's own AWS configuration
// until t ends: no shared config or credentials file and no EC2 instance
// metadata, so credentials come only from what the test gives (static
// credentials, or AWS_ACCESS_KEY_ID in the environment).
func NoAWSConfig(t *testing.T) {
	t.Helper()
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
}

// OpenAIError is the body of an error answer in OpenAI's shape.
type OpenAIError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

// Clock is a fake clock, safe for concurrent use: it reads the time it
// was made with plus every Advance since.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock is a Clock that reads now.
func NewClock(now time.Time) *Clock { return &Clock{now: now} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// CPUClock measures the process's CPU time (user + system) from when it
// was started: unlike wall time it does not grow while the process waits
// for a CPU on a loaded machine.
type CPUClock struct{ start time.Duration }

// StartCPU starts a CPUClock.
func StartCPU() CPUClock { return CPUClock{start: CPUTime()} }

// Elapsed is the CPU time used since the clock started.
func (c CPUClock) Elapsed() time.Duration { return CPUTime() - c.start }

// Report reports the CPU time per operation as the benchmark's cpu-ns/op.
func (c CPUClock) Report(b *testing.B) {
	if b.N > 0 {
		b.ReportMetric(float64(c.Elapsed())/float64(b.N), "cpu-ns/op")
	}
}

// AllocsPerRun is testing.AllocsPerRun with the garbage collector off
// while it counts: a collection empties every sync.Pool, and the pooled
// buffers a request path reuses are then allocated again, so a pin on a
// path that moves large bodies would otherwise depend on when collections
// happen to fall (one in 200 runs adds an allocation to the average).
func AllocsPerRun(runs int, f func()) float64 {
	prev := debug.SetGCPercent(-1)
	defer debug.SetGCPercent(prev)
	return testing.AllocsPerRun(runs, f)
}

// Binary returns the path of the external program name, which install
// says how to get. Without it the test is skipped on a developer's
// machine and fails under CI (CI set), whose .ci/run installs it: a skip
// there would hide a broken install.
func Binary(tb testing.TB, name, install string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		tb.Fatalf("%s is not installed, and CI must run this test: %s", name, install)
	}
	tb.Skipf("%s is not installed (%s)", name, install)
	return ""
}
