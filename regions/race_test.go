//go:build race

package regions

// raceEnabled: under the race detector the 500-cluster fleet takes minutes
// to build, and allocation counts include the detector's.
const raceEnabled = true
