//go:build race

package replay

// raceEnabled: the race detector slows a replay about tenfold; quality
// tests replay fewer requests under it.
const raceEnabled = true
