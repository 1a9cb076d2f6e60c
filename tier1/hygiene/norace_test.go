//go:build !race

package hygiene

const raceEnabled = false
