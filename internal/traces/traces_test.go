package traces

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"testing"
)

// The copies are byte-for-byte those of their sources (see testdata/traces/README.md).
func TestDigests(t *testing.T) {
	for name, want := range map[string]string{
		Mooncake: "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
		Azure:    "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
	} {
		b, err := os.ReadFile(Path(name))
		if err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("%s: sha256 %s, want %s", name, got, want)
		}
	}
}
