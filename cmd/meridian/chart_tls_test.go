package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/meridian-router/meridian/platform"
)

// renderTier2 renders the chart with vals and returns Tier-2's Deployment
// and its public Service.
func renderTier2(t *testing.T, vals map[string]any) (*appsv1.Deployment, *corev1.Service) {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValuesWithSchemaValidation(c, vals,
		common.ReleaseOptions{Name: "meridian", Namespace: "meridian", Revision: 1, IsInstall: true}, common.DefaultCapabilities, false)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Engine{Strict: true}.Render(c, rv)
	if err != nil {
		t.Fatal(err)
	}
	var d *appsv1.Deployment
	var svc *corev1.Service
	for _, doc := range strings.Split(out["meridian/templates/tier2.yaml"], "\n---") {
		var head struct {
			Kind     string
			Metadata struct{ Name string }
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatal(err)
		}
		switch {
		case head.Kind == "Deployment":
			d = new(appsv1.Deployment)
			err = yaml.Unmarshal([]byte(doc), d)
		case head.Kind == "Service" && head.Metadata.Name == "meridian-tier2":
			svc = new(corev1.Service)
			err = yaml.Unmarshal([]byte(doc), svc)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if d == nil || svc == nil {
		t.Fatal("no Tier-2 Deployment or public Service rendered")
	}
	return d, svc
}

// Tier-2 started with exactly the arguments the chart renders for the
// us-east-1 values (TLS from a Secret, the operator's IdP): the Service's
// port 443 leads to HTTPS with the Secret's certificate, where a token
// from another issuer gets 401 and plain HTTP never reaches the API; its
// port 80 answers 308 to HTTPS and serves nothing.
func TestChartTLSValues(t *testing.T) {
	signing, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: signing.Public(), KeyID: "k", Algorithm: "ES256", Use: "sig"}}})
	}))
	defer idp.Close()

	data, err := os.ReadFile("../../deploy/examples/helm/values-us-east-1.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(data, &vals); err != nil {
		t.Fatal(err)
	}
	// The example's IdP, at a loopback address: what the values say of
	// issuer, audience and claims stays.
	vals["tier2"].(map[string]any)["auth"].(map[string]any)["jwksURL"] = idp.URL + "/jwks.json"
	d, svc := renderTier2(t, vals)

	// The mounted Secrets, as files: the TLS Secret and the gossip key.
	dir := t.TempDir()
	cert := writeTLSSecret(t, filepath.Join(dir, "tls"))
	os.MkdirAll(filepath.Join(dir, "gossip"), 0o755)
	os.WriteFile(filepath.Join(dir, "gossip", "keys"), []byte(base64.StdEncoding.EncodeToString([]byte("0123456789abcdef"))+"\n"), 0o600)
	container := d.Spec.Template.Spec.Containers[0]
	ports := map[string]string{} // container port name → local address
	var args []string
	for _, a := range container.Args[1:] {
		name, value, _ := strings.Cut(a, "=")
		switch name {
		case "--config":
			value = "../../deploy/examples/platform"
		case "--tls-cert", "--tls-key", "--gossip-key-file":
			value = filepath.Join(dir, strings.TrimPrefix(value, "/etc/meridian/"))
		case "--listen", "--redirect-http", "--metrics", "--gossip-bind":
			value = "127.0.0.1:0"
		case "--join":
			continue // no other instance here
		}
		args = append(args, name+"="+value)
	}
	var f tier2Flags
	if err := tier2Command(&f).ParseFlags(args); err != nil {
		t.Fatalf("the chart's arguments %q: %v", args, err)
	}
	f.tier2.Name = "t2"
	t2, err := platform.StartTier2(t.Context(), f.tier2, slog.New(slog.DiscardHandler))
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
	listen := map[string]string{"--listen": t2.Addr(), "--redirect-http": t2.RedirectAddr()}
	for _, p := range container.Ports {
		for _, a := range container.Args {
			if name, value, _ := strings.Cut(a, "="); listen[name] != "" && strings.HasSuffix(value, ":"+strconv.Itoa(int(p.ContainerPort))) {
				ports[p.Name] = listen[name]
			}
		}
	}
	public := map[int32]string{} // Service port → the listener it reaches
	for _, sp := range svc.Spec.Ports {
		public[sp.Port] = ports[sp.TargetPort.StrVal]
	}
	t.Logf("Service ports → listeners: %v", public)
	if public[443] == "" || public[80] == "" {
		t.Fatalf("Service ports %v reach %v: want 443 and 80 on Tier-2's listeners", svc.Spec.Ports, public)
	}

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
	post := func(url, tok string) (int, string, http.Header, *tls.ConnectionState) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"support-agent","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header, resp.TLS
	}
	good, other := token("https://auth.example.com/"), token("https://attacker.example/")
	code, body, _, st := post("https://"+public[443], other)
	if st == nil || !bytes.Equal(st.PeerCertificates[0].Raw, cert.Raw) {
		t.Fatal("port 443 did not answer with the Secret's certificate")
	}
	if code != http.StatusUnauthorized || !strings.Contains(body, "authentication_error") {
		t.Errorf("a token of another issuer: %d %s, want 401 authentication_error", code, body)
	}
	if code, body, _, _ := post("https://"+public[443], good); code == http.StatusUnauthorized {
		t.Errorf("a token of the configured issuer: 401 %s", body)
	}
	if code, body, _, _ := post("http://"+public[443], good); code != http.StatusBadRequest || strings.Contains(body, `"error"`) {
		t.Errorf("plain HTTP to port 443: %d %q, want the TLS server's own 400", code, body)
	}
	if code, body, h, _ := post("http://"+public[80], good); code != http.StatusPermanentRedirect || !strings.HasPrefix(h.Get("Location"), "https://") || strings.Contains(body, `"error"`) {
		t.Errorf("plain HTTP to port 80: %d Location %q %q, want a 308 to HTTPS", code, h.Get("Location"), body)
	}
}

// writeTLSSecret writes a self-signed certificate for 127.0.0.1 as a
// kubernetes.io/tls Secret mounts it (tls.crt, tls.key in dir).
func writeTLSSecret(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "api.example.com"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	return cert
}
