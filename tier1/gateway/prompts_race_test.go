//go:build race

package gateway_test

// promptsRaceEnabled (named for this file's tests, so it cannot clash with a package-wide one): the race detector makes sync.Pool drop items at random, so
// allocation counts are meaningless under it.
const promptsRaceEnabled = true
