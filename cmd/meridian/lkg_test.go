package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/configtest"
	"github.com/meridian-router/meridian/internal/testkit"
)

// `meridian tier2 --etcd` resolves the example's relative jwksFile
// (keys/jwks.json) against --config-root, since an etcd key is no place on
// disk; without it (the working directory here) the file is not found.
func TestTier2EtcdRelativeJWKSFile(t *testing.T) {
	e := configtest.StartEtcd(t)
	const platform = "../../deploy/examples/platform"
	docs, _, err := config.ReadDir(platform)
	if err != nil {
		t.Fatal(err)
	}
	store := &config.Store{Client: e.Client}
	plan, err := store.PlanApply(t.Context(), docs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Commit(t.Context(), plan); err != nil {
		t.Fatal(err)
	}
	flags := func(root string) tier2Flags {
		return tier2Flags{src: sourceFlags{endpoints: []string{e.Endpoint()}, prefix: config.DefaultPrefix,
			cache: filepath.Join(t.TempDir(), "lkg.json"), root: root}, region: "us-east-1", name: "t2", listen: "127.0.0.1:0"}
	}
	log := slog.New(slog.DiscardHandler)
	if _, err := startTier2(t.Context(), flags(""), nil, nil, log, nil); err == nil || !strings.Contains(err.Error(), "jwks.json") {
		t.Fatalf("without --config-root: %v, want the missing keys/jwks.json named", err)
	}
	f := flags(platform)
	f.metrics = "127.0.0.1:0"
	t2, err := startTier2(t.Context(), f, nil, nil, log, nil)
	if err != nil {
		t.Fatalf("tier2 --etcd --config-root %s: %v", platform, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- t2.run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}()

	// A topology-less configuration is refused by Tier-2, so it is counted
	// as an invalid reload, not an ok one.
	metrics := "http://" + t2.servers[1].Addr() + "/metrics"
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

// Row "etcd emptied" end to end: an `etcdctl del --prefix` by mistake
// under a running `meridian up --etcd`. Every component refuses the empty
// state (reloads{invalid}), keeps serving the configuration in force, and
// its last-known-good copy stays byte for byte.
func TestEtcdEmptiedKeepsServing(t *testing.T) {
	p, e := canaryPlatform(t)
	copies, err := filepath.Glob(filepath.Join(os.TempDir(), "meridian-up-*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(copies) != 4 { // two Tier-1s, two Tier-2s
		t.Fatalf("last-known-good copies %v, want one per component (4)", copies)
	}
	before := map[string][]byte{}
	for _, f := range copies {
		if before[f], err = os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Client.Delete(t.Context(), config.DefaultPrefix, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	for _, m := range p.Metrics {
		if job := m.Labels["job"]; job != "meridian-tier1" && job != "meridian-tier2" {
			continue
		}
		url := "http://" + m.Addr + "/metrics"
		testkit.Eventually(t, m.Labels["job"]+" "+m.Labels["region"]+" refuses the emptied state", func() bool {
			resp, err := http.Get(url)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return strings.Contains(string(b), `meridian_config_reloads_total{result="invalid"} 1`)
		})
	}
	for i := range 20 {
		region := p.Regions[i%len(p.Regions)]
		if c, err := served(p, region, fmt.Sprint("emptied-", i)); err != nil || c != "use1" {
			var apiErr *openai.Error
			if errors.As(err, &apiErr) {
				err = fmt.Errorf("%w: %s", err, apiErr.RawJSON())
			}
			t.Fatalf("request %d to %s after etcd was emptied: served by %q, %v\ndigests: %+v", i, region, c, err, p.fleets[region].Digests().Digests())
		}
	}
	for f, b := range before {
		if now, err := os.ReadFile(f); err != nil || !bytes.Equal(now, b) {
			t.Fatalf("last-known-good copy %s changed (err %v):\n%s", filepath.Base(f), err, now)
		}
	}
}
