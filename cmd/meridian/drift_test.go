package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/platform"
	"github.com/meridian-router/meridian/platform/platformtest"
	"github.com/meridian-router/meridian/tier2"
)

// driftPlatform starts the two-Region test platform with pool fast
// serving the adapter fast-lora in both clusters, its pods' /v1/models
// read every 200 ms; it returns the platform, its configuration directory
// (what it runs, hot-reloaded), a copy of it as first written (the Git
// truth) and the Tier-2s' admin URLs.
func driftPlatform(t *testing.T) (p *platform.Platform, live, git string, admin []string) {
	t.Helper()
	p = platformtest.Start(t, func(c *platform.Config) {
		live, c.ModelsInterval = c.Dir, 200*time.Millisecond
		file := filepath.Join(c.Dir, "platform.yaml")
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		b = []byte(strings.ReplaceAll(string(b), "    modelSelector: {matchLabels: {pool: fast}}", "    modelSelector: {matchLabels: {pool: fast}}\n    loraAdapters: [fast-lora]"))
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		git = t.TempDir()
		if err := os.WriteFile(filepath.Join(git, "platform.yaml"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	for _, m := range p.Metrics {
		if m.Labels["job"] == "meridian-tier2" {
			admin = append(admin, "http://"+m.Addr)
		}
	}
	if len(admin) != 2 {
		t.Fatalf("Tier-2 admin listeners %v, want two", admin)
	}
	return p, live, git, admin
}

// drift runs meridian config drift --json and returns its divergences and
// exit code.
func drift(t *testing.T, args ...string) ([]tier2.Divergence, int) {
	t.Helper()
	out, err := runMeridian(t, append([]string{"config", "drift", "--json"}, args...)...)
	code := 0
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		code = ee.code
	case err != nil:
		t.Fatalf("config drift: %v\n%s", err, out)
	}
	var rep struct{ Divergences []tier2.Divergence }
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("config drift printed %q: %v", out, err)
	}
	return rep.Divergences, code
}

func has(divs []tier2.Divergence, model, kind, cluster, field string) bool {
	for _, d := range divs {
		if d.Model == model && d.Kind == kind && d.Cluster == cluster && (field == "" || strings.Contains(","+strings.Join(d.Fields, ",")+",", ","+field+",")) {
			return true
		}
	}
	return false
}

// One cluster's scheduler weights changed (only there) show up in
// `meridian config drift` between the clusters and against the Git truth,
// naming that cluster and the field, and in meridian_tier2_pool_drift;
// reverting clears it.
func TestConfigDriftThroughPlatform(t *testing.T) {
	_, live, git, admin := driftPlatform(t)
	urls := strings.Join(admin, ",")
	if divs, code := drift(t, "--tier2", urls, "--against", git); code != 0 || len(divs) != 0 {
		t.Fatalf("a platform running what Git holds: exit %d, %+v", code, divs)
	}

	file := filepath.Join(live, "platform.yaml")
	orig, _ := os.ReadFile(file)
	changed := strings.Replace(string(orig), "loraAdapters: [fast-lora]", "loraAdapters: [fast-lora]\n    weights: {queue: 5, kvCache: 1, prefix: 1}", 1) // the first gateway is use1's
	if err := os.WriteFile(file, []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	var divs []tier2.Divergence
	testkit.Eventually(t, "the weights drift reported", func() bool {
		var code int
		divs, code = drift(t, "--tier2", urls, "--against", git)
		return code == 1 && has(divs, "fast", tier2.KindConfiguration, "us-east-1/use1", "weights") &&
			has(divs, "fast", "definition", "us-east-1/use1", "weights")
	})
	for _, d := range divs {
		if d.Kind == tier2.KindConfiguration && d.Cluster != "us-east-1/use1" {
			t.Errorf("against Git, only use1 runs something else: %+v", d)
		}
	}
	for _, a := range admin {
		if v := testkit.Metric(t, testkit.Scraped(strings.TrimPrefix(a, "http://")), "meridian_tier2_pool_drift",
			map[string]string{"model_name": "fast", "kind": "definition"}); v < 1 {
			t.Errorf("%s: meridian_tier2_pool_drift{fast,definition} = %v, want at least 1", a, v)
		}
	}

	if err := os.WriteFile(file, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the drift cleared", func() bool {
		divs, code := drift(t, "--tier2", urls, "--against", git)
		return code == 0 && len(divs) == 0
	})
}

// A cluster whose pods lose an adapter and serve a shorter context:
// the drift is reported, and requests that need the adapter or the long
// context never reach it and all succeed, served by the other cluster,
// even when sent to its own Region's Tier-2.
func TestDriftedClusterAvoided(t *testing.T) {
	p, _, _, admin := driftPlatform(t)
	for _, lp := range p.Pods {
		if strings.HasPrefix(lp.Name(), "eu-fast") {
			if err := lp.SetServed(nil, 4096); err != nil {
				t.Fatal(err)
			}
		}
	}
	testkit.Eventually(t, "adapters and context length drift reported", func() bool {
		divs, code := drift(t, "--tier2", strings.Join(admin, ","))
		return code == 1 && has(divs, "fast", "adapters", "eu-west-1/euw1", "") && has(divs, "fast", "context_length", "eu-west-1/euw1", "")
	})
	token := platformtest.Token(t, p, "team-a")
	long := strings.Repeat("tell me more about routers. ", 800) // about 5,600 tokens: more than 4,096
	for _, region := range []string{"eu-west-1", "us-east-1"} {
		for i, body := range []string{
			`{"model":"fast-lora","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`,
			`{"model":"fast","max_tokens":4,"messages":[{"role":"user","content":"` + long + `"}]}`,
		} {
			for n := range 5 {
				req, _ := http.NewRequest(http.MethodPost, p.Endpoints[region]+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				what := fmt.Sprintf("%s request %d.%d", region, i, n)
				if resp.StatusCode != http.StatusOK {
					t.Errorf("%s: status %d", what, resp.StatusCode)
				}
				if c := resp.Header.Get("X-Meridian-Cluster"); c != "use1" {
					t.Errorf("%s: served by %q, want use1 (euw1's pods cannot serve it)", what, c)
				}
			}
		}
	}
}
