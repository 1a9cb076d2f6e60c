package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/deploy/examples"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/tier2"
	"github.com/meridian-router/meridian/tier2/gossip/gossiptest"
)

func init() { extraCommands = append(extraCommands, newUpCmd) }

type upFlags struct {
	dir        string
	listen     string
	timeScale  float64
	crossDelay time.Duration
	tenant     string
	ports      string
	targets    string
	verbose    bool
	etcd       []string
	prefix     string
}

func newUpCmd() *cobra.Command {
	var f upFlags
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a local multi-Region platform with simulated model servers",
		Long: "Start, in one process on loopback, the example platform (deploy/examples/platform, embedded\n" +
			"in the binary): every Region's Tier-2, every cluster's Tier-1 and simulated model-server pods\n" +
			"of mixed GPU generations. Cross-Region hops get an injected delay so Region proximity is real.\n" +
			"It prints the endpoint, a development token and a sample request. Ctrl-C stops everything.",
		Example: "  meridian up\n  meridian up --ports auto --tenant research\n  meridian up --listen 127.0.0.1:9000 --config deploy/examples/platform",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level := slog.LevelWarn
			if f.verbose {
				level = slog.LevelInfo
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			return runUp(cmd.Context(), f, cmd.OutOrStdout(), log)
		},
	}
	cmd.Flags().StringVar(&f.dir, "config", "", "configuration directory (default: the embedded example platform)")
	cmd.Flags().StringVar(&f.listen, "listen", "", "address of the first Region's Tier-2 (default: the Topology's)")
	cmd.Flags().Float64Var(&f.timeScale, "time-scale", 10, "simulated model seconds per wall-clock second")
	cmd.Flags().DurationVar(&f.crossDelay, "cross-region-delay", 40*time.Millisecond, "one-way delay injected on cross-Region hops")
	cmd.Flags().StringVar(&f.tenant, "tenant", "support-team", "tenant of the printed development token")
	cmd.Flags().StringVar(&f.ports, "ports", portsConfig, "listen ports: config (the configuration's, moving any that is taken to a free one) or auto (free ports for everything)")
	cmd.Flags().StringVar(&f.targets, "prometheus-targets", "", "write a Prometheus file_sd JSON of every metrics endpoint to this file")
	cmd.Flags().BoolVarP(&f.verbose, "verbose", "v", false, "log at info level")
	cmd.Flags().StringSliceVar(&f.etcd, "etcd", nil, "serve the configuration from etcd (seeded with --config or the example when the prefix is empty), so `meridian canary --etcd` can change it")
	cmd.Flags().StringVar(&f.prefix, "prefix", config.DefaultPrefix, "etcd key prefix (with --etcd)")
	return cmd
}

// Platform is a started local platform (used by tests too).
type Platform struct {
	Endpoints map[string]string // Region → Tier-2 base URL
	Regions   []string          // in Topology order
	Token     string
	Pods      []*sim.LivePod
	Metrics   []MetricsTarget
	// Tier1 maps each cluster to its Tier-1 proxy's address.
	Tier1 map[string]string
	// Moved lists the listeners that did not get their configured port.
	Moved []portMove
	run   func(ctx context.Context) error

	mu    sync.Mutex
	stops map[string]context.CancelFunc // component → stop, once running

	snap   *config.Snapshot
	key    *ecdsa.PrivateKey
	fleets map[string]*regions.Fleet // Region → its Tier-2's fleet
}

// sign returns a development token for tenant.
func (p *Platform) sign(tenant string) (string, error) { return devToken(p.snap, p.key, tenant) }

// Stop stops one component ("tier1/<cluster>" or "tier2/<region>") of a
// running platform, as if its process died.
func (p *Platform) Stop(component string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	stop, ok := p.stops[component]
	if ok {
		stop()
	}
	return ok
}

// MetricsTarget is one metrics endpoint and its labels.
type MetricsTarget struct {
	Addr   string
	Labels map[string]string
}

// loadUpConfig reads the platform's configuration and moves the listeners
// whose ports are taken (all of them with --ports auto) to free ports, in
// the configuration every component reads, so that Tier-2 reaches the
// Tier-1s and the Tier-1s their pods where they really listen.
func loadUpConfig(ctx context.Context, f upFlags) (*config.Snapshot, sourceFlags, []portMove, error) {
	if len(f.etcd) > 0 {
		return etcdUpConfig(ctx, f)
	}
	var (
		docs []config.Document
		err  error
		src  sourceFlags
	)
	if f.dir != "" {
		docs, _, err = config.ReadDir(f.dir)
		src.dir = f.dir
	} else {
		docs, err = config.ReadFS(examples.Platform(), "embedded:deploy/examples/platform")
	}
	if err != nil {
		return nil, sourceFlags{}, nil, err
	}
	s, err := config.Build(docs, 1)
	if err != nil {
		return nil, sourceFlags{}, nil, err
	}
	if s.Topology == nil || len(s.Topology.Spec.Regions) == 0 {
		return nil, sourceFlags{}, nil, errNoTopology
	}
	moves, err := planPorts(s, f.listen, f.ports)
	if err != nil {
		return nil, sourceFlags{}, nil, err
	}
	if len(moves) > 0 {
		if s, err = config.Build(moveDocs(docs, moves), 1); err != nil {
			return nil, sourceFlags{}, nil, err
		}
		if f.dir != "" {
			src.rewrite = func(d []config.Document) []config.Document { return moveDocs(d, moves) }
		}
	}
	if f.dir == "" {
		src.static = s
	}
	return s, src, moves, nil
}

// etcdUpConfig serves the platform from etcd. An empty prefix is seeded
// first with --config or the embedded example; moved ports are written
// back to the stored Topology and StaticEndpoints.
func etcdUpConfig(ctx context.Context, f upFlags) (*config.Snapshot, sourceFlags, []portMove, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: f.etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, sourceFlags{}, nil, fmt.Errorf("up: etcd: %w", err)
	}
	defer cli.Close()
	store := &config.Store{Client: cli, Prefix: f.prefix}
	snap, err := store.Load(ctx)
	if err == nil && len(snap.Objects) == 0 {
		var docs []config.Document
		if f.dir != "" {
			docs, _, err = config.ReadDir(f.dir)
		} else {
			docs, err = config.ReadFS(examples.Platform(), "embedded:deploy/examples/platform")
		}
		var plan *config.Plan
		if err == nil {
			plan, err = store.PlanApply(ctx, docs, nil)
		}
		if err == nil {
			_, err = store.Commit(ctx, plan)
		}
		if err == nil {
			snap, err = store.Load(ctx)
		}
	}
	if err != nil {
		return nil, sourceFlags{}, nil, fmt.Errorf("up: %w", err)
	}
	if snap.Topology == nil || len(snap.Topology.Spec.Regions) == 0 {
		return nil, sourceFlags{}, nil, errNoTopology
	}
	moves, err := planPorts(snap, f.listen, f.ports)
	if err != nil {
		return nil, sourceFlags{}, nil, err
	}
	if len(moves) > 0 {
		var docs []config.Document
		for _, k := range snap.Keys() {
			if k.Kind != config.KindTopology && k.Kind != config.KindStaticEndpoints {
				continue
			}
			o := snap.Objects[k]
			ds, errs := config.Decode(o.Origin, o.JSON)
			if err := errs.Err(); err != nil {
				return nil, sourceFlags{}, nil, fmt.Errorf("up: %w", err)
			}
			docs = append(docs, ds...)
		}
		plan, err := store.PlanApply(ctx, moveDocs(docs, moves), nil)
		if err == nil {
			_, err = store.Commit(ctx, plan)
		}
		if err == nil {
			snap, err = store.Load(ctx)
		}
		if err != nil {
			return nil, sourceFlags{}, nil, fmt.Errorf("up: storing the moved ports: %w", err)
		}
	}
	cache := filepath.Join(os.TempDir(), fmt.Sprintf("meridian-up-%d.json", os.Getpid()))
	return snap, sourceFlags{endpoints: f.etcd, prefix: f.prefix, cache: cache}, moves, nil
}

// forComponent gives each component of the local platform its own
// last-known-good file (they would otherwise rewrite one file at once).
func (f sourceFlags) forComponent(name string) sourceFlags {
	if f.cache != "" {
		f.cache = strings.TrimSuffix(f.cache, ".json") + "-" + name + ".json"
	}
	return f
}

func startUp(ctx context.Context, f upFlags, log *slog.Logger) (*Platform, error) {
	snap, src, moves, err := loadUpConfig(ctx, f)
	if err != nil {
		return nil, err
	}
	p := &Platform{Endpoints: map[string]string{}, stops: map[string]context.CancelFunc{}, fleets: map[string]*regions.Fleet{},
		Moved: moves, Tier1: map[string]string{}}
	type component struct {
		name string
		run  func(ctx context.Context) error
	}
	var runs []component
	cleanup := func() {
		for _, lp := range p.Pods {
			lp.Close()
		}
	}

	// Simulated pods, one per StaticEndpoints entry.
	regionOf := map[string]string{} // cluster → Region
	for _, r := range snap.Topology.Spec.Regions {
		for _, c := range r.Clusters {
			regionOf[c.Name] = r.Name
		}
	}
	for _, se := range snap.StaticEndpoints {
		for _, ep := range se.Spec.Endpoints {
			lp, err := startPod(ctx, snap, se.Spec.Cluster, regionOf[se.Spec.Cluster], ep, f.timeScale)
			if err != nil {
				cleanup()
				return nil, err
			}
			p.Pods = append(p.Pods, lp)
			p.Metrics = append(p.Metrics, MetricsTarget{Addr: lp.Addr(), Labels: map[string]string{
				"job": "model-servers", "pool": ep.Labels["pool"], "cluster": se.Spec.Cluster, "region": regionOf[se.Spec.Cluster]}})
		}
	}

	// One Tier-1 per cluster.
	for _, r := range snap.Topology.Spec.Regions {
		for _, c := range r.Clusters {
			u, err := url.Parse(c.Tier1)
			if err != nil {
				cleanup()
				return nil, err
			}
			t1, err := startTier1(ctx, tier1Flags{src: src.forComponent(c.Name), cluster: c.Name, replica: c.Name + "-0", listen: u.Host,
				metrics: "127.0.0.1:0", health: c.Health, region: r.Name, scrapeInterval: 50 * time.Millisecond, maxMetricsAge: time.Second,
				promptSamples: true}, log) // a local platform carries your own prompts: show where they diverge
			if err != nil {
				cleanup()
				return nil, fmt.Errorf("up: cluster %s: %w", c.Name, err)
			}
			runs = append(runs, component{"tier1/" + c.Name, t1.run})
			p.Tier1[c.Name] = t1.servers[0].Addr()
			p.Metrics = append(p.Metrics, MetricsTarget{Addr: t1.servers[1].Addr(), Labels: map[string]string{
				"job": "meridian-tier1", "cluster": c.Name, "region": r.Name}})
		}
	}

	// A development key and token.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	keys := tier2.StaticKeySet(jose.JSONWebKey{Key: key.Public(), KeyID: "meridian-up", Algorithm: "ES256", Use: "sig"})
	p.snap, p.key = snap, key
	if p.Token, err = devToken(snap, key, f.tenant); err != nil {
		cleanup()
		return nil, err
	}

	// One Tier-2 per Region, gossiping over a loopback network that delays
	// cross-Region packets, and forwarding through a transport that delays
	// cross-Region requests.
	netw := gossiptest.NewNetwork()
	var joins []string
	for i, r := range snap.Topology.Spec.Regions {
		for _, other := range snap.Topology.Spec.Regions {
			if other.Name != r.Name {
				netw.Delay(gossiptest.Region(r.Name), gossiptest.Region(other.Name), f.crossDelay)
			}
		}
		name := "tier2-" + r.Name
		gt, err := netw.Transport(name, r.Name)
		if err != nil {
			cleanup()
			return nil, err
		}
		addr := ""
		if len(r.Tier2) > 0 {
			addr = r.Tier2[0]
		}
		if i == 0 && f.listen != "" {
			addr = f.listen
		}
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		t2, err := startTier2(ctx, tier2Flags{src: src.forComponent(name), region: r.Name, name: name, listen: addr, metrics: "127.0.0.1:0",
			gossipBind: "127.0.0.1:0", join: slices.Clone(joins), gossipProfile: "local"},
			keys, delayTransport(r.Name, regionOf, snap, f.crossDelay), log, gt)
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("up: Tier-2 of %s: %w", r.Name, err)
		}
		joins = append(joins, t2.inst.Node.Addr())
		runs = append(runs, component{"tier2/" + r.Name, t2.run})
		p.Endpoints[r.Name] = "http://" + t2.servers[0].Addr()
		p.Regions = append(p.Regions, r.Name)
		p.fleets[r.Name] = t2.inst.Fleet
		p.Metrics = append(p.Metrics, MetricsTarget{Addr: t2.servers[1].Addr(), Labels: map[string]string{"job": "meridian-tier2", "region": r.Name}})
	}
	p.run = func(ctx context.Context) error {
		defer cleanup()
		g, gctx := errgroup.WithContext(ctx)
		for _, c := range runs {
			cctx, cancel := context.WithCancel(gctx)
			p.mu.Lock()
			p.stops[c.name] = cancel
			p.mu.Unlock()
			g.Go(func() error { defer cancel(); return c.run(cctx) })
		}
		return g.Wait()
	}
	return p, nil
}

// startPod starts the simulated pod a StaticEndpoints entry names: its GPU
// profile from the gpu label, its model and adapters from the scheduler
// whose selector picks it.
func startPod(ctx context.Context, snap *config.Snapshot, cluster, region string, ep config.StaticEndpoint, timeScale float64) (*sim.LivePod, error) {
	prof, err := sim.LookupProfile(ep.Labels["gpu"])
	if err != nil {
		return nil, fmt.Errorf("up: endpoint %s: %w", ep.Name, err)
	}
	model := ep.Labels["model"]
	var adapters []string
	if gw := snap.Gateway(cluster); gw != nil {
		for _, sc := range gw.Spec.Schedulers {
			if config.MatchLabels(sc.ModelSelector.MatchLabels, ep.Labels) {
				model = sc.ModelName
				adapters = sc.LoraAdapters
			}
		}
	}
	host, port, err := net.SplitHostPort(ep.Address)
	if err != nil {
		return nil, err
	}
	var portN int
	fmt.Sscan(port, &portN)
	labels := map[string]string{"pool": ep.Labels["pool"], "cluster": cluster, "region": region}
	pods, err := sim.StartPods(ctx, sim.PodSpec{
		Pod:         sim.PodConfig{Name: ep.Name, Profile: prof, Model: model, Adapters: adapters, Labels: ep.Labels},
		Host:        host,
		BasePort:    portN,
		TimeScale:   timeScale,
		ConstLabels: labels,
	}, 1)
	if err != nil {
		return nil, fmt.Errorf("up: pod %s at %s: %w", ep.Name, ep.Address, err)
	}
	return pods[0], nil
}

// devToken signs a development token with the gateways' issuer and
// audience for tenant.
func devToken(snap *config.Snapshot, key *ecdsa.PrivateKey, tenant string) (string, error) {
	claims := jwt.MapClaims{"sub": "developer", "tenant": tenant, "criticality": "Standard",
		"iat": time.Now().Unix(), "exp": time.Now().Add(24 * time.Hour).Unix()}
	for _, g := range snap.Gateways {
		if j := g.Spec.Auth.JWT; j != nil {
			claims["iss"] = j.Issuer
			if len(j.Audiences) > 0 {
				claims["aud"] = j.Audiences[0]
			}
			if j.RequiredClaims.Tenant != "" {
				claims[j.RequiredClaims.Tenant] = tenant
			}
			break
		}
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, claims)
	tok.Header["kid"] = "meridian-up"
	return tok.SignedString(key)
}

// delayTransport delays requests from region to clusters of other Regions.
func delayTransport(region string, regionOf map[string]string, snap *config.Snapshot, d time.Duration) http.RoundTripper {
	far := map[string]bool{}
	for _, r := range snap.Topology.Spec.Regions {
		for _, c := range r.Clusters {
			if r.Name != region {
				if u, err := url.Parse(c.Tier1); err == nil {
					far[u.Host] = true
				}
			}
		}
	}
	return &delayed{inner: tier2.NewTransport(), far: far, d: d}
}

type delayed struct {
	inner http.RoundTripper
	far   map[string]bool
	d     time.Duration
}

func (t *delayed) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.far[r.URL.Host] && t.d > 0 {
		timer := time.NewTimer(2 * t.d) // there and back before the first byte
		select {
		case <-r.Context().Done():
			timer.Stop()
			return nil, r.Context().Err()
		case <-timer.C:
		}
	}
	return t.inner.RoundTrip(r)
}

func runUp(ctx context.Context, f upFlags, out io.Writer, log *slog.Logger) error {
	p, err := startUp(ctx, f, log)
	if err != nil {
		return err
	}
	if f.targets != "" {
		if err := writeTargets(f.targets, p.Metrics); err != nil {
			return err
		}
	}
	printUp(out, f, p)
	return p.run(ctx)
}

// printUp tells the operator where the platform listens and how to call it.
func printUp(out io.Writer, f upFlags, p *Platform) {
	regionsList := p.Regions
	first := p.Endpoints[regionsList[0]]
	fmt.Fprintf(out, "Meridian is up: %d Regions, %d simulated pods.\n", len(p.Endpoints), len(p.Pods))
	for _, r := range regionsList {
		fmt.Fprintf(out, "  %-10s %s\n", r, p.Endpoints[r])
	}
	for _, c := range sortedKeysOf(p.Tier1) {
		fmt.Fprintf(out, "  tier1 %-14s http://%s\n", c, p.Tier1[c])
	}
	for _, m := range sortedMoves(p.Moved) {
		fmt.Fprintf(out, "  moved %-20s %s → %s (port taken or --ports auto)\n", m.What, m.From, m.To)
	}
	fmt.Fprintf(out, "metrics: %d endpoints on free ports (--prometheus-targets writes them); gossip: in-process loopback network\n", len(p.Metrics))
	fmt.Fprintf(out, "endpoint: %s\n", first)
	fmt.Fprintf(out, "tenant: %s (the token's tenant; another with --tenant)\n", f.tenant)
	fmt.Fprintf(out, "token: %s\n", p.Token)
	fmt.Fprintf(out, "\nTry:\n  curl -s %s/v1/chat/completions \\\n    -H \"Authorization: Bearer %s\" \\\n    -H 'Content-Type: application/json' \\\n    -d '{\"model\":\"support-agent\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'\n", first, p.Token)
	fmt.Fprintf(out, "\nModels:\n  curl -s %s/v1/models -H \"Authorization: Bearer %s\"\n\nCtrl-C stops everything.\n", first, p.Token)
}

func writeTargets(path string, ts []MetricsTarget) error {
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	var gs []group
	for _, t := range ts {
		gs = append(gs, group{Targets: []string{t.Addr}, Labels: t.Labels})
	}
	b, err := json.MarshalIndent(gs, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func sortedKeysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
