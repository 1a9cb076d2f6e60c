// Package platform assembles Meridian's processes from their parts: one
// cluster's Tier-1 (StartTier1: gateway, proxy, metrics, health feed,
// ext_proc, discovery, configuration source), one Region's Tier-2
// (StartTier2: instance, front door, metrics, canary store, CloudWatch),
// and the local platform `meridian up` runs (Start): simulated pods, a
// Tier-1 per cluster and a Tier-2 per Region in one process on loopback,
// gossiping over faultnet with a delay between Regions.
//
// It decides how the parts are wired and started and how a partial start
// is undone; it decides nothing about routing. cmd/meridian parses flags
// into its configurations, and tests start the same processes.
package platform

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/kube"
	"github.com/meridian-router/meridian/deploy/examples"
	"github.com/meridian-router/meridian/internal/tracing"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/tier2"
	"github.com/meridian-router/meridian/tier2/gossip/faultnet"
)

// Config is a local platform (meridian up's flags).
type Config struct {
	Dir    string // configuration directory; empty: the embedded example platform
	Listen string // the first Region's Tier-2 address; empty: the Topology's
	// TimeScale is simulated model seconds per wall-clock second.
	TimeScale float64
	// CrossRegionDelay is the one-way delay injected on cross-Region hops
	// (gossip and Tier-2 to Tier-1), so that Region proximity is real.
	CrossRegionDelay time.Duration
	Tenant           string // tenant of the development token
	// Criticality is the band the development token claims (empty:
	// Standard); a band above the tenant's maxBand is refused.
	Criticality string
	Ports       string // PortsConfig (or empty) or PortsAuto
	// Etcd, when set, serves the configuration from etcd under Prefix,
	// seeded with Dir or the example when the prefix is empty.
	Etcd   []string
	Prefix string
	// Kubernetes, when set, serves the configuration from cluster objects
	// in Namespace (through Kubeconfig; empty: in-cluster), seeded like
	// etcd's.
	Kubernetes bool
	Kubeconfig string
	Namespace  string
	FrontDoor  tier2.Config // every Tier-2's front-door settings
	Version    string       // meridian_build_info's version
	// ModelsInterval is how often the Tier-1s read each pod's /v1/models
	// again (what it serves: adapters, context length); zero means 30 s.
	ModelsInterval time.Duration
	// DrainTimeout bounds how long the Tier-2s wait for open requests when
	// the platform stops, before each stream still open gets a
	// shutting_down event. The Tier-1s and pods stop only after the
	// Tier-2s have drained. Zero means 30 s.
	DrainTimeout time.Duration
	// Tracing exports the spans of every Tier-2, Tier-1 and simulated pod
	// (services meridian-tier2, meridian-tier1, meridian-sim) when its
	// Endpoint is set.
	Tracing tracing.Config
	// AccessLog writes a line per request of every Tier-2 and Tier-1.
	AccessLog bool
	// ExtProc also serves each Tier-1's endpoint picker over ext_proc (the
	// GIE protocol an Envoy-based Gateway speaks), at Platform.ExtProc.
	ExtProc bool
}

// Platform is a started local platform: simulated pods, a Tier-1 per
// cluster and a Tier-2 per Region, all in this process on loopback.
type Platform struct {
	Endpoints map[string]string // Region → Tier-2 base URL
	Regions   []string          // in Topology order
	Token     string
	Pods      []*sim.LivePod
	Metrics   []MetricsTarget
	// Tier1 maps each cluster to its Tier-1 proxy's address.
	Tier1 map[string]string
	// ExtProc maps each cluster to its Tier-1's ext_proc address
	// (Config.ExtProc).
	ExtProc map[string]string
	// Moved lists the listeners that did not get their configured port.
	Moved []PortMove
	run   func(ctx context.Context) error

	mu    sync.Mutex
	stops map[string]context.CancelFunc // component → stop, once running

	snap   *config.Snapshot
	key    *ecdsa.PrivateKey
	fleets map[string]*regions.Fleet // Region → its Tier-2's fleet
}

// SampleModel is a model tenant may call: the example platform's
// support-agent when the tenant may call it (or every model), else the
// first of the models its Tenant object lists.
func (p *Platform) SampleModel(tenant string) string {
	const preferred = "support-agent"
	t := p.snap.Tenants[tenant]
	if t == nil || len(t.Spec.Models) == 0 || slices.Contains(t.Spec.Models, preferred) {
		return preferred
	}
	return t.Spec.Models[0]
}

// Admin maps each Region to its Tier-2's admin listener (GET /metrics,
// /meridian/canary, /meridian/drift) base URL.
func (p *Platform) Admin() map[string]string {
	out := map[string]string{}
	for _, m := range p.Metrics {
		if m.Labels["job"] == "meridian-tier2" {
			out[m.Labels["region"]] = "http://" + m.Addr
		}
	}
	return out
}

// Sign returns a development token for tenant, of band Standard.
func (p *Platform) Sign(tenant string) (string, error) { return devToken(p.snap, p.key, tenant, "") }

// SignBand returns a development token for tenant claiming band
// (Critical, Standard, Sheddable), refused when the tenant's maxBand
// does not allow it.
func (p *Platform) SignBand(tenant, band string) (string, error) {
	return devToken(p.snap, p.key, tenant, band)
}

// Fleet is the view of every cluster that region's Tier-2 routes by.
func (p *Platform) Fleet(region string) *regions.Fleet { return p.fleets[region] }

// Ready returns nil once every Tier-2 holds a digest of every pool of
// every cluster with all the pool's simulated pods ready (so that a
// request to any Region may go to any cluster), or ctx's error when it
// ends first. Run must be running.
func (p *Platform) Ready(ctx context.Context) error {
	want := p.podsPerPool()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if !slices.ContainsFunc(p.Regions, func(r string) bool { return !holds(p.fleets[r], want) }) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// holds reports whether f has a digest of every pool in want with at
// least its count of pods ready.
func holds(f *regions.Fleet, want map[string]int) bool {
	ready := map[string]bool{}
	for _, d := range f.Digests().Digests() {
		if n, ok := want[d.Cluster+"/"+d.Pool]; ok && d.ReadyPods >= n {
			ready[d.Cluster+"/"+d.Pool] = true
		}
	}
	return len(ready) == len(want)
}

// podsPerPool counts the simulated pods of each pool ("cluster/pool")
// that has any.
func (p *Platform) podsPerPool() map[string]int {
	want := map[string]int{}
	for _, se := range p.snap.StaticEndpoints {
		gw := p.snap.Gateway(se.Spec.Cluster)
		if gw == nil {
			continue
		}
		for _, ep := range se.Spec.Endpoints {
			for _, sc := range gw.Spec.Schedulers {
				if config.MatchLabels(sc.ModelSelector.MatchLabels, ep.Labels) {
					want[se.Spec.Cluster+"/"+sc.Name]++
				}
			}
		}
	}
	return want
}

// Run serves until ctx ends, then stops every component and pod.
func (p *Platform) Run(ctx context.Context) error { return p.run(ctx) }

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

// loadConfig reads the platform's configuration and moves the listeners
// whose ports are taken (all of them with --ports auto) to free ports, in
// the configuration every component reads, so that Tier-2 reaches the
// Tier-1s and the Tier-1s their pods where they really listen.
func loadConfig(ctx context.Context, f Config) (*config.Snapshot, Source, []PortMove, error) {
	if len(f.Etcd) > 0 && f.Kubernetes {
		return nil, Source{}, nil, usage(errors.New("set either --etcd or --source kubernetes, not both"))
	}
	if len(f.Etcd) > 0 {
		return etcdConfig(ctx, f)
	}
	if f.Kubernetes {
		return kubeConfig(ctx, f)
	}
	docs, err := readDocs(f.Dir)
	if err != nil {
		return nil, Source{}, nil, err
	}
	s, err := config.Build(docs, 1)
	if err != nil {
		return nil, Source{}, nil, err
	}
	moves, err := movePorts(s, f)
	if err != nil {
		return nil, Source{}, nil, err
	}
	src := Source{Dir: f.Dir}
	if len(moves) > 0 {
		if s, err = config.Build(moveDocs(docs, moves), 1); err != nil {
			return nil, Source{}, nil, err
		}
		src.rewrite = func(d []config.Document) []config.Document { return moveDocs(d, moves) }
	}
	if f.Dir == "" {
		src.static = s
	}
	return s, src, moves, nil
}

// readDocs reads the configuration directory, or the embedded example
// platform when dir is empty.
func readDocs(dir string) ([]config.Document, error) {
	if dir == "" {
		return config.ReadFS(examples.Platform(), "embedded:deploy/examples/platform")
	}
	docs, _, err := config.ReadDir(dir)
	return docs, err
}

// movePorts checks that s can run as a local platform and plans where
// its listeners go (planPorts).
func movePorts(s *config.Snapshot, f Config) ([]PortMove, error) {
	if s.Topology == nil || len(s.Topology.Spec.Regions) == 0 {
		return nil, errNoTopology
	}
	return planPorts(s, f.Listen, f.Ports)
}

// etcdConfig serves the platform from etcd (storedConfig).
func etcdConfig(ctx context.Context, f Config) (*config.Snapshot, Source, []PortMove, error) {
	cli, err := newEtcdClient(f.Etcd)
	if err != nil {
		return nil, Source{}, nil, fmt.Errorf("up: %w", err)
	}
	defer cli.Close()
	store := &config.Store{Client: cli, Prefix: f.Prefix}
	snap, moves, err := storedConfig(ctx, f, store.Load, func(docs []config.Document) error {
		plan, err := store.PlanApply(ctx, docs, nil)
		if err == nil {
			_, err = store.Commit(ctx, plan)
		}
		return err
	})
	if err != nil {
		return nil, Source{}, nil, err
	}
	cache := filepath.Join(os.TempDir(), fmt.Sprintf("meridian-up-%d.json", os.Getpid()))
	return snap, Source{Etcd: f.Etcd, Prefix: f.Prefix, Cache: cache}, moves, nil
}

// kubeConfig serves the platform from cluster objects (storedConfig).
func kubeConfig(ctx context.Context, f Config) (*config.Snapshot, Source, []PortMove, error) {
	clients, ns, err := kube.Connect(f.Kubeconfig, f.Namespace, "meridian")
	if err != nil {
		return nil, Source{}, nil, fmt.Errorf("up: %w", err)
	}
	store := &kube.Store{Dynamic: clients.Dynamic, Client: clients.Client, Namespace: ns}
	snap, moves, err := storedConfig(ctx, f, store.Load, func(docs []config.Document) error {
		plan, err := store.PlanApply(ctx, docs, nil)
		if err == nil {
			_, err = store.Commit(ctx, plan)
		}
		return err
	})
	if err != nil {
		return nil, Source{}, nil, err
	}
	return snap, Source{Kubernetes: true, Kubeconfig: f.Kubeconfig, Namespace: ns}, moves, nil
}

// storedConfig serves the platform from a store (etcd, the cluster's
// objects): an empty one is seeded first with Dir or the embedded
// example; moved ports are written back to the stored Topology and
// StaticEndpoints. write stores docs as one validated, revision-checked
// change.
func storedConfig(ctx context.Context, f Config, load func(context.Context) (*config.Snapshot, error), write func([]config.Document) error) (*config.Snapshot, []PortMove, error) {
	snap, err := load(ctx)
	if err == nil && len(snap.Objects) == 0 {
		var docs []config.Document
		if docs, err = readDocs(f.Dir); err == nil {
			if err = write(docs); err == nil {
				snap, err = load(ctx)
			}
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("up: %w", err)
	}
	moves, err := movePorts(snap, f)
	if err != nil {
		return nil, nil, err
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
				return nil, nil, fmt.Errorf("up: %w", err)
			}
			docs = append(docs, ds...)
		}
		if err := write(moveDocs(docs, moves)); err != nil {
			return nil, nil, fmt.Errorf("up: storing the moved ports: %w", err)
		}
		if snap, err = load(ctx); err != nil {
			return nil, nil, fmt.Errorf("up: %w", err)
		}
	}
	return snap, moves, nil
}

// Start reads the platform's configuration, moves the listeners whose
// ports are taken, and starts every pod and binds every listener; Run
// serves. An error leaves nothing open.
func Start(ctx context.Context, f Config, log *slog.Logger) (*Platform, error) {
	snap, src, moves, err := loadConfig(ctx, f)
	if err != nil {
		return nil, err
	}
	p := &Platform{Endpoints: map[string]string{}, stops: map[string]context.CancelFunc{}, fleets: map[string]*regions.Fleet{},
		Moved: moves, Tier1: map[string]string{}, ExtProc: map[string]string{}}
	type component struct {
		name string
		run  func(ctx context.Context) error
	}
	var runs []component
	stopTracing := func() {}
	closePods := func() {
		for _, lp := range p.Pods {
			lp.Close()
		}
		stopTracing()
	}
	// fail undoes a partial start: each component started runs on an
	// ended context, which closes its listeners, and the pods close.
	fail := func(err error) (*Platform, error) {
		ended, cancel := context.WithCancel(ctx)
		cancel()
		for _, c := range runs {
			c.run(ended)
		}
		closePods()
		return nil, err
	}

	// Simulated pods, one per StaticEndpoints entry. They outlive ctx:
	// Run closes them once the tiers in front have drained.
	regionOf := map[string]string{} // cluster → Region
	for _, r := range snap.Topology.Spec.Regions {
		for _, c := range r.Clusters {
			regionOf[c.Name] = r.Name
		}
	}
	// The token is checked before anything starts: a tenant the
	// configuration does not know (Tier-2 would refuse its every request)
	// or a band it may not claim is a usage error.
	if _, ok := snap.Tenants[f.Tenant]; !ok && f.FrontDoor.DefaultTenant == "" {
		return nil, usage(fmt.Errorf("--tenant %q: no Tenant of that name in the configuration (Tier-2 would refuse its token with 403); configured: %s",
			f.Tenant, strings.Join(slices.Sorted(maps.Keys(snap.Tenants)), ", ")))
	}
	if _, err := devToken(snap, nil, f.Tenant, f.Criticality); err != nil && !errors.Is(err, errNoKey) {
		return nil, usage(err)
	}
	podTracing, err := startTracing(ctx, f.Tracing, "meridian-sim", nil)
	if err != nil {
		return nil, usage(err)
	}
	tracer := podTracing.Tracer("github.com/meridian-router/meridian/sim")
	stopTracing = func() { shutdownTracing(podTracing, log) }
	for _, se := range snap.StaticEndpoints {
		for _, ep := range se.Spec.Endpoints {
			lp, err := startPod(context.WithoutCancel(ctx), snap, se.Spec.Cluster, regionOf[se.Spec.Cluster], ep, f.TimeScale, tracer)
			if err != nil {
				return fail(err)
			}
			p.Pods = append(p.Pods, lp)
			p.Metrics = append(p.Metrics, MetricsTarget{Addr: lp.Addr(), Labels: map[string]string{
				"job": "model-servers", "pool": ep.Labels["pool"], "cluster": se.Spec.Cluster, "region": regionOf[se.Spec.Cluster]}})
		}
	}

	// A key Tier-2s sign tenant and band with, so that the Tier-1s trust
	// those headers only from them (internal/trust).
	identity := make([]byte, 32)
	rand.Read(identity)

	// One Tier-1 per cluster.
	for _, r := range snap.Topology.Spec.Regions {
		for _, c := range r.Clusters {
			u, err := url.Parse(c.Tier1)
			if err != nil {
				return fail(err)
			}
			ext := ""
			if f.ExtProc {
				ext = "127.0.0.1:0"
			}
			t1, err := StartTier1(ctx, Tier1Config{Source: src.forComponent(c.Name), Cluster: c.Name, Replica: c.Name + "-0", Listen: u.Host, ExtProc: ext,
				Metrics: "127.0.0.1:0", Health: c.Health, Region: r.Name, ScrapeInterval: 50 * time.Millisecond, MaxMetricsAge: time.Second, ModelsInterval: f.ModelsInterval,
				PromptSamples: true, IdentityKey: identity, Version: f.Version, Tracing: f.Tracing, AccessLog: f.AccessLog}, log) // a local platform carries your own prompts: show where they diverge
			if err != nil {
				return fail(fmt.Errorf("up: cluster %s: %w", c.Name, err))
			}
			runs = append(runs, component{"tier1/" + c.Name, t1.Run})
			p.Tier1[c.Name] = t1.Addr()
			if ext != "" {
				p.ExtProc[c.Name] = t1.ExtProcAddr()
			}
			p.Metrics = append(p.Metrics, MetricsTarget{Addr: t1.MetricsAddr(), Labels: map[string]string{
				"job": "meridian-tier1", "cluster": c.Name, "region": r.Name}})
		}
	}

	// A development key and token.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fail(err)
	}
	keys := tier2.StaticKeySet(jose.JSONWebKey{Key: key.Public(), KeyID: "meridian-up", Algorithm: "ES256", Use: "sig"})
	p.snap, p.key = snap, key
	if p.Token, err = devToken(snap, key, f.Tenant, f.Criticality); err != nil {
		return fail(err)
	}

	// One Tier-2 per Region, gossiping over a loopback network that delays
	// cross-Region packets, and forwarding through a transport that delays
	// cross-Region requests.
	netw := faultnet.NewNetwork()
	var joins []string
	for i, r := range snap.Topology.Spec.Regions {
		for _, other := range snap.Topology.Spec.Regions {
			if other.Name != r.Name {
				netw.Delay(faultnet.Region(r.Name), faultnet.Region(other.Name), f.CrossRegionDelay)
			}
		}
		name := "tier2-" + r.Name
		gt, err := netw.Transport(name, r.Name)
		if err != nil {
			return fail(err)
		}
		addr := ""
		if len(r.Tier2) > 0 {
			addr = r.Tier2[0]
		}
		if i == 0 && f.Listen != "" {
			addr = f.Listen
		}
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		front := f.FrontDoor
		front.Tier1Key = identity // signs tenant and band for the platform's Tier-1s
		t2, err := StartTier2(ctx, Tier2Config{Source: src.forComponent(name), Region: r.Name, Name: name, Listen: addr, Metrics: "127.0.0.1:0",
			GossipBind: "127.0.0.1:0", Join: slices.Clone(joins), GossipProfile: "local", FrontDoor: front, Version: f.Version,
			Keys: keys, Transport: delayTransport(r.Name, snap, f.CrossRegionDelay), GossipTransport: gt, DrainTimeout: f.DrainTimeout,
			Tracing: f.Tracing, AccessLog: f.AccessLog}, log)
		if err != nil {
			return fail(fmt.Errorf("up: Tier-2 of %s: %w", r.Name, err))
		}
		joins = append(joins, t2.inst.Node.Addr())
		runs = append(runs, component{"tier2/" + r.Name, t2.Run})
		p.Endpoints[r.Name] = "http://" + t2.Addr()
		p.Regions = append(p.Regions, r.Name)
		p.fleets[r.Name] = t2.Fleet()
		p.Metrics = append(p.Metrics, MetricsTarget{Addr: t2.MetricsAddr(), Labels: map[string]string{"job": "meridian-tier2", "region": r.Name}})
	}
	// Stopping drains front to back: the Tier-2s stop accepting and finish
	// (or end with a shutting_down event) what they relay, while the
	// Tier-1s and pods behind them still serve; then the Tier-1s drain;
	// then the pods close.
	p.run = func(ctx context.Context) error {
		defer closePods()
		g, gctx := errgroup.WithContext(ctx)
		back, stopBack := context.WithCancel(context.WithoutCancel(gctx))
		defer stopBack()
		var fronts sync.WaitGroup
		for _, c := range runs {
			parent, front := back, strings.HasPrefix(c.name, "tier2/")
			if front {
				parent = gctx
				fronts.Add(1)
			}
			cctx, cancel := context.WithCancel(parent)
			p.mu.Lock()
			p.stops[c.name] = cancel
			p.mu.Unlock()
			g.Go(func() error {
				defer cancel()
				if front {
					defer fronts.Done()
				}
				return c.run(cctx)
			})
		}
		g.Go(func() error {
			<-gctx.Done()
			fronts.Wait()
			stopBack()
			return nil
		})
		return g.Wait()
	}
	return p, nil
}

// startPod starts the simulated pod a StaticEndpoints entry names: its GPU
// profile from the gpu label, its model and adapters from the scheduler
// whose selector picks it.
func startPod(ctx context.Context, snap *config.Snapshot, cluster, region string, ep config.StaticEndpoint, timeScale float64, tracer trace.Tracer) (*sim.LivePod, error) {
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
		Tracer:      tracer,
	}, 1)
	if err != nil {
		return nil, fmt.Errorf("up: pod %s at %s: %w", ep.Name, ep.Address, err)
	}
	return pods[0], nil
}

// errNoKey: devToken was asked only to check a token's claims.
var errNoKey = errors.New("no signing key")

// devToken signs a development token with the gateways' issuer and
// audience for tenant, claiming band (empty: Standard). A band above the
// tenant's maxBand is refused: Tier-2 would lower it. With a nil key it
// only checks (errNoKey when the claims are fine).
func devToken(snap *config.Snapshot, key *ecdsa.PrivateKey, tenant, band string) (string, error) {
	claimed, err := priority.ParseBand(band)
	if err != nil {
		return "", fmt.Errorf("--criticality: %w", err)
	}
	maxBand := priority.Standard
	if t := snap.Tenants[tenant]; t != nil {
		if maxBand, err = priority.ParseBand(t.Spec.MaxBand); err != nil {
			return "", err
		}
	}
	if claimed > maxBand {
		return "", fmt.Errorf("--criticality %s: tenant %q may claim at most %s (its Tenant's spec.maxBand): a %s token would be served as %s; pick a tenant whose maxBand is %s", claimed, tenant, maxBand, claimed, maxBand, claimed)
	}
	if key == nil {
		return "", errNoKey
	}
	claims := jwt.MapClaims{"sub": "developer", "tenant": tenant, "criticality": claimed.String(),
		"iat": time.Now().Unix(), "exp": time.Now().Add(24 * time.Hour).Unix()}
	for _, g := range snap.Gateways {
		if j := g.Spec.Auth.JWT; j != nil {
			claims["iss"] = j.Issuer
			if len(j.Audiences) > 0 {
				claims["aud"] = j.Audiences[0]
			}
			claims[j.RequiredClaims.TenantClaim()] = tenant
			claims[j.RequiredClaims.CriticalityClaim()] = claimed.String()
			break
		}
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, claims)
	tok.Header["kid"] = "meridian-up"
	return tok.SignedString(key)
}

// WriteTargets writes every metrics endpoint of the platform to path as
// a Prometheus file_sd document: one group per target, with its labels.
func (p *Platform) WriteTargets(path string) error {
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	var gs []group
	for _, t := range p.Metrics {
		gs = append(gs, group{Targets: []string{t.Addr}, Labels: t.Labels})
	}
	b, err := json.MarshalIndent(gs, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
