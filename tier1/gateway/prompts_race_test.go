//go:build race

package gateway_test

// promptsRaceEnabled: the race detector makes sync.Pool drop items at
// random, so allocation counts are meaningless under it. (Named for the
// prompt tests so that it cannot clash with a package-wide switch.)
const promptsRaceEnabled = true
