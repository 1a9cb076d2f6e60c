package platform_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/meridian-router/meridian/platform"
	"github.com/meridian-router/meridian/tier2"
)

// selfSigned writes a certificate for 127.0.0.1 and its key into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tier2.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	cert, _ = x509.ParseCertificate(der)
	return certFile, keyFile, cert
}

// Tier-2 with TLS: it answers HTTPS with the configured certificate; a
// plain HTTP request to that port never reaches the API; a token from an
// issuer other than the configured one gets 401; and the redirect
// listener sends plain HTTP callers to HTTPS with a 308, serving nothing.
func TestTLSFrontDoor(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, cert := selfSigned(t, dir)
	signing, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	f := platform.Tier2Config{Source: platform.Source{Dir: "../deploy/examples/platform"}, Region: "us-east-1", Name: "t2",
		Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, RedirectHTTP: "127.0.0.1:0",
		Keys: tier2.StaticKeySet(jose.JSONWebKey{Key: signing.Public(), KeyID: "k", Algorithm: "ES256", Use: "sig"})}
	t2, err := platform.StartTier2(t.Context(), f, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- t2.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}()

	pool := x509.NewCertPool()
	pool.AddCert(cert)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	token := func(issuer string) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": issuer, "aud": "meridian", "sub": "s", "tenant": "support-team",
			"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()})
		tok.Header["kid"] = "k"
		s, err := tok.SignedString(signing)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	post := func(base, tok string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"support-agent","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	https := "https://" + t2.Addr()
	resp, err := client.Get(https + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(resp.TLS.PeerCertificates[0].Raw, cert.Raw) {
		t.Errorf("HTTPS /healthz: %d with certificate %s, want 200 with the configured one", resp.StatusCode, resp.TLS.PeerCertificates[0].Subject)
	}
	if resp, body := post(https, token("https://attacker.example/")); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "authentication_error") {
		t.Errorf("a token of another issuer: %d %s, want 401 authentication_error", resp.StatusCode, body)
	}
	if resp, body := post(https, token("https://auth.example.com/")); resp.StatusCode == http.StatusUnauthorized {
		t.Errorf("a token of the configured issuer: 401 %s", body)
	}

	// Plain HTTP to the HTTPS port: Go's TLS server answers 400 itself.
	resp, body := post("http://"+t2.Addr(), token("https://auth.example.com/"))
	if resp.StatusCode != http.StatusBadRequest || strings.Contains(body, `"error"`) {
		t.Errorf("plain HTTP to the HTTPS port: %d %q, want the TLS server's own 400", resp.StatusCode, body)
	}
	// The redirect listener: a 308 to the same path over HTTPS, and no API.
	resp, body = post("http://"+t2.RedirectAddr(), token("https://auth.example.com/"))
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusPermanentRedirect || loc != "https://127.0.0.1/v1/chat/completions" || strings.Contains(body, `"error"`) {
		t.Errorf("plain HTTP to the redirect listener: %d Location %q body %q, want 308 to https://127.0.0.1/v1/chat/completions", resp.StatusCode, loc, body)
	}
}
