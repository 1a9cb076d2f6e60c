//go:build !race

package tier1

const raceEnabled = false
