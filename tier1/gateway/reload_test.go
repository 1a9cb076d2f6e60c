package gateway_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/configtest"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/request"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/gateway"
)

// reloadYAML is pool "chat" of two pods with the given admission settings
// (YAML flow mapping, or "" for none), the Critical tenant payments, and
// extra documents. Admission settings come with scheduler options that
// turn fallbacks off and hash 16-character prefix blocks.
func reloadYAML(admission, extra string) string {
	if admission == "" {
		return reloadYAMLWith("", "", extra)
	}
	return reloadYAMLWith(admission, "{fallbacks: -1, prefix: {blockSize: 16}}", extra)
}

// reloadYAMLWith is reloadYAML with the scheduler options given too
// ("" for none).
func reloadYAMLWith(admission, options, extra string) string {
	adm := ""
	if admission != "" {
		adm = "    admission: " + admission + "\n"
	}
	if options != "" {
		adm += "    options: " + options + "\n"
	}
	return testkit.ChatGateway + adm + twoPodsYAML + tenantsYAML + extra
}

const objectivesYAML = `---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: batch}
spec: {priority: -1}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: checkout}
spec: {priority: 2}
`

// TestAdmissionReloadsLive changes a pool's admission settings and the
// InferenceObjectives through the directory source and through etcd while
// Critical requests flow, and sees each change take effect on the next
// request: none of the flowing requests fails, and a request admitted
// before a reload finishes normally after it.
func TestAdmissionReloadsLive(t *testing.T) {
	t.Run("directory", func(t *testing.T) {
		dir := t.TempDir()
		file := filepath.Join(dir, "platform.yaml")
		write := func(y string) {
			if err := os.WriteFile(file, []byte(y), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write(reloadYAML("", ""))
		src := &config.DirSource{Dir: dir, Logger: quiet}
		if err := src.Start(); err != nil {
			t.Fatal(err)
		}
		reloadScenario(t, src.Snapshot(), func(y string) (*config.Snapshot, error) {
			write(y)
			if err := src.Reload(); err != nil {
				return nil, err
			}
			return src.Snapshot(), nil
		})
	})
	t.Run("etcd", func(t *testing.T) {
		e := configtest.StartEtcd(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		store := &config.Store{Client: e.Client, Prefix: config.DefaultPrefix}
		commit := func(y string) (int64, error) {
			docs, errs := config.Decode("apply.yaml", []byte(y))
			if err := errs.Err(); err != nil {
				return 0, err
			}
			p, err := store.PlanApply(ctx, docs, nil)
			if err != nil {
				return 0, err
			}
			return store.Commit(ctx, p)
		}
		if _, err := commit(reloadYAML("", "")); err != nil {
			t.Fatal(err)
		}
		src := &config.EtcdSource{Client: e.Client, CacheFile: filepath.Join(t.TempDir(), "lkg.json"), Logger: quiet}
		if err := src.Start(ctx); err != nil {
			t.Fatal(err)
		}
		updates := src.Subscribe()
		go src.Run(ctx)
		reloadScenario(t, src.Snapshot(), func(y string) (*config.Snapshot, error) {
			rev, err := commit(y)
			if err != nil {
				return nil, err
			}
			deadline := time.NewTimer(20 * time.Second)
			defer deadline.Stop()
			for {
				select {
				case s := <-updates:
					if s.Revision >= rev {
						return s, nil
					}
				case <-deadline.C:
					return nil, errors.New("etcd: the write was not published within 20s")
				}
			}
		})
	})
}

// reloadScenario runs the changes of TestAdmissionReloadsLive through
// reload, which writes a configuration to a source and returns the
// snapshot the source then serves.
func reloadScenario(t *testing.T, first *config.Snapshot, reload func(yaml string) (*config.Snapshot, error)) {
	gw, err := gateway.New(gateway.Config{Cluster: "c1", Logger: quiet, Registerer: prometheus.NewRegistry()}, first)
	if err != nil {
		t.Fatal(err)
	}
	eps := map[string]*tier1.Endpoint{}
	for _, ep := range gw.Pools()[0].Pool.Endpoints() {
		eps[endpointName(ep.ID)] = ep
	}
	// One waiting request on each pod: saturation 0.2 with the default
	// queue threshold (5), 0.5 with a threshold of 2.
	load(gw, eps, map[string]int{"a": 1, "b": 1})

	ctx := context.Background()
	header := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	serve := func(d *gateway.Decision) {
		gw.Dispatch(d, d.Endpoints[0]).Done(http.StatusOK, false)
		d.Release()
	}
	// sheddable asks for a Sheddable request by objective name or
	// integer and reports whether it was admitted (false: refused 429).
	sheddable := func(objective string) (*gateway.Decision, bool) {
		t.Helper()
		d, err := gw.Route(ctx, body, gateway.Meta{Header: header(gateway.HeaderObjective, objective)})
		var ae *request.APIError
		switch {
		case err == nil:
			return d, true
		case errors.As(err, &ae) && ae.Status == http.StatusTooManyRequests:
			return nil, false
		}
		t.Fatalf("objective %q: %v", objective, err)
		return nil, false
	}
	// apply reloads y while four clients send Critical requests, and fails
	// if any of them (or the reload) failed.
	apply := func(y string) {
		t.Helper()
		var err error
		testkit.UnderTraffic(t, 4, func(int, int) string {
			d, rerr := gw.Route(ctx, body, gateway.Meta{Header: header(gateway.HeaderTenant, "payments", gateway.HeaderBand, "Critical")})
			if rerr != nil {
				return rerr.Error()
			}
			serve(d)
			return ""
		}, func() string {
			var s *config.Snapshot
			if s, err = reload(y); err == nil {
				err = gw.Apply(s)
			}
			return "the reload"
		}, func() bool { return true })
		if err != nil {
			t.Fatal(err)
		}
		load(gw, eps, map[string]int{"a": 1, "b": 1}) // the observe loop's next tick
	}

	// critical routes a Critical request with a 640-character prompt and
	// reports how many endpoints and prefix blocks its decision had.
	critical := func() (endpoints, blocks int) {
		t.Helper()
		long := &request.Body{Model: "chat-model", Kind: request.Completion, Prompt: strings.Repeat("0123456789", 64)}
		d, err := gw.Route(ctx, long, gateway.Meta{Header: header(gateway.HeaderTenant, "payments", gateway.HeaderBand, "Critical")})
		if err != nil {
			t.Fatal(err)
		}
		defer serve(d)
		return len(d.Endpoints), len(d.Request.Hashes)
	}
	eps0, blocks0 := critical()
	if eps0 != 2 {
		t.Fatalf("%d endpoints with the default 2 fallbacks over 2 pods", eps0)
	}

	// Defaults: reserve 0.65, so Sheddable is admitted below 0.35.
	held, ok := sheddable("-1")
	if !ok {
		t.Fatal("Sheddable refused at saturation 0.2 with the default reserve")
	}
	if _, _, err := gw.Band(header(gateway.HeaderObjective, "batch")); err == nil {
		t.Fatal("objective batch accepted before it is configured")
	}

	// Queue threshold 2 (saturation 0.5) and reserve 0.6 (Sheddable only
	// below 0.4), and two objectives.
	apply(reloadYAML("{queueThreshold: 2, criticalReserve: 0.6, maxQueued: 50}", objectivesYAML))
	if th := gw.Pools()[0].Thresholds(); th.Queue != 2 {
		t.Fatalf("thresholds after reload %+v", th)
	}
	if eps, blocks := critical(); eps != 1 || blocks <= blocks0 {
		t.Fatalf("after the reload: %d endpoints (want 1: fallbacks -1), %d prefix blocks (want more than %d: block size 16)", eps, blocks, blocks0)
	}
	if _, ok := sheddable("batch"); ok {
		t.Fatal("Sheddable (objective batch) admitted at saturation 0.5 with reserve 0.6")
	}
	// (The tenant may claim Critical; the objective names the band.)
	if _, band, err := gw.Band(header(gateway.HeaderObjective, "checkout", gateway.HeaderTenant, "payments")); err != nil || band != priority.Critical {
		t.Fatalf("objective checkout: band %v, %v; want Critical", band, err)
	}
	if _, band, _ := gw.Band(header(gateway.HeaderObjective, "batch")); band != priority.Sheddable {
		t.Fatalf("objective batch: band %v; want Sheddable", band)
	}
	// The request admitted before the reload ends normally.
	serve(held)

	// No reserve: Sheddable is admitted up to saturation 1 again.
	apply(reloadYAML("{queueThreshold: 2, criticalReserve: 0}", objectivesYAML))
	d, ok := sheddable("batch")
	if !ok {
		t.Fatal("Sheddable refused at saturation 0.5 with no reserve")
	}
	serve(d)

	// An invalid change is refused by the source and changes nothing.
	if _, err := reload(reloadYAML("{queueThreshold: 2, criticalReserve: 0, reserve: 1}", objectivesYAML)); err == nil {
		t.Fatal("an unknown admission field was accepted")
	}
	if th := gw.Pools()[0].Thresholds(); th.Queue != 2 {
		t.Fatalf("thresholds changed by a refused configuration: %+v", th)
	}

	fieldsScenario(t, gw, eps, apply, sheddable, critical, serve)
}

// fieldsScenario changes each remaining admission field and scheduler
// option in its own reload (apply: traffic flowing, none failing) and
// sees the behaviour it governs change.
func fieldsScenario(t *testing.T, gw *gateway.Gateway, eps map[string]*tier1.Endpoint, reload func(string),
	sheddable func(string) (*gateway.Decision, bool), critical func() (int, int), serve func(*gateway.Decision)) {
	ctx := context.Background()
	// metrics gives every pod m, scraped age ago, and lets the pool's
	// Gate observe it (the observe loop's next tick).
	metrics := func(m tier1.Metrics, age time.Duration) {
		for _, ep := range eps {
			mm := m
			mm.ScrapedAt = time.Now().Add(-age)
			ep.SetMetrics(&mm)
		}
		gw.ObservePools()
	}
	// apply reloads with the pool below saturation, so that the Critical
	// requests flowing across the reload are admitted (nothing would
	// drain a saturated pool here: there is no observe loop).
	apply := func(y string) {
		t.Helper()
		metrics(tier1.Metrics{Waiting: 1}, 0)
		reload(y)
	}
	admitShed := func(what string, want bool) {
		t.Helper()
		d, ok := sheddable("batch")
		if ok != want {
			t.Fatalf("%s: Sheddable admitted = %v, want %v", what, ok, want)
		}
		if ok {
			serve(d)
		}
	}
	refusal := func(what string, err error, code string) *request.APIError {
		t.Helper()
		var ae *request.APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests || ae.Code != code {
			t.Fatalf("%s: %v; want 429 %s", what, err, code)
		}
		return ae
	}
	standard := http.Header{}
	crit := http.Header{}
	crit.Set(gateway.HeaderTenant, "payments")
	crit.Set(gateway.HeaderBand, "Critical")
	saturated := tier1.Metrics{Waiting: 6} // 1.2 at the default queue threshold

	// kvCacheThreshold: KV use 0.45 is saturation 0.56 at the default
	// 0.8 (Sheddable admitted with no reserve), full at 0.4.
	metrics(tier1.Metrics{KVCacheUsage: 0.45}, 0)
	admitShed("KV 0.45, default KV threshold", true)
	apply(reloadYAMLWith("{criticalReserve: 0, kvCacheThreshold: 0.4}", "", objectivesYAML))
	metrics(tier1.Metrics{KVCacheUsage: 0.45}, 0)
	admitShed("KV 0.45, kvCacheThreshold 0.4", false)

	// staleAfter: metrics 5s old are left out at the default 2s (a blind
	// pool refuses Sheddable), and count at 1m.
	apply(reloadYAMLWith("{criticalReserve: 0}", "", objectivesYAML))
	metrics(tier1.Metrics{Waiting: 1}, 5*time.Second)
	admitShed("metrics 5s old, default staleAfter", false)
	apply(reloadYAMLWith("{criticalReserve: 0, staleAfter: 1m}", "", objectivesYAML))
	metrics(tier1.Metrics{Waiting: 1}, 5*time.Second)
	admitShed("metrics 5s old, staleAfter 1m", true)

	// maxQueued: with room for one waiting request, a Standard request
	// behind a waiting Critical one is refused at once.
	apply(reloadYAMLWith("{maxQueued: 1}", "", objectivesYAML))
	metrics(saturated, 0)
	wctx, cancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := gw.Route(wctx, body, gateway.Meta{Header: crit})
		waited <- err
	}()
	deadline := time.Now().Add(20 * time.Second)
	for gw.Gate("chat").Len() == 0 { // an observable condition, bounded
		if time.Now().After(deadline) {
			t.Fatal("the Critical request did not queue within 20s")
		}
		runtime.Gosched()
	}
	_, err := gw.Route(ctx, body, gateway.Meta{Header: standard})
	refusal("Standard behind a waiting Critical with maxQueued 1", err, "queue_full")
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiting Critical request: %v; want it cancelled by its caller", err)
	}

	// maxQueuedBytes: a body larger than the bound cannot wait.
	apply(reloadYAMLWith("{maxQueuedBytes: 1000}", "", objectivesYAML))
	metrics(saturated, 0)
	_, err = gw.Route(ctx, body, gateway.Meta{Header: standard, Bytes: 5000})
	refusal("a 5000-byte body with maxQueuedBytes 1000", err, "queue_full")

	// standardMaxWait and retryAfter: a Standard request waits 1ms, not
	// the default 10s, and its 429 asks for 7s, not the default 1s.
	apply(reloadYAMLWith("{standardMaxWait: 1ms, retryAfter: 7s}", "", objectivesYAML))
	metrics(saturated, 0)
	_, err = gw.Route(ctx, body, gateway.Meta{Header: standard})
	if ae := refusal("Standard with standardMaxWait 1ms", err, "queue_timeout"); ae.RetryAfter != 7 {
		t.Fatalf("Retry-After %d with retryAfter 7s", ae.RetryAfter)
	}

	// criticalMaxWait: a Critical request waits 1ms, not the default 30s.
	apply(reloadYAMLWith("{criticalMaxWait: 1ms}", "", objectivesYAML))
	metrics(saturated, 0)
	_, err = gw.Route(ctx, body, gateway.Meta{Header: crit})
	refusal("Critical with criticalMaxWait 1ms", err, "queue_timeout")

	// options.prefix.maxPrefixBlocksToMatch caps the blocks hashed.
	apply(reloadYAMLWith("{criticalReserve: 0}", "{prefix: {blockSize: 16, maxPrefixBlocksToMatch: 3}}", objectivesYAML))
	if _, blocks := critical(); blocks != 3 {
		t.Fatalf("%d prefix blocks with maxPrefixBlocksToMatch 3", blocks)
	}

	// options.maxMetricsAge: pod a, idle but scraped 3s ago, is avoided
	// at the default 1s (b, busier and fresh, is picked) and preferred at
	// 1m.
	primary := func() string {
		t.Helper()
		eps["a"].SetMetrics(&tier1.Metrics{ScrapedAt: time.Now().Add(-3 * time.Second)})
		eps["b"].SetMetrics(&tier1.Metrics{Waiting: 3, ScrapedAt: time.Now()})
		gw.ObservePools()
		d, err := gw.Route(ctx, body, gateway.Meta{Header: crit})
		if err != nil {
			t.Fatal(err)
		}
		defer serve(d)
		return endpointName(d.Endpoints[0].ID)
	}
	if p := primary(); p != "b" {
		t.Fatalf("primary %s with pod a's metrics 3s old and the default maxMetricsAge; want b", p)
	}
	apply(reloadYAMLWith("{criticalReserve: 0}", "{maxMetricsAge: 1m}", objectivesYAML))
	if p := primary(); p != "a" {
		t.Fatalf("primary %s with pod a's metrics 3s old and maxMetricsAge 1m; want a (idle)", p)
	}
}

// A reload that changes what a pool's prefix hashes mean (the scoring
// mode, the block size) empties its index; one that changes neither, say
// the weights, keeps it. Kept, GIE's per-block entries would hold the
// pods' capacity under Meridian's anchored matching (and Meridian's
// anchors would match nothing under GIE's), until evicted.
func TestReloadResetsIndexWhenHashesChangeMeaning(t *testing.T) {
	yaml := func(sched string) *config.Snapshot {
		return testkit.Snapshot(t, 1, testkit.ChatGateway+sched+twoPodsYAML)
	}
	gw, err := gateway.New(gateway.Config{Cluster: "c1", Logger: quiet, Registerer: prometheus.NewRegistry(),
		Options: tier1.Options{MaxMetricsAge: time.Hour}}, yaml("    scoring: gie\n"))
	if err != nil {
		t.Fatal(err)
	}
	pool := gw.Pools()[0].Pool
	for _, ep := range pool.Endpoints() {
		ep.SetMetrics(&tier1.Metrics{ScrapedAt: time.Now(), BlockSize: 16, GPUBlocks: 1000})
	}
	prompt := &request.Body{Model: "chat-model", Kind: request.Completion, Prompt: strings.Repeat("a long shared prompt ", 100)}
	fill := func() {
		t.Helper()
		d, err := gw.Route(context.Background(), prompt, gateway.Meta{Header: http.Header{}})
		if err != nil {
			t.Fatal(err)
		}
		gw.Dispatch(d, d.Endpoints[0]).Done(http.StatusOK, false)
		d.Release()
		if pool.PrefixIndex().Len() == 0 {
			t.Fatal("a dispatch left the index empty")
		}
	}
	for _, step := range []struct {
		name, sched string
		reset       bool
	}{
		{"gie to meridian", "    scoring: meridian\n", true},
		{"weights only", "    scoring: meridian\n    weights: {queue: 1, prefix: 5}\n", false},
		{"block size", "    scoring: meridian\n    weights: {queue: 1, prefix: 5}\n    options: {prefix: {blockSize: 32}}\n", true},
		{"meridian to gie", "    scoring: gie\n    options: {prefix: {blockSize: 32}}\n", true},
	} {
		fill()
		before := pool.PrefixIndex().Len()
		if err := gw.Apply(yaml(step.sched)); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if after := pool.PrefixIndex().Len(); (after == 0) != step.reset || (!step.reset && after != before) {
			t.Fatalf("%s: index %d entries → %d, want reset %v", step.name, before, after, step.reset)
		}
	}
}
