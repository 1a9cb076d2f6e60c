package tier2

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/loop"
)

// Caller is an authenticated request's identity.
type Caller struct {
	Subject string
	Tenant  string
	// Band is the criticality the token claims (empty: none claimed).
	Band string
}

// ErrUnauthenticated wraps every authentication failure; its message is
// safe to return to the caller.
var ErrUnauthenticated = errors.New("unauthenticated")

// signingMethods are the asymmetric algorithms accepted. HMAC is never
// accepted (a public key must not be usable as a shared secret) and
// "none" never is either.
var signingMethods = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// Authenticator verifies bearer tokens against a gateway's JWT settings.
//
// A signature check costs far more than the rest of Tier-2's request path
// (ES256 verification is about 100–250 µs here), and callers send the same
// token for many requests, so successful verifications are remembered for
// CacheTTL (never past the token's own expiry). The cache holds the exact
// token bytes: a different token, even for the same caller, is verified.
// A key removed from the JWKS stops accepting tokens it signed within
// CacheTTL.
type Authenticator struct {
	keys   *KeySet
	cfg    config.JWT
	parser *jwt.Parser
	now    func() time.Time
	// CacheTTL bounds how long a verified token is trusted without a new
	// signature check. Zero disables the cache.
	CacheTTL time.Duration
	// CacheSize bounds the entries of one cache generation (two are
	// kept). Zero means 16,384.
	CacheSize int

	cacheMu  sync.Mutex
	cur, old map[string]cachedCaller
}

type cachedCaller struct {
	// c is the cache's own copy, shared by every request with the token:
	// callers are never modified in place (knownTenant copies one to
	// change it).
	c     *Caller
	until time.Time
}

// NewAuthenticator builds an authenticator. keys supplies verification
// keys; now is the clock (nil: time.Now). skew is the tolerance on exp,
// nbf and iat.
func NewAuthenticator(cfg config.JWT, keys *KeySet, skew time.Duration, now func() time.Time) *Authenticator {
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(signingMethods),
		jwt.WithLeeway(skew),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
	}
	if now != nil {
		opts = append(opts, jwt.WithTimeFunc(now))
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if len(cfg.Audiences) > 0 {
		opts = append(opts, jwt.WithAudience(cfg.Audiences...))
	}
	if now == nil {
		now = time.Now
	}
	return &Authenticator{keys: keys, cfg: cfg, parser: jwt.NewParser(opts...), now: now, CacheTTL: time.Minute}
}

func (a *Authenticator) cached(token string) (*Caller, bool) {
	if a.CacheTTL <= 0 {
		return nil, false
	}
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	e, ok := a.cur[token]
	if !ok {
		e, ok = a.old[token]
	}
	if !ok || !a.now().Before(e.until) {
		return nil, false
	}
	return e.c, true
}

// cachedAuthorization is Authenticate's answer for an Authorization value
// whose token is in the cache, and false otherwise: what the event loop
// may decide without a key lookup that could wait on the network.
func (a *Authenticator) cachedAuthorization(authorization string) (*Caller, bool) {
	scheme, token, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil, false
	}
	if token = strings.TrimSpace(token); token == "" {
		return nil, false
	}
	return a.cached(token)
}

func (a *Authenticator) remember(token string, c *Caller, exp time.Time) {
	if a.CacheTTL <= 0 {
		return
	}
	until := a.now().Add(a.CacheTTL)
	if !exp.IsZero() && exp.Before(until) {
		until = exp
	}
	size := a.CacheSize
	if size <= 0 {
		size = 16384
	}
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	if a.cur == nil || len(a.cur) >= size {
		a.old, a.cur = a.cur, make(map[string]cachedCaller, size/4)
	}
	// A copy: the token may be a substring of a whole request head (the
	// loops' parser), which the cache would otherwise keep alive.
	own := *c
	a.cur[strings.Clone(token)] = cachedCaller{c: &own, until: until}
}

// Authenticate verifies an Authorization header value ("Bearer <jwt>").
func (a *Authenticator) Authenticate(ctx context.Context, authorization string) (*Caller, error) {
	scheme, token, ok := strings.Cut(authorization, " ")
	if authorization == "" {
		return nil, fmt.Errorf("%w: missing bearer token: send Authorization: Bearer <token>", ErrUnauthenticated)
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return nil, fmt.Errorf("%w: malformed Authorization header: want \"Bearer <token>\"", ErrUnauthenticated)
	}
	token = strings.TrimSpace(token)
	if c, ok := a.cached(token); ok {
		return c, nil
	}
	h := tokenHeader(token)
	if h.Alg != "" && !slices.Contains(signingMethods, h.Alg) {
		return nil, fmt.Errorf("%w: signing algorithm %q not accepted; use one of %s", ErrUnauthenticated, h.Alg, strings.Join(signingMethods, ", "))
	}
	if h.Crit != nil {
		// RFC 7515 §4.1.11: a critical extension the verifier does not
		// understand makes the token invalid. Meridian understands none.
		return nil, fmt.Errorf("%w: token header lists critical extensions (crit) this verifier does not implement", ErrUnauthenticated)
	}
	claims := jwt.MapClaims{}
	_, err := a.parser.ParseWithClaims(token, claims, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		return a.keys.Key(ctx, kid, t.Method.Alg())
	})
	if err != nil {
		if errors.Is(err, jwt.ErrTokenRequiredClaimMissing) {
			for _, name := range []string{"exp", "iss", "aud"} {
				if _, ok := claims[name]; !ok {
					return nil, fmt.Errorf("%w: token lacks the registered claim %q", ErrUnauthenticated, name)
				}
			}
		}
		return nil, fmt.Errorf("%w: %s", ErrUnauthenticated, describeJWTError(err))
	}
	rc := a.cfg.RequiredClaims
	for _, c := range rc.Present {
		if v, ok := claims[c]; !ok || v == nil || v == "" {
			return nil, fmt.Errorf("%w: token lacks required claim %q", ErrUnauthenticated, c)
		}
	}
	c := &Caller{}
	c.Subject, _ = claims["sub"].(string)
	tenant, ok := claims[rc.TenantClaim()].(string)
	if !ok || tenant == "" {
		return nil, fmt.Errorf("%w: token lacks the tenant claim %q", ErrUnauthenticated, rc.TenantClaim())
	}
	c.Tenant = tenant
	if v, ok := claims[rc.CriticalityClaim()]; ok {
		s, isStr := v.(string)
		if !isStr {
			return nil, fmt.Errorf("%w: claim %q must be a string (Critical, Standard or Sheddable)", ErrUnauthenticated, rc.CriticalityClaim())
		}
		c.Band = s
	}
	var exp time.Time
	if e, err := claims.GetExpirationTime(); err == nil && e != nil {
		exp = e.Time
	}
	a.remember(token, c, exp)
	return c, nil
}

// joseHeader is what Authenticate reads of a token's header before
// verifying it.
type joseHeader struct {
	Alg  string          `json:"alg"`
	Crit json.RawMessage `json:"crit"`
}

// tokenHeader reads a compact JWS header; zero when unreadable (the parser
// then reports the malformation).
func tokenHeader(token string) joseHeader {
	var h joseHeader
	head, _, ok := strings.Cut(strings.TrimSpace(token), ".")
	if !ok {
		return h
	}
	b, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		return h
	}
	if json.Unmarshal(b, &h) != nil {
		return joseHeader{}
	}
	return h
}

// describeJWTError turns the library's errors into messages for callers.
func describeJWTError(err error) string {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "malformed token"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "invalid token signature"
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return "token cannot be verified: " + unwrapLast(err)
	case errors.Is(err, jwt.ErrTokenExpired):
		return "token expired"
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return "token not valid yet"
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return "token used before it was issued"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "token lacks a required registered claim"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "token issuer not accepted"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "token audience not accepted"
	case errors.Is(err, jwt.ErrTokenInvalidClaims):
		return "invalid token claims"
	}
	return "invalid token"
}

func unwrapLast(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}

// KeySet holds verification keys from a JWKS file or URL, refreshed in the
// background and on demand when a token names an unknown key id (rotation),
// at most once per MinRefresh.
type KeySet struct {
	// File or URL of the JWKS; exactly one is set.
	File, URL string
	// Client fetches URL; nil means a client with a 10 s timeout.
	Client *http.Client
	// MinRefresh rate-limits on-demand refreshes (a burst of unknown key
	// ids fetches at most once per MinRefresh, whether it succeeds or
	// not). Zero means 10 s.
	MinRefresh time.Duration
	Logger     *slog.Logger

	mu      sync.RWMutex
	keys    map[string]jose.JSONWebKey // by kid ("" for keys without one)
	fetched time.Time

	onDemand  sync.Mutex // single flight of on-demand refreshes
	attempted time.Time  // last on-demand refresh, under onDemand
}

// NewKeySet loads a JWKS from cfg's file (resolved against dir) or URL.
func NewKeySet(ctx context.Context, cfg config.JWT, dir string) (*KeySet, error) {
	ks := &KeySet{File: cfg.JWKSFile, URL: cfg.JWKSURL}
	if ks.File != "" && dir != "" && !strings.HasPrefix(ks.File, "/") {
		ks.File = dir + "/" + ks.File
	}
	if err := ks.Refresh(ctx); err != nil {
		return nil, err
	}
	return ks, nil
}

// StaticKeySet returns a key set over fixed keys (for tests and local use).
func StaticKeySet(keys ...jose.JSONWebKey) *KeySet {
	ks := &KeySet{keys: map[string]jose.JSONWebKey{}}
	for _, k := range keys {
		ks.keys[k.KeyID] = k
	}
	return ks
}

// Refresh re-reads the key set now.
func (ks *KeySet) Refresh(ctx context.Context) error {
	var data []byte
	var err error
	switch {
	case ks.File != "":
		data, err = os.ReadFile(ks.File)
	case ks.URL != "":
		data, err = ks.fetch(ctx)
	default:
		return nil // static
	}
	if err != nil {
		return fmt.Errorf("tier2: JWKS: %w", err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil {
		return fmt.Errorf("tier2: JWKS %s%s: %w", ks.File, ks.URL, err)
	}
	keys := map[string]jose.JSONWebKey{}
	for _, k := range set.Keys {
		if k.IsPublic() && k.Valid() {
			keys[k.KeyID] = k
		}
	}
	if len(keys) == 0 {
		return fmt.Errorf("tier2: JWKS %s%s has no usable public key", ks.File, ks.URL)
	}
	ks.mu.Lock()
	ks.keys, ks.fetched = keys, time.Now()
	ks.mu.Unlock()
	return nil
}

func (ks *KeySet) fetch(ctx context.Context) ([]byte, error) {
	c := ks.Client
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ks.URL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: HTTP %d", ks.URL, resp.StatusCode)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 1<<20))
}

// Run refreshes the key set every interval until ctx ends.
func (ks *KeySet) Run(ctx context.Context, interval time.Duration) {
	if ks.File == "" && ks.URL == "" {
		return
	}
	if interval <= 0 {
		interval = 5 * time.Minute
	}
	loop.Every(ctx, interval, func() {
		if err := ks.Refresh(ctx); err != nil && ks.Logger != nil {
			ks.Logger.Warn("JWKS refresh failed; keeping the current keys", "error", err)
		}
	})
}

// Key returns the public key for a token's kid and algorithm.
func (ks *KeySet) Key(ctx context.Context, kid, alg string) (any, error) {
	k, ok := ks.lookup(kid)
	if !ok && (ks.File != "" || ks.URL != "") {
		ks.refreshOnDemand(ctx)
		k, ok = ks.lookup(kid)
	}
	if !ok {
		return nil, fmt.Errorf("no key with id %q", kid)
	}
	if k.Algorithm != "" && k.Algorithm != alg {
		return nil, fmt.Errorf("key %q is for %s, token uses %s", kid, k.Algorithm, alg)
	}
	switch pub := k.Key.(type) {
	case *rsa.PublicKey:
		if !strings.HasPrefix(alg, "RS") && !strings.HasPrefix(alg, "PS") {
			return nil, fmt.Errorf("key %q is RSA, token uses %s", kid, alg)
		}
		return pub, nil
	case *ecdsa.PublicKey:
		if !strings.HasPrefix(alg, "ES") {
			return nil, fmt.Errorf("key %q is ECDSA, token uses %s", kid, alg)
		}
		return pub, nil
	case ed25519.PublicKey:
		if alg != "EdDSA" {
			return nil, fmt.Errorf("key %q is Ed25519, token uses %s", kid, alg)
		}
		return pub, nil
	}
	return nil, fmt.Errorf("key %q has an unsupported type", kid)
}

// refreshOnDemand refreshes for an unknown key id: one refresh at a time
// (concurrent callers wait for it and then use its result), at most once
// per MinRefresh since the last attempt or successful refresh.
func (ks *KeySet) refreshOnDemand(ctx context.Context) {
	ks.onDemand.Lock()
	defer ks.onDemand.Unlock()
	minInterval := ks.MinRefresh
	if minInterval <= 0 {
		minInterval = 10 * time.Second
	}
	ks.mu.RLock()
	last := ks.fetched
	ks.mu.RUnlock()
	if ks.attempted.After(last) {
		last = ks.attempted
	}
	if time.Since(last) < minInterval {
		return
	}
	ks.attempted = time.Now()
	if err := ks.Refresh(ctx); err != nil && ks.Logger != nil {
		ks.Logger.Warn("JWKS refresh for an unknown key id failed; keeping the current keys", "error", err)
	}
}

func (ks *KeySet) lookup(kid string) (jose.JSONWebKey, bool) {
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	k, ok := ks.keys[kid]
	if !ok && kid == "" && len(ks.keys) == 1 {
		for _, only := range ks.keys {
			return only, true
		}
	}
	return k, ok
}
