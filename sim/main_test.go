package sim

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a live pod leaves a goroutine behind
// (its driver, server or a handler) after Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
