//go:build race

package request

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// the arenas are not always reused and allocation counts mean nothing
// under it.
const raceEnabled = true
