//go:build unix

package regions

import (
	"syscall"
	"time"
)

// cpuTime is the process's user and system CPU time. Benchmarks report it
// per operation beside wall time: on a shared machine wall time includes
// waiting for a CPU, CPU time does not.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
