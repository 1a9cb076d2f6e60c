package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
)

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
			t.Fatalf("request %d to %s after etcd was emptied: served by %q, %v\ndigests: %+v", i, region, c, err, p.Fleet(region).Digests().Digests())
		}
	}
	for f, b := range before {
		if now, err := os.ReadFile(f); err != nil || !bytes.Equal(now, b) {
			t.Fatalf("last-known-good copy %s changed (err %v):\n%s", filepath.Base(f), err, now)
		}
	}
}
