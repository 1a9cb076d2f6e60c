//go:build !race

package tier2

const raceEnabled = false
