//go:build race

package ratelimit

// raceEnabled: allocation counts are not pinned under the race detector.
const raceEnabled = true
