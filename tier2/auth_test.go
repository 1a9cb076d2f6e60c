package tier2

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/meridian-router/meridian/config"
)

type testKey struct {
	kid    string
	method jwt.SigningMethod
	priv   crypto.Signer
}

func newKeys(t *testing.T) (rsaK, ecK, edK testKey) {
	t.Helper()
	r, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	e, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return testKey{"rsa-1", jwt.SigningMethodRS256, r}, testKey{"ec-1", jwt.SigningMethodES256, e}, testKey{"ed-1", jwt.SigningMethodEdDSA, ed}
}

func jwk(k testKey) jose.JSONWebKey {
	return jose.JSONWebKey{Key: k.priv.Public(), KeyID: k.kid, Use: "sig", Algorithm: k.method.Alg()}
}

func sign(t *testing.T, k testKey, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(k.method, claims)
	tok.Header["kid"] = k.kid
	s, err := tok.SignedString(k.priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var authNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func goodClaims() jwt.MapClaims {
	return jwt.MapClaims{
		"iss": "https://auth.example.com/", "aud": "meridian", "sub": "svc-claims",
		"tenant": "claims-team", "criticality": "Critical",
		"iat": authNow.Add(-time.Minute).Unix(), "exp": authNow.Add(time.Hour).Unix(),
	}

}

var jwtCfg = config.JWT{
	Issuer:         "https://auth.example.com/",
	Audiences:      []string{"meridian"},
	RequiredClaims: config.RequiredClaims{Present: []string{"sub", "tenant"}},
}

func TestAuthenticate(t *testing.T) {
	rsaK, ecK, edK := newKeys(t)
	a := NewAuthenticator(jwtCfg, StaticKeySet(jwk(rsaK), jwk(ecK), jwk(edK)), 30*time.Second, func() time.Time { return authNow })
	with := func(mut func(jwt.MapClaims)) jwt.MapClaims {
		c := goodClaims()
		mut(c)
		return c
	}
	// An HMAC token whose "secret" is the RSA public key: the classic
	// algorithm-confusion attack.
	pubDER, _ := x509.MarshalPKIXPublicKey(rsaK.priv.Public())
	hmac := jwt.NewWithClaims(jwt.SigningMethodHS256, goodClaims())
	hmac.Header["kid"] = rsaK.kid
	confused, _ := hmac.SignedString(pubDER)
	none := jwt.NewWithClaims(jwt.SigningMethodNone, goodClaims())
	unsigned, _ := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	otherEC, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)

	cases := []struct {
		name   string
		header string
		want   string // "" = accepted
	}{
		{"RS256", "Bearer " + sign(t, rsaK, goodClaims()), ""},
		{"ES256", "Bearer " + sign(t, ecK, goodClaims()), ""},
		{"EdDSA", "Bearer " + sign(t, edK, goodClaims()), ""},
		{"skew tolerated", "Bearer " + sign(t, ecK, with(func(c jwt.MapClaims) { c["exp"] = authNow.Add(-10 * time.Second).Unix() })), ""},
		{"missing header", "", "missing bearer token"},
		{"wrong scheme", "Basic abc", "malformed Authorization header"},
		{"garbage", "Bearer not.a.jwt", "malformed token"},
		{"alg none", "Bearer " + unsigned, `signing algorithm "none" not accepted`},
		{"HMAC with public key", "Bearer " + confused, `signing algorithm "HS256" not accepted`},
		{"expired", "Bearer " + sign(t, ecK, with(func(c jwt.MapClaims) { c["exp"] = authNow.Add(-time.Hour).Unix() })), "token expired"},
		{"not yet valid", "Bearer " + sign(t, ecK, with(func(c jwt.MapClaims) { c["nbf"] = authNow.Add(time.Hour).Unix() })), "token not valid yet"},
		{"no exp", "Bearer " + sign(t, ecK, with(func(c jwt.MapClaims) { delete(c, "exp") })), "exp"},
		{"wrong issuer", "Bearer " + sign(t, ecK, with(func(c jwt.MapClaims) { c["iss"] = "https://evil/" })), "issuer not accepted"},
		{"wrong audience", "Bearer " + sign(t, ecK, with(func(c jwt.MapClaims) { c["aud"] = "other" })), "audience not accepted"},
		{"missing required claim", "Bearer " + sign(t, ecK, with(func(c jwt.MapClaims) { delete(c, "sub") })), `required claim "sub"`},
		{"missing tenant", "Bearer " + sign(t, ecK, with(func(c jwt.MapClaims) { delete(c, "tenant") })), `"tenant"`},
		{"criticality not a string", "Bearer " + sign(t, ecK, with(func(c jwt.MapClaims) { c["criticality"] = 3 })), "must be a string"},
		{"unknown kid", "Bearer " + sign(t, testKey{"ec-9", jwt.SigningMethodES256, otherEC}, goodClaims()), `no key with id "ec-9"`},
		{"wrong key for kid", "Bearer " + sign(t, testKey{"ec-1", jwt.SigningMethodES256, otherEC}, goodClaims()), "invalid token signature"},
		{"alg mismatching key type", "Bearer " + sign(t, testKey{"ec-1", jwt.SigningMethodRS256, rsaK.priv}, goodClaims()), "cannot be verified"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := a.Authenticate(t.Context(), tc.header)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				if c.Tenant != "claims-team" || c.Band != "Critical" || c.Subject != "svc-claims" {
					t.Fatalf("caller = %+v", c)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want an error containing %q", tc.want)
			}
			if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q; want ErrUnauthenticated containing %q", err, tc.want)
			}
		})
	}
}

// A key rotated in at the JWKS URL is picked up when a token names it.
func TestKeyRotationFromURL(t *testing.T) {
	_, ecK, edK := newKeys(t)
	var mu sync.Mutex
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{jwk(ecK)}}
	fetches := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fetches++
		json.NewEncoder(w).Encode(set)
	}))
	defer srv.Close()
	cfg := jwtCfg
	cfg.JWKSURL = srv.URL
	ks, err := NewKeySet(t.Context(), cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	ks.fetched = time.Time{} // allow an immediate on-demand refresh
	a := NewAuthenticator(cfg, ks, 0, func() time.Time { return authNow })
	if _, err := a.Authenticate(t.Context(), "Bearer "+sign(t, ecK, goodClaims())); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	set.Keys = append(set.Keys, jwk(edK)) // rotation: a new key appears
	mu.Unlock()
	if _, err := a.Authenticate(t.Context(), "Bearer "+sign(t, edK, goodClaims())); err != nil {
		t.Fatalf("token signed with the rotated-in key: %v", err)
	}
	// Unknown kids do not hammer the JWKS endpoint: refreshes are rate limited.
	before := fetches
	for range 5 {
		a.Authenticate(t.Context(), "Bearer "+sign(t, testKey{"nope", jwt.SigningMethodEdDSA, edK.priv}, goodClaims()))
	}
	if fetches-before > 0 {
		t.Fatalf("%d JWKS fetches for unknown kids within the refresh interval", fetches-before)
	}
}

// Cached verifications never outlive the token, and only the exact token
// bytes hit the cache.
func TestVerificationCacheHonoursExpiry(t *testing.T) {
	_, ecK, _ := newKeys(t)
	now := authNow
	a := NewAuthenticator(jwtCfg, StaticKeySet(jwk(ecK)), 0, func() time.Time { return now })
	claims := goodClaims()
	claims["exp"] = authNow.Add(30 * time.Second).Unix()
	tok := "Bearer " + sign(t, ecK, claims)
	if _, err := a.Authenticate(t.Context(), tok); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.cached(strings.TrimPrefix(tok, "Bearer ")); !ok {
		t.Fatal("a verified token is not cached")
	}
	// One character inside the signature changed. Its last two characters
	// encode only the final byte of the ES256 signature, which is 0 (so
	// "AA") in one signature of 256: writing "AA" there left about one
	// run in 256 with the token unchanged, and accepted.
	b := []byte(tok)
	if i := len(b) - 10; b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	tampered := string(b)
	if _, err := a.Authenticate(t.Context(), tampered); err == nil {
		t.Fatal("a tampered token was accepted")
	}
	now = authNow.Add(31 * time.Second)
	if _, err := a.Authenticate(t.Context(), tok); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("after expiry: %v, want token expired", err)
	}
}
