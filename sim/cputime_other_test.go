//go:build !unix

package sim

import "time"

// cpuTime is unavailable here; benchmarks then report 0 CPU seconds.
func cpuTime() time.Duration { return 0 }
