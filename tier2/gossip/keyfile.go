package gossip

import (
	"encoding/base64"
	"fmt"
	"os"
	"strings"
)

// ReadKeyFile reads a gossip keyring (Config.Keys, Node.SetKeys) from a
// file: one base64-encoded key of 16, 24 or 32 bytes per line, the key
// nodes encrypt with first; blank lines and lines starting with # are
// skipped. Generate a key with `head -c 32 /dev/urandom | base64`.
func ReadKeyFile(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gossip key file: %w", err)
	}
	keys, err := ParseKeys(string(data))
	if err != nil {
		return nil, fmt.Errorf("gossip key file %s: %w", path, err)
	}
	return keys, nil
}

// ParseKeys parses ReadKeyFile's format.
func ParseKeys(text string) ([][]byte, error) {
	var keys [][]byte
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: not base64: %w", i+1, err)
		}
		switch len(k) {
		case 16, 24, 32:
		default:
			return nil, fmt.Errorf("line %d: key is %d bytes, want 16, 24 or 32", i+1, len(k))
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no keys")
	}
	if err := checkKeys(keys); err != nil {
		return nil, err
	}
	return keys, nil
}
