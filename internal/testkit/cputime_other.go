//go:build !unix

package testkit

import "time"

// CPUTime is 0 where getrusage does not exist.
func CPUTime() time.Duration { return 0 }
