// Package configtest starts a real etcd server in-process for tests, on
// loopback with a temporary data directory.
package configtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/cutproxy"
)

// Etcd is a running embedded etcd server and a client of it.
type Etcd struct {
	t         testing.TB
	dir       string
	clientURL url.URL // the proxy's: what clients dial
	serverURL url.URL // etcd's own client listener, behind the proxy
	peerURL   url.URL
	server    *embed.Etcd
	proxy     *cutproxy.Proxy
	// Client is connected to the server; it survives Stop/Start.
	Client *clientv3.Client
}

// Endpoint returns host:port of the client listener.
func (e *Etcd) Endpoint() string { return e.clientURL.Host }

// StartEtcd starts an etcd server and registers its shutdown with t.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	// The proxy holds the client address for e's whole life (bound
	// once, on a port the kernel picks), so a restart never races another
	// test for it.
	serverURL := url.URL{Scheme: "http", Host: freeAddr(t)}
	p, err := cutproxy.Listen(serverURL.Host)
	if err != nil {
		t.Fatalf("etcd client proxy: %v", err)
	}
	e := &Etcd{
		t:         t,
		dir:       t.TempDir(),
		clientURL: url.URL{Scheme: "http", Host: p.Addr()},
		serverURL: serverURL,
		peerURL:   url.URL{Scheme: "http", Host: freeAddr(t)},
		proxy:     p,
	}
	e.Start()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{e.Endpoint()},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	e.Client = cli
	t.Cleanup(func() {
		cli.Close()
		e.Stop()
		p.Close()
	})
	return e
}

// Start (re)starts the server on the same addresses and data directory.
// Clients reach it through a proxy on Endpoint that Stop cuts.
func (e *Etcd) Start() {
	e.t.Helper()
	cfg := embed.NewConfig()
	cfg.Name = "test"
	cfg.Dir = e.dir
	cfg.LogLevel = "error"
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.ListenClientUrls = []url.URL{e.serverURL}
	cfg.AdvertiseClientUrls = []url.URL{e.clientURL}
	cfg.ListenPeerUrls = []url.URL{e.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{e.peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true
	// A single member elects itself; short ticks make restarts quick.
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		e.t.Fatalf("start etcd: %v", err)
	}
	select {
	case <-srv.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		srv.Close()
		e.t.Fatal("etcd did not become ready within 30s")
	}
	e.server = srv
	e.proxy.Up()
}

// Stop stops the server; the client stays and reconnects after Start.
func (e *Etcd) Stop() {
	// Connections cut first: the server's close would otherwise wait its
	// request timeout (5 s) for open watch streams to end.
	e.proxy.Cut()
	if e.server != nil {
		// Stop the server first so open watch streams end at once rather
		// than holding a graceful close for its request timeout.
		e.server.Server.HardStop()
		e.server.Close()
		e.server = nil
	}
}

// Commit plans docs onto the configuration stored in e (under
// config.DefaultPrefix) and commits them, failing tb on any error. It
// returns the revision committed.
func (e *Etcd) Commit(tb testing.TB, docs []config.Document) int64 {
	tb.Helper()
	ctx := context.Background()
	store := &config.Store{Client: e.Client, Prefix: config.DefaultPrefix}
	p, err := store.PlanApply(ctx, docs, nil)
	if err != nil {
		tb.Fatal(err)
	}
	rev, err := store.Commit(ctx, p)
	if err != nil {
		tb.Fatal(err)
	}
	return rev
}

// Apply is Commit of YAML documents, read as if from the file apply.yaml.
func (e *Etcd) Apply(tb testing.TB, yaml string) int64 {
	tb.Helper()
	docs, errs := config.Decode("apply.yaml", []byte(yaml))
	if err := errs.Err(); err != nil {
		tb.Fatal(err)
	}
	return e.Commit(tb, docs)
}

// freeAddr returns a loopback address with a port free at the time of the
// call.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer l.Close()
	return fmt.Sprintf("127.0.0.1:%d", l.Addr().(*net.TCPAddr).Port)
}
