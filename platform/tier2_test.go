package platform_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/configtest"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/platform"
)

// A Tier-2 on etcd (meridian tier2 --etcd) resolves the example's relative
// jwksFile (keys/jwks.json) against Root (--config-root), since an etcd key is no place on
// disk; without it (the working directory here) the file is not found.
func TestTier2EtcdRelativeJWKSFile(t *testing.T) {
	e := configtest.StartEtcd(t)
	const example = "../deploy/examples/platform"
	docs, _, err := config.ReadDir(example)
	if err != nil {
		t.Fatal(err)
	}
	e.Commit(t, docs)
	flags := func(root string) platform.Tier2Config {
		return platform.Tier2Config{Source: platform.Source{Etcd: []string{e.Endpoint()}, Prefix: config.DefaultPrefix,
			Cache: filepath.Join(t.TempDir(), "lkg.json"), Root: root}, Region: "us-east-1", Name: "t2", Listen: "127.0.0.1:0"}
	}
	log := slog.New(slog.DiscardHandler)
	if _, err := platform.StartTier2(t.Context(), flags(""), log); err == nil || !strings.Contains(err.Error(), "jwks.json") {
		t.Fatalf("without --config-root: %v, want the missing keys/jwks.json named", err)
	}
	f := flags(example)
	f.Metrics = "127.0.0.1:0"
	t2, err := platform.StartTier2(t.Context(), f, log)
	if err != nil {
		t.Fatalf("tier2 --etcd --config-root %s: %v", example, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- t2.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}()

	// A topology-less configuration is refused by Tier-2, so it is counted
	// as an invalid reload, not an ok one.
	metrics := "http://" + t2.MetricsAddr() + "/metrics"
	scrape := func() string {
		resp, err := http.Get(metrics)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	testkit.Eventually(t, "etcd reported up", func() bool { return strings.Contains(scrape(), "meridian_config_etcd_up 1") })
	if _, err := e.Client.Delete(t.Context(), config.KeyOf(config.DefaultPrefix, config.ObjectKey{Kind: config.KindTopology, Name: "global"})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the topology-less configuration counted invalid", func() bool {
		return strings.Contains(scrape(), `meridian_config_reloads_total{result="invalid"} 1`)
	})
	if m := scrape(); !strings.Contains(m, `meridian_config_reloads_total{result="ok"} 1`) {
		t.Fatalf("reloads after the refusal:\n%s", grepLines(m, "meridian_config_reloads_total"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Settings that contradict each other are usage errors (meridian exits 2),
// found before anything listens.
func TestSettingErrorsAreUsage(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	for name, start := range map[string]func() error{
		"tier2 without a Region": func() error {
			_, err := platform.StartTier2(t.Context(), platform.Tier2Config{Source: platform.Source{Dir: dir}}, log)
			return err
		},
		"tier2 with an unknown gossip profile": func() error {
			_, err := platform.StartTier2(t.Context(), platform.Tier2Config{Region: "r", GossipProfile: "moon", Source: platform.Source{Dir: dir}}, log)
			return err
		},
		"tier2 with a certificate and no key": func() error {
			_, err := platform.StartTier2(t.Context(), platform.Tier2Config{Region: "r", TLSCert: "c.pem", Source: platform.Source{Dir: dir}}, log)
			return err
		},
		"tier2 redirecting to HTTPS it does not serve": func() error {
			_, err := platform.StartTier2(t.Context(), platform.Tier2Config{Region: "r", RedirectHTTP: "127.0.0.1:0", Source: platform.Source{Dir: dir}}, log)
			return err
		},
		"tier1 with both a directory and etcd": func() error {
			_, err := platform.StartTier1(t.Context(), platform.Tier1Config{Source: platform.Source{Dir: dir, Etcd: []string{"127.0.0.1:1"}}}, log)
			return err
		},
		"tier1 with peers but no health feed": func() error {
			_, err := platform.StartTier1(t.Context(), platform.Tier1Config{Source: platform.Source{Dir: dir}, Peers: []string{"127.0.0.1:1"}, Listen: "127.0.0.1:0"}, log)
			return err
		},
	} {
		if err := start(); !errors.Is(err, platform.ErrUsage) {
			t.Errorf("%s: %v, want an ErrUsage", name, err)
		}
	}
}
