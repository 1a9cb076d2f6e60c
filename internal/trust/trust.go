// Package trust signs the identity Tier-2 hands to Tier-1 with each
// request (the tenant and the priority band) and verifies it at Tier-1,
// so that only a Tier-2 holding the shared key can set them. It decides
// nothing about tenants or bands themselves.
//
// The signature is an HMAC-SHA256 over "tenant|band|unix-seconds" with a
// key both tiers read from a file, sent as
//
//	x-meridian-signature: <unix-seconds>.<base64url MAC>
//
// A signature is accepted within MaxAge of its time in either direction
// (clock skew between hosts). It binds the values, not the request: a
// signature seen on the wire can be replayed with the same tenant and
// band within MaxAge, so Tier-2 → Tier-1 traffic that crosses an
// untrusted network must run over TLS.
package trust

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Header carries the signature.
const Header = "X-Meridian-Signature"

// MaxAge bounds the age (and the clock skew) of an accepted signature.
const MaxAge = 5 * time.Minute

// MinKeyBytes is the shortest key accepted.
const MinKeyBytes = 32

// ErrUntrusted wraps every verification failure.
var ErrUntrusted = errors.New("tenant and band headers not signed by a trusted Tier-2")

// ReadKey reads a key file: at least MinKeyBytes bytes, surrounding white
// space removed.
func ReadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("trust: key file: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < MinKeyBytes {
		return nil, fmt.Errorf("trust: key file %s: %d bytes, want at least %d (e.g. head -c 32 /dev/urandom | base64 > %s)", path, len(b), MinKeyBytes, path)
	}
	return b, nil
}

// Sign returns the header value for tenant and band at now.
func Sign(key []byte, tenant, band string, now time.Time) string {
	ts := strconv.FormatInt(now.Unix(), 10)
	return ts + "." + base64.RawURLEncoding.EncodeToString(mac(key, tenant, band, ts))
}

// Verify checks a header value against tenant and band at now.
func Verify(key []byte, value, tenant, band string, now time.Time) error {
	if strings.Contains(band, "|") {
		return fmt.Errorf("%w: malformed band", ErrUntrusted)
	}
	ts, sig, ok := strings.Cut(value, ".")
	if !ok {
		return fmt.Errorf("%w: missing or malformed %s", ErrUntrusted, Header)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: malformed %s time", ErrUntrusted, Header)
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, mac(key, tenant, band, ts)) {
		return fmt.Errorf("%w: bad signature", ErrUntrusted)
	}
	if age := now.Sub(time.Unix(sec, 0)); age > MaxAge || age < -MaxAge {
		return fmt.Errorf("%w: signature %s old", ErrUntrusted, age.Round(time.Second))
	}
	return nil
}

func mac(key []byte, tenant, band, ts string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(tenant))
	m.Write([]byte{'|'})
	m.Write([]byte(band))
	m.Write([]byte{'|'})
	m.Write([]byte(ts))
	return m.Sum(nil)
}
