//go:build !race

package regions

const raceEnabled = false
