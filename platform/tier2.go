package platform

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
	"golang.org/x/sync/errgroup"

	"github.com/meridian-router/meridian/aws/cloudwatch"
	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/tracing"
	"github.com/meridian-router/meridian/internal/trust"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/tier2"
)

// Tier2Config is one Region's Tier-2 process (meridian tier2's flags, and
// what the local platform adds).
type Tier2Config struct {
	Source Source
	Region string // the Region this instance serves (required)
	Name   string // unique name of this instance (gossip and rate-limit peer)
	Listen string // the OpenAI front door's address
	// Metrics is the /metrics and GET /meridian/canary listener (empty: off).
	Metrics       string
	GossipBind    string   // memberlist bind address (empty: no gossip)
	Join          []string // gossip addresses of other Tier-2s
	GossipProfile string   // lan, wan or local; empty: the Topology's
	// GossipKeyFile encrypts gossip with the keyring it holds, reloaded
	// while running (tier2.InstanceConfig.GossipKeyFile).
	GossipKeyFile string
	// InsecureNoAuth admits callers without a token (development only).
	InsecureNoAuth bool
	// JWT verifies callers instead of the configuration's spec.auth.jwt
	// when its Issuer is set (--jwt-issuer, --jwks-url, …).
	JWT config.JWT
	// SubscribeAll subscribes to every cluster's health feed, not only
	// this Region's (a lone Tier-2 without gossip).
	SubscribeAll bool
	// TLSCert and TLSKey, both set, serve the front door over HTTPS.
	TLSCert, TLSKey string
	// RedirectHTTP, with TLS, is a plain-HTTP listener that answers every
	// request with a 308 to the same path over HTTPS on RedirectPort
	// (0: 443, the port a public load balancer serves), and serves no API.
	RedirectHTTP string
	RedirectPort int
	// CanaryPeriod overrides the Topology's canary analysis period (zero:
	// the Topology's).
	CanaryPeriod time.Duration
	// CloudWatch publishes per-Region aggregates to CloudWatch, in the
	// AWS Region CloudWatchRegion (empty: the SDK's default).
	CloudWatch       bool
	CloudWatchRegion string
	// IdentityKeyFile holds the key tenant and band are signed with for
	// Tier-1 (empty: FrontDoor.Tier1Key, else sent unsigned).
	IdentityKeyFile string
	FrontDoor       tier2.Config
	Version         string // meridian_build_info's version
	// DrainTimeout bounds how long a stop waits for open requests before
	// each stream still open gets a shutting_down event. Zero means 30 s.
	DrainTimeout time.Duration
	// Tracing exports spans of the front door's requests (off unless its
	// Endpoint is set); Service defaults to meridian-tier2.
	Tracing tracing.Config
	// AccessLog writes a line per inference request to the log, at info.
	AccessLog bool

	// Keys verifies callers' tokens (nil: the gateways' JWKS).
	Keys *tier2.KeySet
	// Transport carries requests to Tier-1s (nil: tier2.NewTransport).
	Transport http.RoundTripper
	// GossipTransport carries gossip (nil: memberlist's own, on GossipBind).
	GossipTransport memberlist.Transport
}

// Tier2 is a started Tier-2 process: its instance and listeners.
type Tier2 struct {
	inst *tier2.Instance
	listeners
	redirect *server // RedirectHTTP's listener, or nil
	run      func(ctx context.Context) error
}

// Fleet is the instance's view of every cluster.
func (t *Tier2) Fleet() *regions.Fleet { return t.inst.Fleet }

// Run serves until ctx ends, then drains.
func (t *Tier2) Run(ctx context.Context) error { return t.run(ctx) }

// StartTier2 binds the listeners of one Tier-2, reads its configuration
// and joins gossip; Run serves. An error leaves nothing open.
func StartTier2(ctx context.Context, f Tier2Config, log *slog.Logger) (*Tier2, error) {
	if f.Region == "" {
		return nil, usage(errors.New("--region is required"))
	}
	switch f.GossipProfile {
	case "", "lan", "wan", "local":
	default:
		return nil, usage(fmt.Errorf("--gossip-profile %q: want lan, wan or local", f.GossipProfile))
	}
	if (f.TLSCert == "") != (f.TLSKey == "") {
		return nil, usage(errors.New("--tls-cert and --tls-key go together"))
	}
	if f.RedirectHTTP != "" && f.TLSCert == "" {
		return nil, usage(errors.New("--redirect-http needs --tls-cert and --tls-key: it sends callers to HTTPS"))
	}
	jwtCfg, err := jwtFlags(f.JWT)
	if err != nil {
		return nil, usage(err)
	}
	if jwtCfg != nil && f.InsecureNoAuth {
		return nil, usage(errors.New("--insecure-no-auth and --jwt-issuer: choose one"))
	}
	if f.CanaryPeriod < 0 {
		return nil, usage(fmt.Errorf("--canary-period %s: must not be negative", f.CanaryPeriod))
	}
	reg := newRegistry(f.Version)
	root, err := f.Source.fileRoot()
	if err != nil {
		return nil, usage(err)
	}
	f.Source.check = tier2.Usable
	src, err := f.Source.open(ctx, reg, log)
	if err != nil {
		return nil, err
	}
	store, closeStore, err := f.Source.canaryStore()
	if err != nil {
		src.close()
		return nil, err
	}
	closeSrc := src.close
	src.close = func() { closeStore(); closeSrc() }
	var (
		opened []io.Closer // the listeners bound so far
		inst   *tier2.Instance
	)
	fail := func(err error) (*Tier2, error) {
		for _, c := range opened {
			c.Close()
		}
		if inst != nil { // run on an ended context, it leaves the gossip
			ended, cancel := context.WithCancel(ctx)
			cancel()
			inst.Run(ended, nil)
		}
		src.close()
		return nil, err
	}
	front := f.FrontDoor
	if f.IdentityKeyFile != "" {
		if front.Tier1Key, err = trust.ReadKey(f.IdentityKeyFile); err != nil {
			return fail(usage(err))
		}
	}
	tp, err := startTracing(ctx, f.Tracing, "meridian-tier2", map[string]string{"meridian.region": f.Region, "meridian.instance": f.Name})
	if err != nil {
		return fail(usage(err))
	}
	closeSrc2 := src.close
	src.close = func() { shutdownTracing(tp, log); closeSrc2() }
	front.Tracer = tp.Tracer("github.com/meridian-router/meridian/tier2")
	if f.AccessLog {
		front.AccessLog = log.With("log", "access", "component", "tier2")
	}
	inst, err = tier2.NewInstance(ctx, tier2.InstanceConfig{
		Region: f.Region, Name: f.Name, GossipBind: f.GossipBind, GossipJoin: f.Join, GossipProfile: f.GossipProfile, GossipKeyFile: f.GossipKeyFile,
		SubscribeAll: f.SubscribeAll, InsecureNoAuth: f.InsecureNoAuth, JWT: jwtCfg, ConfigDir: root, Keys: f.Keys,
		Transport: f.Transport, Registerer: reg, Logger: log, GossipTransport: f.GossipTransport,
		Canary: tier2.CanaryConfig{Store: store, Period: f.CanaryPeriod}, FrontDoor: front,
	}, src.Snapshot())
	if err != nil {
		return fail(err)
	}
	out := &Tier2{inst: inst}
	fs, err := listen("tier2", f.Listen, inst.Handler())
	if err != nil {
		return fail(err)
	}
	opened = append(opened, fs.ln)
	frontDoorServer(fs, inst.Router.Abort)
	fs.drainAfter = f.DrainTimeout
	out.listeners = append(out.listeners, fs)
	var redirect *server
	if f.RedirectHTTP != "" {
		if redirect, err = listen("tier2 https redirect", f.RedirectHTTP, httpsRedirect(f.RedirectPort)); err != nil {
			return fail(err)
		}
		opened = append(opened, redirect.ln)
		out.redirect = redirect
	}
	if f.Metrics != "" {
		admin := metricsMux(reg)
		admin.Handle("/meridian/", inst.AdminHandler())
		ms, err := listen("tier2 metrics", f.Metrics, admin)
		if err != nil {
			return fail(err)
		}
		opened = append(opened, ms.ln)
		out.listeners = append(out.listeners, ms)
	}
	var exporter *cloudwatch.Exporter
	if f.CloudWatch {
		c, err := cloudwatch.NewClient(ctx, cloudwatch.ClientOptions{Region: f.CloudWatchRegion})
		if err != nil {
			return fail(fmt.Errorf("tier2: --cloudwatch: %w", err))
		}
		if exporter, err = cloudwatch.New(c, cloudwatch.Config{Region: f.Region}, cloudwatch.FromGatherer(reg)); err != nil {
			return fail(fmt.Errorf("tier2: --cloudwatch: %w", err))
		}
	}
	out.run = func(ctx context.Context) error {
		defer src.close()
		updates := src.Subscribe()
		go src.run(ctx)
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error { inst.Run(gctx, updates); return nil })
		if exporter != nil {
			g.Go(func() error {
				exporter.Run(gctx, func(err error) { log.Warn("tier2: CloudWatch export failed; will retry", "error", err) })
				return nil
			})
		}
		if redirect != nil {
			g.Go(func() error { return redirect.serve(gctx, log) })
		}
		for i, s := range out.listeners {
			if i == 0 && f.TLSCert != "" {
				g.Go(func() error { return s.serveTLS(gctx, log, f.TLSCert, f.TLSKey) })
				continue
			}
			g.Go(func() error { return s.serve(gctx, log) })
		}
		log.Info("tier2 serving", "region", f.Region, "listen", fs.Addr(), "revision", src.Snapshot().Revision)
		return g.Wait()
	}
	return out, nil
}

// frontDoorServer sets up the front door's listener: tier2.NewServer's
// settings, and abort (the router's) called at a drain's deadline so that
// the streams still open get an error event before their connections
// close.
func frontDoorServer(s *server, abort func()) {
	s.srv = tier2.NewServer(s.srv.Handler)
	s.abort = abort
}

// RedirectAddr is the HTTP-to-HTTPS redirect listener's address ("" when
// off).
func (t *Tier2) RedirectAddr() string {
	if t.redirect == nil {
		return ""
	}
	return t.redirect.Addr()
}

// httpsRedirect answers every request with a 308 (method and body kept)
// to the same host and path over HTTPS on port (0: 443). It reads no
// body and serves nothing else: plain HTTP never reaches the API.
func httpsRedirect(port int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if host == "" || strings.ContainsAny(host, "/\\@ ") {
			http.Error(w, "a Host header is required", http.StatusBadRequest)
			return
		}
		if port != 0 && port != 443 {
			host = net.JoinHostPort(host, strconv.Itoa(port))
		} else if strings.Contains(host, ":") {
			host = "[" + host + "]" // an IPv6 literal
		}
		w.Header().Set("Connection", "close")
		http.Redirect(w, r, "https://"+host+r.URL.RequestURI(), http.StatusPermanentRedirect)
	})
}

// jwtFlags checks the --jwt-* flags: nil when none is set.
func jwtFlags(j config.JWT) (*config.JWT, error) {
	if reflect.ValueOf(j).IsZero() {
		return nil, nil
	}
	if j.Issuer == "" {
		return nil, errors.New("--jwks-url and the other --jwt-* flags need --jwt-issuer")
	}
	if j.JWKSURL == "" {
		return nil, errors.New("--jwt-issuer needs --jwks-url: where the issuer publishes its keys")
	}
	if u, err := url.Parse(j.JWKSURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--jwks-url %q: want an http(s) URL", j.JWKSURL)
	}
	if j.JWKSRefresh < 0 {
		return nil, fmt.Errorf("--jwks-refresh %s: must not be negative", j.JWKSRefresh.D())
	}
	return &j, nil
}
