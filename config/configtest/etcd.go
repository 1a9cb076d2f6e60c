// Package configtest starts a real etcd server in-process for tests, on
// loopback with a temporary data directory.
package configtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/meridian-router/meridian/config"
)

// Etcd is a running embedded etcd server and a client of it.
type Etcd struct {
	t         testing.TB
	dir       string
	clientURL url.URL // the proxy's: what clients dial
	serverURL url.URL // etcd's own client listener, behind the proxy
	peerURL   url.URL
	server    *embed.Etcd
	proxy     *cutProxy
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
	p, err := listenProxy()
	if err != nil {
		t.Fatalf("etcd client proxy: %v", err)
	}
	e := &Etcd{
		t:         t,
		dir:       t.TempDir(),
		clientURL: url.URL{Scheme: "http", Host: p.l.Addr().String()},
		serverURL: url.URL{Scheme: "http", Host: freeAddr(t)},
		peerURL:   url.URL{Scheme: "http", Host: freeAddr(t)},
		proxy:     p,
	}
	p.to = e.serverURL.Host
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
		p.close()
	})
	return e
}

// Start (re)starts the server on the same addresses and data directory.
// Clients reach it through a proxy on Endpoint that Stop cuts (see
// cutProxy).
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
	e.proxy.up()
}

// Stop stops the server; the client stays and reconnects after Start.
func (e *Etcd) Stop() {
	// Connections cut first: the server's close would otherwise wait its
	// request timeout (5 s) for open watch streams to end.
	e.proxy.cut()
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

// cutProxy forwards every connection to its address on to etcd's client
// listener while the server is up. cut closes every connection at once,
// as a crashed server's would close, so that etcd's own close finds no
// stream left to wait for; until up, connections are closed as they
// arrive, as a down server's address would refuse them.
type cutProxy struct {
	l      net.Listener
	to     string // etcd's client listener; set before the first up
	accept sync.WaitGroup
	wg     sync.WaitGroup // forwarding goroutines (track)
	mu     sync.Mutex
	conns  map[net.Conn]bool // nil while cut
}

// listenProxy binds a loopback port for the proxy, cut until up.
func listenProxy() (*cutProxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &cutProxy{l: l}
	p.accept.Add(1)
	go func() {
		defer p.accept.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
	return p, nil
}

// track records c for cut, or closes it while the proxy is cut. With
// forwarding, it also counts a forwarding goroutine for cut to wait for:
// counted under mu while not cut, so that no count is added once cut has
// begun to wait.
func (p *cutProxy) track(c net.Conn, forwarding bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		c.Close()
		return false
	}
	p.conns[c] = true
	if forwarding {
		p.wg.Add(1)
	}
	return true
}

func (p *cutProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		if p.conns != nil {
			delete(p.conns, c)
		}
	}
}

// forward copies both ways between c and a connection to etcd until
// either side ends, then closes both.
func (p *cutProxy) forward(c net.Conn) {
	if !p.track(c, true) {
		return
	}
	defer p.wg.Done()
	s, err := net.Dial("tcp", p.to)
	if err != nil {
		p.untrack(c)
		return
	}
	if !p.track(s, false) {
		p.untrack(c)
		return
	}
	done := make(chan struct{}, 2)
	go func() { io.Copy(s, c); done <- struct{}{} }()
	go func() { io.Copy(c, s); done <- struct{}{} }()
	<-done
	p.untrack(c, s)
	<-done
}

// up forwards connections from now on.
func (p *cutProxy) up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		p.conns = map[net.Conn]bool{}
	}
}

// cut closes every connection, waits for the copies to end, and closes
// new connections until up.
func (p *cutProxy) cut() {
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// close stops accepting and cuts.
func (p *cutProxy) close() {
	p.l.Close()
	p.accept.Wait()
	p.cut()
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
