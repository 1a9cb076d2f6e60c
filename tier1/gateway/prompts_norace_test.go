//go:build !race

package gateway_test

const promptsRaceEnabled = false
