package tier2

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
)

// A token listing critical header extensions is refused (Meridian
// implements none); a missing iss or aud is named.
func TestAuthenticateRefusesCritAndNamesMissingClaims(t *testing.T) {
	_, ecK, _ := newKeys(t)
	a := NewAuthenticator(jwtCfg, StaticKeySet(jwk(ecK)), time.Minute, func() time.Time { return authNow })
	tok := jwt.NewWithClaims(ecK.method, goodClaims())
	tok.Header["kid"] = ecK.kid
	tok.Header["crit"] = []string{"b64"}
	tok.Header["b64"] = false
	s, err := tok.SignedString(ecK.priv)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(t.Context(), "Bearer "+s); !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "crit") {
		t.Fatalf("token with crit: %v, want refused", err)
	}
	for _, claim := range []string{"iss", "aud"} {
		c := goodClaims()
		delete(c, claim)
		_, err := a.Authenticate(t.Context(), "Bearer "+sign(t, ecK, c))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", claim)) {
			t.Fatalf("token without %s: %v, want the claim named", claim, err)
		}
	}
}

// A burst of tokens with unknown key ids fetches the JWKS once.
func TestJWKSRefreshSingleFlight(t *testing.T) {
	_, ecK, _ := newKeys(t)
	var fetches atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		<-release // every caller of the burst is waiting by now, or is about to
		json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{jwk(ecK)}})
	}))
	defer srv.Close()
	ks := &KeySet{URL: srv.URL, MinRefresh: time.Hour}
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := ks.Key(t.Context(), fmt.Sprintf("unknown-%d", i), "ES256")
			errs <- err
		}()
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err == nil {
			t.Fatal("an unknown key id was accepted")
		}
	}
	if _, err := ks.Key(t.Context(), ecK.kid, "ES256"); err != nil {
		t.Fatalf("the fetched key: %v", err)
	}
	if n := fetches.Load(); n != 1 {
		t.Fatalf("%d JWKS fetches for a burst of 50 unknown key ids, want 1", n)
	}
}

var reloadTopology = testkit.Topology(testkit.Cluster{Region: "r1", Name: "c1", Tier1: noTier1}) +
	testkit.Tenant("claims-team") + testkit.Tenant("other-team")

func reloadSnapshot(t *testing.T, dir string, jwtYAML string, rev int64) *config.Snapshot {
	t.Helper()
	y := reloadTopology + testkit.Gateway("r1", "c1") + `  auth:
    jwt:
` + jwtYAML + "\n" + testkit.ChatScheduler
	return testkit.SnapshotFile(t, filepath.Join(dir, "gw.yaml"), rev, y)
}

// Every field of spec.auth.jwt takes effect on reload, without a restart.
func TestAuthSettingsReload(t *testing.T) {
	dir := t.TempDir()
	rsaK, ecK, _ := newKeys(t)
	writeJWKS := func(name string, k testKey) {
		b, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{jwk(k)}})
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeJWKS("ec.json", ecK)
	writeJWKS("rsa.json", rsaK)
	jwksSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{jwk(rsaK)}})
	}))
	defer jwksSrv.Close()
	base := `      issuer: https://auth.example.com/
      audiences: [meridian]
      jwksFile: ec.json
      requiredClaims: {present: [sub, tenant]}`
	now := time.Now()
	claims := func(edit func(jwt.MapClaims)) jwt.MapClaims {
		c := goodClaims()
		c["iat"], c["exp"] = now.Add(-time.Minute).Unix(), now.Add(time.Hour).Unix()
		if edit != nil {
			edit(c)
		}
		return c
	}
	cases := []struct {
		name    string
		jwt     string
		key     testKey
		claims  jwt.MapClaims
		before  bool // accepted under base
		after   bool // accepted once jwt is applied
		checkFn func(*testing.T, *Caller)
	}{
		{"issuer", strings.Replace(base, "https://auth.example.com/", "https://new.example.com/", 1), ecK,
			claims(func(c jwt.MapClaims) { c["iss"] = "https://new.example.com/" }), false, true, nil},
		{"audience required", strings.Replace(base, "[meridian]", "[other]", 1), ecK, claims(nil), true, false, nil},
		{"required claims", strings.Replace(base, "[sub, tenant]", "[sub, tenant, email]", 1), ecK, claims(nil), true, false, nil},
		{"tenant claim", strings.Replace(base, "present: [sub, tenant]}", "present: [sub], tenant: team}", 1), ecK,
			claims(func(c jwt.MapClaims) { c["team"] = "other-team" }), true, true,
			func(t *testing.T, c *Caller) {
				if c.Tenant != "other-team" {
					t.Fatalf("tenant %q, want other-team from the new tenant claim", c.Tenant)
				}
			}},
		{"jwks source", strings.Replace(base, "ec.json", "rsa.json", 1), rsaK, claims(nil), false, true, nil},
		{"jwks URL", strings.Replace(base, "jwksFile: ec.json", "jwksURL: "+jwksSrv.URL, 1), rsaK, claims(nil), false, true, nil},
		{"criticality claim", strings.Replace(base, "present: [sub, tenant]}", "present: [sub, tenant], criticality: level}", 1), ecK,
			claims(func(c jwt.MapClaims) { c["criticality"] = "Critical"; c["level"] = "Sheddable" }), true, true,
			func(t *testing.T, c *Caller) {
				if c.Band != "Sheddable" {
					t.Fatalf("band %q, want Sheddable from the new criticality claim", c.Band)
				}
			}},
		{"clock skew", base + "\n      clockSkew: 10m", ecK, claims(func(c jwt.MapClaims) { c["exp"] = now.Add(-5 * time.Minute).Unix() }), false, true, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in, err := NewInstance(t.Context(), InstanceConfig{Region: "r1", Name: "t", Logger: slog.New(slog.DiscardHandler)},
				reloadSnapshot(t, dir, base, 1))
			if err != nil {
				t.Fatal(err)
			}
			tok := "Bearer " + sign(t, tc.key, tc.claims)
			try := func(want, check bool) {
				t.Helper()
				c, err := in.Router.auth.Load().Authenticate(context.Background(), tok)
				if (err == nil) != want {
					t.Fatalf("accepted = %v, want %v (%v)", err == nil, want, err)
				}
				if err == nil && check && tc.checkFn != nil {
					tc.checkFn(t, c)
				}
			}
			try(tc.before, false)
			in.apply(t.Context(), reloadSnapshot(t, dir, tc.jwt, 2))
			try(tc.after, true)
		})
	}
	// A reload whose JWKS cannot be read is refused and keeps the running
	// settings.
	in, err := NewInstance(t.Context(), InstanceConfig{Region: "r1", Name: "t", Logger: slog.New(slog.DiscardHandler)}, reloadSnapshot(t, dir, base, 1))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "empty.json"), []byte(`{"keys":[]}`), 0o600)
	in.apply(t.Context(), reloadSnapshot(t, dir, strings.Replace(base, "ec.json", "empty.json", 1), 2))
	if _, err := in.Router.auth.Load().Authenticate(t.Context(), "Bearer "+sign(t, ecK, claims(nil))); err != nil {
		t.Fatalf("a refused reload changed the running settings: %v", err)
	}
}

// A changed jwksRefresh takes effect on reload: the periodic refresh runs
// at the new interval (here it picks up a key rotated in place under the
// same kid, which an on-demand refresh for an unknown kid would not).
func TestJWKSRefreshIntervalReloads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		_, ecK, _ := newKeys(t)
		rotated := ecK
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		rotated.priv = k // same kid, new key
		write := func(k testKey) {
			b, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{jwk(k)}})
			if err := os.WriteFile(filepath.Join(dir, "keys.json"), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write(ecK)
		base := `      issuer: https://auth.example.com/
      audiences: [meridian]
      jwksFile: keys.json
      jwksRefresh: 1h
      requiredClaims: {present: [sub, tenant]}`
		in, err := NewInstance(t.Context(), InstanceConfig{Region: "r1", Name: "t", Logger: slog.New(slog.DiscardHandler)},
			reloadSnapshot(t, dir, base, 1))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		in.authMu.Lock()
		in.keysCtx = ctx // as Run does
		in.runKeysLocked()
		in.authMu.Unlock()

		c := goodClaims()
		c["iat"], c["exp"] = time.Now().Add(-time.Minute).Unix(), time.Now().Add(24*time.Hour).Unix()
		tok := "Bearer " + sign(t, rotated, c)
		accepted := func() bool {
			_, err := in.Router.auth.Load().Authenticate(context.Background(), tok)
			return err == nil
		}
		write(rotated)
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if accepted() {
			t.Fatal("the rotated key was picked up before any refresh was due (1h)")
		}
		in.apply(ctx, reloadSnapshot(t, dir, strings.Replace(base, "1h", "1m", 1), 2))
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if !accepted() {
			t.Fatal("2 minutes after jwksRefresh became 1m, the rotated key is still not in force")
		}
		cancel()
		synctest.Wait()
	})
}
