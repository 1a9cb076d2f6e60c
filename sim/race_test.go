//go:build race

package sim

// raceEnabled shrinks trace replays in tests: the race detector slows the
// engine about fifteenfold.
const raceEnabled = true
