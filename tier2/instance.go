package tier2

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	tier1v1 "github.com/meridian-router/meridian/api/tier1/v1"
	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/loop"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/ratelimit"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/tier2/gossip"
)

// InstanceConfig configures one Tier-2 process.
type InstanceConfig struct {
	// Region this instance serves; Name identifies it among Tier-2s
	// (gossip member name, rate-limit instance).
	Region, Name string
	// Gossip: the memberlist bind address (host:port; empty: no gossip,
	// a single instance) and addresses to join. The timings come from the
	// Topology's spec.gossip, read once here (memberlist cannot change
	// them live); GossipProfile, when set, overrides its profile
	// ("lan", "wan", "local"; neither set: "wan").
	GossipBind    string
	GossipJoin    []string
	GossipProfile string
	// GossipTransport, when set, replaces memberlist's network transport
	// (fault injection, the local platform's cross-Region delay).
	GossipTransport gossipTransport
	// GossipKeyFile, when set, encrypts gossip with the keyring in this
	// file (gossip.ReadKeyFile's format), read at start and again every
	// GossipKeyPoll (zero: 10 s) so that keys rotate without a restart.
	// An unreadable or invalid file at start is an error; later, the keys
	// in use stay and the error is logged and counted.
	GossipKeyFile string
	GossipKeyPoll time.Duration
	// SubscribeAll subscribes to every cluster's pool-health feed, not
	// only this Region's: for a lone Tier-2 without gossip peers.
	SubscribeAll bool
	// InsecureNoAuth admits callers without a token (development only).
	InsecureNoAuth bool
	// JWT, when set, verifies callers instead of the gateways'
	// spec.auth.jwt (meridian tier2 --jwt-issuer and friends: the
	// operator's identity provider, set where the process is deployed).
	JWT *config.JWT
	// Transport to Tier-1s; nil means NewTransport().
	Transport http.RoundTripper
	// ConfigDir resolves a gateway's relative jwksFile. Empty: the
	// directory of the file that declared it, when it is a file.
	ConfigDir string
	// Keys, when set, replaces the JWKS of the configuration (tests, the
	// local platform's development key).
	Keys       *KeySet
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Canary configures the canary analysis (tier2/canary.go); its
	// Instance, Region, Registerer and Logger are filled in from above.
	Canary CanaryConfig
	// Now is the instance's clock for digest freshness and cluster state
	// (regions.Config.Now). Nil means time.Now; tests set a skewed one.
	Now func() time.Time
	// FrontDoor sets the router's identity and timeout settings:
	// DefaultTenant, Tier1Key, ExposeUpstream, the timeouts and
	// MaxHeaders, Tracer and AccessLog (see Config; zero fields take its
	// defaults). Its other fields are ignored.
	FrontDoor Config
}

// Instance is a running Tier-2: the router and its background work.
type Instance struct {
	cfg     InstanceConfig
	log     *slog.Logger
	Router  *Router
	Fleet   *regions.Fleet
	Limiter *ratelimit.Limiter
	Node    *gossip.Node
	Canary  *Canary
	adm     *Admission
	metrics *Metrics

	gossipKeyMu sync.Mutex
	gossipKeys  [][]byte // the keyring in use (GossipKeyFile)

	// The running JWT settings, replaced by apply when they change.
	authMu   sync.Mutex
	keys     *KeySet
	jwt      *config.JWT
	jwtDir   string
	keysCtx  context.Context // Run's; nil before Run
	stopKeys context.CancelFunc

	mu   sync.Mutex
	subs map[string]context.CancelFunc // cluster → health subscription

	ejections map[string]uint64 // last seen ejection count per cluster (housekeeping only)
	drift     drift             // the latest drift report (housekeeping writes, GET /meridian/drift reads)

	// gossip is the spec.gossip this instance's Node runs (with the
	// GossipProfile override); apply reports a configuration that differs.
	gossip config.Gossip
}

// gossipConfig is the memberlist timing of spec.gossip g (nil: none set),
// with profile, when not empty, overriding g's; neither: wan.
func gossipConfig(g *config.Gossip, profile string) gossip.Config {
	t := gossipTimings(g, profile)
	return gossip.Config{Profile: t.Profile, GossipInterval: t.GossipInterval.D(), GossipNodes: t.GossipNodes,
		PushPullInterval: t.PushPullInterval.D(), ProbeInterval: t.ProbeInterval.D(), ProbeTimeout: t.ProbeTimeout.D(),
		StreamTimeout: t.StreamTimeout.D()}
}

// describeGossip lists timings for a log line (0s: the profile's).
func describeGossip(g config.Gossip) string {
	return fmt.Sprintf("profile=%s gossipInterval=%s gossipNodes=%d pushPullInterval=%s probeInterval=%s probeTimeout=%s streamTimeout=%s",
		g.Profile, g.GossipInterval.D(), g.GossipNodes, g.PushPullInterval.D(), g.ProbeInterval.D(), g.ProbeTimeout.D(), g.StreamTimeout.D())
}

// gossipTimings is spec.gossip as it applies: defaults and the override
// filled in.
func gossipTimings(g *config.Gossip, profile string) config.Gossip {
	var t config.Gossip
	if g != nil {
		t = *g
	}
	if profile != "" {
		t.Profile = profile
	}
	if t.Profile == "" {
		t.Profile = gossip.ProfileWAN
	}
	return t
}

// Usable reports whether Tier-2 can run a valid configuration; a source
// given it as its Check never publishes (nor keeps as last-known-good) one
// Tier-2 would refuse.
func Usable(s *config.Snapshot) error {
	if s.Topology == nil {
		return errors.New("tier2: the configuration has no Topology: Tier-2 needs the Regions and clusters")
	}
	return nil
}

// NewInstance assembles a Tier-2 from the first configuration.
func NewInstance(ctx context.Context, cfg InstanceConfig, snap *config.Snapshot) (*Instance, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := Usable(snap); err != nil {
		return nil, err
	}
	in := &Instance{cfg: cfg, log: cfg.Logger, subs: map[string]context.CancelFunc{}, ejections: map[string]uint64{}}
	in.metrics = NewMetrics(cfg.Registerer)
	fleet, err := regions.NewFleet(in.fleetConfig(snap))
	if err != nil {
		return nil, err
	}
	in.Fleet = fleet
	rlcfg := ratelimit.DefaultConfig(cfg.Name)
	rlcfg.Registerer = cfg.Registerer
	if cfg.GossipBind != "" {
		host, port, err := net.SplitHostPort(cfg.GossipBind)
		if err != nil {
			return nil, fmt.Errorf("tier2: --gossip-bind: %w", err)
		}
		p, _ := strconv.Atoi(port)
		gc := gossipConfig(snap.Topology.Spec.Gossip, cfg.GossipProfile)
		gc.Name, gc.Region, gc.BindAddr, gc.BindPort = cfg.Name, cfg.Region, host, p
		gc.Join, gc.Logger, gc.Transport = cfg.GossipJoin, cfg.Logger, cfg.GossipTransport
		if cfg.GossipKeyFile != "" {
			if gc.Keys, err = gossip.ReadKeyFile(cfg.GossipKeyFile); err != nil {
				return nil, fmt.Errorf("tier2: --gossip-key-file: %w", err)
			}
			in.gossipKeys = gc.Keys
			in.metrics.gossipKeys.Set(float64(len(gc.Keys)))
		}
		node, err := gossip.New(gc)
		if err != nil {
			return nil, err
		}
		in.Node = node
		in.gossip = gossipTimings(snap.Topology.Spec.Gossip, cfg.GossipProfile)
		cfg.Logger.Info("tier2: gossip timings (read at start; a change needs a restart; 0: the profile's)", "profile", gc.Profile,
			"gossipInterval", gc.GossipInterval, "gossipNodes", gc.GossipNodes, "pushPullInterval", gc.PushPullInterval,
			"probeInterval", gc.ProbeInterval, "probeTimeout", gc.ProbeTimeout, "streamTimeout", gc.StreamTimeout)
		rlcfg.MaxPayload = node.MaxPayload("rl/" + cfg.Name + "/000")
	}
	if in.Limiter, err = ratelimit.New(rlcfg); err != nil {
		return nil, err
	}
	if node := in.Node; node != nil {
		node.Register(gossip.ChannelRegions, fleet.Digests())
		node.Register(gossip.ChannelRateLimit, in.Limiter)
		fleet.Digests().SetPublish(func(key string, p []byte) error {
			return node.BroadcastLatest(gossip.ChannelRegions, key, p)
		})
	}
	pending, err := in.authenticator(ctx, snap)
	if err != nil {
		return nil, err
	}
	auth := in.commitAuth(pending)
	pm, err := priority.NewMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	in.adm = &Admission{Region: cfg.Region, Fleet: fleet, Metrics: pm}
	in.adm.Configure(routingAdmission(snap))
	fd := cfg.FrontDoor
	in.Router, err = NewRouter(Config{
		Region: cfg.Region, Fleet: fleet, Auth: auth, InsecureNoAuth: cfg.InsecureNoAuth,
		Limiter: in.Limiter, Priority: in.adm, Transport: cfg.Transport, Logger: cfg.Logger, Metrics: in.metrics,
		DefaultTenant: fd.DefaultTenant, Tier1Key: fd.Tier1Key, ExposeUpstream: fd.ExposeUpstream,
		BodyReadTimeout: fd.BodyReadTimeout, UpstreamHeaderTimeout: fd.UpstreamHeaderTimeout,
		UpstreamResponseTimeout: fd.UpstreamResponseTimeout, StreamIdleTimeout: fd.StreamIdleTimeout, MaxHeaders: fd.MaxHeaders,
		Tracer: fd.Tracer, AccessLog: fd.AccessLog,
	}, snap)
	if err != nil {
		return nil, err
	}
	in.adm.Tenants = func() *priority.Tenants { return in.Router.snap.Load().tenants }
	cc := cfg.Canary
	cc.Instance, cc.Region, cc.Registerer, cc.Logger = cfg.Name, cfg.Region, cfg.Registerer, cfg.Logger
	if in.Canary, err = NewCanary(cc, in.Router); err != nil {
		return nil, err
	}
	return in, nil
}

// routingAdmission is the Topology's spec.routing.admission, or nil.
func routingAdmission(s *config.Snapshot) *config.Admission {
	if s.Topology == nil || s.Topology.Spec.Routing == nil {
		return nil
	}
	return s.Topology.Spec.Routing.Admission
}

// gossipTransport is memberlist's transport.
type gossipTransport = memberlist.Transport

func (in *Instance) fleetConfig(snap *config.Snapshot) regions.Config {
	c := regions.Config{
		LocalRegion: in.cfg.Region,
		Clusters:    regions.ClustersFromTopology(snap.Topology),
		Now:         in.cfg.Now,
	}
	if r := snap.Topology.Spec.Routing; r != nil {
		if w := r.Weights; w != nil {
			c.Weights = regions.Weights{KVHeadroom: w.KVHeadroom, QueueDepth: w.QueueDepth,
				RegionProximity: w.RegionProximity, ErrorRate: w.ErrorRate, PrefixAffinity: w.PrefixAffinity}
		}
		c.LoadFactor = r.LoadFactor
		for _, rtt := range r.RTTs {
			c.RTTs = append(c.RTTs, regions.RegionRTT{A: rtt.A, B: rtt.B, RTT: rtt.RTT.D()})
		}
		c.DigestMaxAge = r.DigestMaxAge.D()
		if rb := r.RetryBudget; rb != nil {
			c.Retry = regions.RetryConfig{Ratio: rb.Ratio, Window: rb.Window.D(), MinRetries: rb.MinRetries}
		}
		if o := r.OutlierDetection; o != nil {
			c.Outlier = regions.OutlierConfig{ConsecutiveFailures: o.ConsecutiveFailures, FailureRate: o.FailureRate,
				MinRequests: o.MinRequests, Interval: o.Interval.D(), BaseEjection: o.BaseEjection.D(), MaxEjection: o.MaxEjection.D(),
				EjectionMemory: o.EjectionMemory.D(), ReadmitShare: o.ReadmitShare, ReadmitStep: o.ReadmitStep.D()}
		}
	}
	return c
}

// pendingAuth is JWT verification built from a configuration and not
// yet installed (commitAuth).
type pendingAuth struct {
	auth *Authenticator
	keys *KeySet
	jwt  *config.JWT
	dir  string
}

// authenticator builds JWT verification from the gateways of this Region
// (the first that configures it), or returns nil when snap's settings
// are the running ones. A new JWKS source gets a new key set (loaded
// now: an unreadable one is an error that keeps the running settings).
func (in *Instance) authenticator(ctx context.Context, snap *config.Snapshot) (*pendingAuth, error) {
	if in.cfg.InsecureNoAuth {
		return nil, nil
	}
	jwtCfg, dir, err := in.jwtConfig(snap)
	if err != nil {
		return nil, err
	}
	in.authMu.Lock()
	defer in.authMu.Unlock()
	if in.jwt != nil && reflect.DeepEqual(*in.jwt, *jwtCfg) && in.jwtDir == dir {
		return nil, nil
	}
	keys := in.cfg.Keys
	sameSource := in.jwt != nil && in.jwt.JWKSFile == jwtCfg.JWKSFile && in.jwt.JWKSURL == jwtCfg.JWKSURL && in.jwtDir == dir
	switch {
	case keys != nil:
	case sameSource:
		keys = in.keys
	default:
		ks, err := NewKeySet(ctx, *jwtCfg, dir)
		if err != nil {
			return nil, err
		}
		ks.Logger = in.log
		keys = ks
	}
	skew := jwtCfg.ClockSkew.D()
	if skew == 0 {
		skew = 30 * time.Second
	}
	return &pendingAuth{auth: NewAuthenticator(*jwtCfg, keys, skew, nil), keys: keys, jwt: jwtCfg, dir: dir}, nil
}

// commitAuth makes p the running JWT settings (nil p: no change) and
// returns its authenticator.
func (in *Instance) commitAuth(p *pendingAuth) *Authenticator {
	if p == nil {
		return nil
	}
	in.authMu.Lock()
	defer in.authMu.Unlock()
	restart := p.keys != in.keys || in.jwt == nil || in.jwt.JWKSRefresh != p.jwt.JWKSRefresh
	in.jwt, in.jwtDir = p.jwt, p.dir // before runKeysLocked, which reads the refresh interval
	if restart {
		if in.stopKeys != nil {
			in.stopKeys()
			in.stopKeys = nil
		}
		in.keys = p.keys
		if in.keysCtx != nil {
			in.runKeysLocked()
		}
	}
	return p.auth
}

// runKeysLocked refreshes the current key set in the background until
// the next one replaces it or Run ends.
func (in *Instance) runKeysLocked() {
	ctx, cancel := context.WithCancel(in.keysCtx)
	in.stopKeys = cancel
	ks := in.keys
	interval := in.jwt.JWKSRefresh.D()
	go ks.Run(ctx, interval)
}

// jwtConfig finds this Region's spec.auth.jwt and the directory its
// relative jwksFile is resolved against.
func (in *Instance) jwtConfig(snap *config.Snapshot) (*config.JWT, string, error) {
	if in.cfg.JWT != nil {
		return in.cfg.JWT, in.cfg.ConfigDir, nil
	}
	var jwtCfg *config.JWT
	var origin string
	for _, g := range snap.Gateways {
		if g.Spec.Auth.JWT != nil && (jwtCfg == nil || g.Spec.Region == in.cfg.Region) {
			jwtCfg, origin = g.Spec.Auth.JWT, snap.Objects[config.ObjectKey{Kind: config.KindGateway, Name: g.Metadata.Name}].Origin
			if g.Spec.Region == in.cfg.Region {
				break
			}
		}
	}
	if jwtCfg == nil {
		return nil, "", fmt.Errorf("tier2: no gateway configures spec.auth.jwt; configure it, pass --jwt-issuer and --jwks-url, or pass --insecure-no-auth")
	}
	dir := in.cfg.ConfigDir
	if dir == "" && origin != "" {
		dir = filepath.Dir(origin)
	}
	return jwtCfg, dir, nil
}

// Handler is the front door.
func (in *Instance) Handler() http.Handler { return in.Router.Handler() }

// AdminHandler serves GET /meridian/canary (the latest canary analyses,
// for `meridian canary status --tier2`): rollout names and error rates
// are for operators, so it belongs on the metrics listener, not the
// front door.
func (in *Instance) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /meridian/canary", in.Canary)
	mux.HandleFunc("GET /meridian/drift", in.serveDrift)
	return mux
}

// Run does the instance's background work until ctx ends: configuration
// updates, pool-health subscriptions, rate-limit exchange, admission
// refresh, proximity and metrics. On return it has left the gossip.
func (in *Instance) Run(ctx context.Context, updates <-chan *config.Snapshot) {
	var wg sync.WaitGroup
	goRun := func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }
	in.subscribe(ctx, in.Router.snap.Load().snap)
	goRun(func() { in.adm.Run(ctx, 0) })
	in.authMu.Lock()
	in.keysCtx = ctx
	if in.keys != nil {
		in.runKeysLocked()
	}
	in.authMu.Unlock()
	// The Limiter syncs with or without gossip: a lone Tier-2 (no
	// --gossip-bind) leaves its warm-up share (InitialShare, 5% of every
	// limit) only at a sync, after Warmup with no peer heard. Run publishes
	// the leaving tombstone itself when ctx ends.
	goRun(func() {
		in.Limiter.Run(ctx, func(key string, p []byte) {
			if in.Node != nil {
				in.Node.BroadcastLatest(gossip.ChannelRateLimit, "rl/"+in.cfg.Name+"/"+key, p)
			}
		})
	})
	goRun(func() { in.housekeeping(ctx) })
	if in.Node != nil && in.cfg.GossipKeyFile != "" {
		goRun(func() { in.watchGossipKeys(ctx) })
	}
	goRun(func() { in.Canary.Run(ctx) })
	if updates != nil {
		goRun(func() {
			loop.Each(ctx, updates, func(s *config.Snapshot) { in.apply(ctx, s) })
		})
	}
	<-ctx.Done()
	in.mu.Lock()
	for _, cancel := range in.subs {
		cancel()
	}
	in.mu.Unlock()
	wg.Wait()
	if in.Node != nil {
		in.Node.Leave(time.Second)
		in.Node.Close()
	}
}

func (in *Instance) apply(ctx context.Context, s *config.Snapshot) {
	if err := Usable(s); err != nil {
		in.log.Error("tier2: configuration not applied", "revision", s.Revision, "error", err)
		return
	}
	pending, err := in.authenticator(ctx, s)
	if err != nil {
		in.log.Error("tier2: configuration not applied: spec.auth.jwt", "revision", s.Revision, "error", err)
		return
	}
	if err := in.Fleet.Update(in.fleetConfig(s)); err != nil {
		in.log.Error("tier2: configuration not applied", "revision", s.Revision, "error", err)
		return
	}
	if err := in.Router.Apply(s); err != nil {
		in.log.Error("tier2: configuration not applied", "revision", s.Revision, "error", err)
		return
	}
	in.adm.Configure(routingAdmission(s))
	if auth := in.commitAuth(pending); auth != nil {
		in.Router.SetAuth(auth)
		in.log.Info("tier2: authentication settings replaced", "revision", s.Revision)
	}
	in.subscribe(ctx, s)
	if in.Node != nil {
		if want := gossipTimings(s.Topology.Spec.Gossip, in.cfg.GossipProfile); want != in.gossip {
			in.log.Warn("tier2: spec.gossip changed; memberlist timings are read at start, so this instance keeps its own until restarted",
				"revision", s.Revision, "running", describeGossip(in.gossip), "configured", describeGossip(want))
		}
	}
	in.log.Info("tier2: configuration applied", "revision", s.Revision)
}

// subscribe keeps one pool-health subscription per cluster to follow.
func (in *Instance) subscribe(ctx context.Context, s *config.Snapshot) {
	in.mu.Lock()
	defer in.mu.Unlock()
	want := map[string]string{}
	for _, r := range s.Topology.Spec.Regions {
		if r.Name != in.cfg.Region && !in.cfg.SubscribeAll {
			continue
		}
		for _, c := range r.Clusters {
			if c.Health != "" {
				want[r.Name+"/"+c.Name+"@"+c.Health] = c.Health
			}
		}
	}
	for k, cancel := range in.subs {
		if _, ok := want[k]; !ok {
			cancel()
			delete(in.subs, k)
		}
	}
	for k, addr := range want {
		if _, ok := in.subs[k]; ok {
			continue
		}
		sctx, cancel := context.WithCancel(ctx)
		in.subs[k] = cancel
		go in.watchHealth(sctx, addr)
	}
}

// watchHealth follows one Tier-1's pool-health feed, reconnecting with
// jittered backoff, and stores (and gossips) every digest.
func (in *Instance) watchHealth(ctx context.Context, addr string) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := in.watchOnce(ctx, addr)
		if ctx.Err() != nil {
			return
		}
		in.log.Debug("tier2: pool-health stream ended; reconnecting", "addr", addr, "error", err)
		d := backoff/2 + time.Duration(rand.Int64N(int64(backoff)))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (in *Instance) watchOnce(ctx context.Context, addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := tier1v1.NewPoolHealthClient(conn).Watch(ctx, &tier1v1.WatchRequest{Subscriber: in.cfg.Name})
	if err != nil {
		return err
	}
	for {
		cd, err := stream.Recv()
		if err != nil {
			return err
		}
		for _, p := range cd.GetPools() {
			if _, err := in.Fleet.Digests().Put(FromProto(cd, p)); err != nil {
				in.log.Warn("tier2: invalid pool-health digest ignored", "cluster", cd.GetCluster(), "pool", p.GetPool(), "error", err)
			}
		}
	}
}

// FromProto converts one pool of a Tier-1 digest message.
func FromProto(cd *tier1v1.ClusterDigest, p *tier1v1.PoolDigest) regions.Digest {
	return regions.Digest{
		Region: cd.GetRegion(), Cluster: cd.GetCluster(), Pool: p.GetPool(), Model: p.GetModel(),
		Adapters: p.GetAdapters(), ReadyPods: int(p.GetReadyPods()), TotalPods: int(p.GetTotalPods()),
		QueueTotal: int(p.GetQueueTotal()), QueueMax: int(p.GetQueueMax()), QueueMin: int(p.GetQueueMin()),
		KVMean: p.GetKvMean(), KVMax: p.GetKvMax(), Running: int(p.GetRunning()), InFlight: int(p.GetInFlight()),
		TTFTP50:     time.Duration(p.GetTtftP50Seconds() * float64(time.Second)),
		TTFTP99:     time.Duration(p.GetTtftP99Seconds() * float64(time.Second)),
		ErrorRate:   p.GetErrorRate(),
		HotAdapters: p.GetHotAdapters(), Headroom: p.GetHeadroom(), PrefixHitRatio: p.GetPrefixHitRatio(),
		Version: p.GetVersion(), Produced: time.Unix(0, p.GetProducedUnixNano()),
		Saturation: p.GetSaturation(), FreshPods: int(p.GetFreshPods()), StalePods: int(p.GetStalePods()),
		GateWaiting: int(p.GetGateWaiting()), AdmitRate: p.GetAdmitRate(), GateMaxQueued: int(p.GetGateMaxQueued()),
		Definition: p.GetDefinition(), ServedAdapters: p.GetServedAdapters(), MaxModelLen: int(p.GetMaxModelLen()),
		ServedModels: p.GetServedModels(),
	}
}

// housekeeping sweeps stale digests, feeds measured round trips to the
// fleet and refreshes gauges, every half second until ctx ends.
func (in *Instance) housekeeping(ctx context.Context) {
	loop.Every(ctx, 500*time.Millisecond, in.housekeep)
}

// housekeep is one round of housekeeping.
func (in *Instance) housekeep() {
	in.Fleet.Digests().Sweep()
	now := time.Now()
	in.metrics.digestAge.Reset()
	for _, d := range in.Fleet.Digests().Digests() {
		in.metrics.digestAge.WithLabelValues(d.Region, d.Cluster, d.Pool).Set(now.Sub(d.Produced).Seconds())
	}
	in.observeDrift(now)
	for _, st := range in.Fleet.Status() {
		v := 0.0
		if st.Ejected {
			v = 1
		}
		in.metrics.ejected.WithLabelValues(st.Cluster).Set(v)
		if prev := in.ejections[st.Cluster]; st.Ejections > prev {
			in.metrics.ejections.WithLabelValues(st.Cluster).Add(float64(st.Ejections - prev))
		}
		in.ejections[st.Cluster] = st.Ejections
	}
	if in.Node == nil {
		return
	}
	in.metrics.members.Reset()
	byRegion := map[string][]time.Duration{}
	for _, m := range in.Node.Members() {
		in.metrics.members.WithLabelValues(m.Region).Inc()
		if m.Name == in.Node.Name() {
			continue
		}
		if rtt, ok := in.Node.RTT(m.Name); ok {
			byRegion[m.Region] = append(byRegion[m.Region], rtt)
		}
	}
	for region, rtts := range byRegion {
		best := rtts[0]
		for _, r := range rtts[1:] {
			best = min(best, r)
		}
		in.Fleet.ObserveRTT(region, best)
	}
}

// watchGossipKeys reloads GossipKeyFile every GossipKeyPoll until ctx
// ends.
func (in *Instance) watchGossipKeys(ctx context.Context) {
	every := in.cfg.GossipKeyPoll
	if every <= 0 {
		every = 10 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			in.ReloadGossipKeys()
		}
	}
}

// ReloadGossipKeys reads GossipKeyFile and installs its keys when they
// differ from those in use (a Kubernetes Secret mounted as a file changes
// in place). A bad file keeps the keys in use; the error is logged and
// counted in meridian_tier2_gossip_key_errors_total.
func (in *Instance) ReloadGossipKeys() error {
	in.gossipKeyMu.Lock()
	defer in.gossipKeyMu.Unlock()
	keys, err := gossip.ReadKeyFile(in.cfg.GossipKeyFile)
	if err == nil && slices.EqualFunc(keys, in.gossipKeys, bytes.Equal) {
		return nil
	}
	if err == nil {
		err = in.Node.SetKeys(keys)
	}
	if err != nil {
		in.metrics.gossipKeyErrors.Inc()
		in.log.Error("tier2: gossip keys not changed", "file", in.cfg.GossipKeyFile, "error", err)
		return err
	}
	in.gossipKeys = keys
	in.metrics.gossipKeys.Set(float64(len(keys)))
	in.log.Info("tier2: gossip keys changed", "file", in.cfg.GossipKeyFile, "keys", len(keys))
	return nil
}
