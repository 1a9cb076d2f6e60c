// Package peers lets the Tier-1 replicas of one cluster route as one:
// each replica streams what it dispatched (prefix events: this endpoint
// was sent a prompt with these prefix blocks) to every other replica over
// the Replicas.Exchange gRPC stream, and applies what the others send to
// its own prefix index. Without it every replica learns only its own
// share of the traffic, and at N replicas prefix affinity degrades toward
// round-robin (GIE's picker runs active-passive for that reason). Each
// replica also streams its load on each endpoint (in-flight count and
// prefill backlog, PublishInFlight), so that the others' load estimates
// and latency predictions count what every replica has queued there.
//
// It decides nothing about routing. Sending never blocks the request
// path: Publish puts the event on a bounded queue per peer and counts a
// drop when the queue is full; a sender per peer batches whatever is
// queued into one message and reconnects with jittered backoff. Events
// are idempotent and their order does not matter (tier1.PrefixIndex), so
// a lost or repeated event costs at most one less-informed decision.
//
// Each replica dials every address in its peer list and sends only its
// own events on the streams it opened; streams peers open to it only
// carry theirs in. So every replica must list all the others. The list
// may include the replica itself (the same list on every replica, e.g. a
// headless Service's addresses): messages naming this replica are ignored.
package peers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	expbackoff "github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	tier1v1 "github.com/meridian-router/meridian/api/tier1/v1"
	"github.com/meridian-router/meridian/internal/loop"
	"github.com/meridian-router/meridian/internal/redial"
	"github.com/meridian-router/meridian/tier1"
)

// Config configures an Exchange. Zero fields take the defaults in their
// comments.
type Config struct {
	// Replica names this replica in the messages it sends. Required: a
	// peer list that includes this replica relies on it to ignore its
	// own events.
	Replica string
	// Peers are the host:port addresses of the other replicas' Replicas
	// service.
	Peers []string
	// QueueSize is how many events wait per peer while its sender is
	// busy or disconnected. Zero means 8192: at 2 KB per event (256
	// blocks) at most 16 MB per peer, and about a second of a busy
	// replica's dispatches. When full, new events for that peer are
	// dropped and counted: the request path never waits.
	QueueSize int
	// BatchSize is the most events one message carries. Zero means 256.
	// The sender does not wait to fill a batch: it sends whatever is
	// queued, so batches grow only when the stream is the bottleneck.
	BatchSize int
	// MinBackoff and MaxBackoff bound the wait before reconnecting to a
	// peer, doubled per failure with ±50% jitter. Zero means 100 ms and
	// 5 s.
	MinBackoff, MaxBackoff time.Duration
	// DialOptions for the peers; nil means plaintext
	// (insecure.NewCredentials): replicas of one cluster usually talk
	// over the pod network. Set transport credentials for mTLS. gRPC's
	// connection backoff is set from MinBackoff and MaxBackoff unless
	// these options set it.
	DialOptions []grpc.DialOption
	// Registerer receives the exchange's metrics; nil means none.
	Registerer prometheus.Registerer
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Applier applies another replica's prefix event to a pool's index
// (gateway.Gateway does). It is called from gRPC stream goroutines and
// must be safe for concurrent use; it reports false when the pool or
// endpoint is unknown here.
type Applier interface {
	ApplyPrefixEvent(pool string, ev tier1.PrefixEvent) bool
}

// InFlightApplier is an Applier that also takes other replicas' loads
// (in-flight count and prefill backlog; gateway.Gateway does):
// ApplyPeerInFlight records a replica's load on an endpoint of a pool,
// ForgetPeer drops a replica's loads when its stream ends. Same goroutines
// and rules as Applier.
type InFlightApplier interface {
	Applier
	ApplyPeerInFlight(pool, replica, endpoint string, load tier1.PeerLoad) bool
	ForgetPeer(replica string)
}

// Exchange sends this replica's prefix events to its peers and applies
// theirs. Build it with New, hand Publish to gateway.Config.OnDispatch,
// Register it on the replica's gRPC server and Start it.
type Exchange struct {
	cfg     Config
	log     *slog.Logger
	peers   []*peer
	into    atomic.Pointer[applierBox]
	metrics *metrics

	received, applied, unknown atomic.Int64
	inFlight                   atomic.Int64 // in-flight loads applied

	tier1v1.UnimplementedReplicasServer
}

type applierBox struct{ Applier }

// peer is one outgoing stream's state.
type peer struct {
	addr      string
	queue     chan item
	sent      atomic.Int64
	dropped   atomic.Int64
	connected atomic.Bool
}

// item is one queued event: a prefix event, or (inFlight set) this
// replica's load on ev.Endpoint.
type item struct {
	pool     string
	ev       tier1.PrefixEvent
	inFlight bool
	load     tier1.PeerLoad
}

// New validates cfg and returns an Exchange that is not yet running.
func New(cfg Config) (*Exchange, error) {
	if cfg.Replica == "" {
		return nil, errors.New("peers: Config.Replica is empty: name this replica (e.g. its pod name)")
	}
	if cfg.QueueSize < 0 || cfg.BatchSize < 0 || cfg.MinBackoff < 0 || cfg.MaxBackoff < 0 {
		return nil, fmt.Errorf("peers: negative QueueSize, BatchSize or backoff in %+v", cfg)
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = 8192
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 256
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.MinBackoff)
	cfg.DialOptions = redial.Options(cfg.MinBackoff, cfg.MaxBackoff, cfg.DialOptions)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	x := &Exchange{cfg: cfg, log: cfg.Logger, metrics: newMetrics(cfg.Registerer)}
	seen := map[string]bool{}
	for _, a := range cfg.Peers {
		if a == "" || seen[a] {
			continue
		}
		seen[a] = true
		x.peers = append(x.peers, &peer{addr: a, queue: make(chan item, cfg.QueueSize)})
	}
	return x, nil
}

// Publish queues a prefix event for every peer. It never blocks; an event
// a peer's full queue cannot take is dropped and counted. It has the
// signature of gateway.Config.OnDispatch and takes ownership of
// ev.Hashes, which it only reads.
func (x *Exchange) Publish(pool string, ev tier1.PrefixEvent) {
	x.enqueue(item{pool: pool, ev: ev})
}

// enqueue queues it for every peer whose queue has room, and counts it
// dropped for the others.
func (x *Exchange) enqueue(it item) {
	for _, p := range x.peers {
		select {
		case p.queue <- it:
		default:
			p.dropped.Add(1)
			x.metrics.events.WithLabelValues(p.addr, "dropped").Inc()
		}
	}
}

// PublishInFlight queues this replica's load on an endpoint (in-flight
// count and prefill backlog) for every peer, like Publish. It has the
// signature of gateway.Config.OnInFlight. Loads are absolute, so a dropped
// one is corrected by the next.
func (x *Exchange) PublishInFlight(pool, endpoint string, load tier1.PeerLoad) {
	x.enqueue(item{pool: pool, ev: tier1.PrefixEvent{Endpoint: endpoint}, inFlight: true, load: load})
}

// Register adds the Replicas service to g.
func (x *Exchange) Register(g grpc.ServiceRegistrar) { tier1v1.RegisterReplicasServer(g, x) }

// Start applies received events to into from now on, and streams this
// replica's events to every peer until ctx ends. The returned channel is
// closed when every sender has stopped. Events received before Start are
// counted as unknown and dropped, so start it before serving the gRPC
// server it is registered on. Start it once.
func (x *Exchange) Start(ctx context.Context, into Applier) <-chan struct{} {
	x.into.Store(&applierBox{into})
	var wg sync.WaitGroup
	for _, p := range x.peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x.runPeer(ctx, p)
		}()
	}
	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	return stopped
}

// runPeer keeps one stream to a peer open, reconnecting with backoff.
func (x *Exchange) runPeer(ctx context.Context, p *peer) {
	conn, err := grpc.NewClient(p.addr, x.cfg.DialOptions...)
	if err != nil {
		// Only a malformed target fails here; retrying will not help.
		x.log.Error("tier1: peer address unusable; not exchanging with it", "peer", p.addr, "error", err)
		return
	}
	defer conn.Close()
	client := tier1v1.NewReplicasClient(conn)
	// Jittered ([d/2, 3d/2]) exponential backoff.
	retry := &expbackoff.ExponentialBackOff{InitialInterval: x.cfg.MinBackoff, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: x.cfg.MaxBackoff}
	for ctx.Err() == nil {
		opened, err := x.stream(ctx, client, p)
		if ctx.Err() != nil {
			return
		}
		if opened {
			retry.Reset() // the peer was up: start over
		}
		x.log.Debug("tier1: peer stream ended; reconnecting", "peer", p.addr, "error", err)
		if !loop.Sleep(ctx, retry.NextBackOff()) {
			return
		}
	}
}

// stream sends queued events on one stream until it fails or ctx ends.
// It reports whether the stream opened.
func (x *Exchange) stream(ctx context.Context, client tier1v1.ReplicasClient, p *peer) (bool, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := client.Exchange(sctx)
	if err != nil {
		return false, fmt.Errorf("peers: opening a stream to %s: %w", p.addr, err)
	}
	p.connected.Store(true)
	x.metrics.connected.WithLabelValues(p.addr).Set(1)
	defer func() {
		p.connected.Store(false)
		x.metrics.connected.WithLabelValues(p.addr).Set(0)
	}()
	// The peer sends nothing back on this stream; Recv only learns that
	// the stream ended.
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	msg := &tier1v1.PeerEvents{Replica: x.cfg.Replica}
	var store []*tier1v1.PrefixEvent // reused across messages: Send marshals before it returns
	for {
		var it item
		select {
		case <-ctx.Done():
			st.CloseSend()
			return true, nil
		case err := <-ended:
			return true, fmt.Errorf("peers: stream to %s: %w", p.addr, err)
		case it = <-p.queue:
		}
		msg.Prefix, msg.InFlight = msg.Prefix[:0], msg.InFlight[:0]
		for {
			if it.inFlight {
				msg.InFlight = append(msg.InFlight, &tier1v1.InFlight{Pool: it.pool, Endpoint: it.ev.Endpoint,
					Count: it.load.InFlight, PrefillBacklogTokens: it.load.Backlog})
			} else {
				n := len(msg.Prefix)
				if n == len(store) {
					store = append(store, &tier1v1.PrefixEvent{})
				}
				e := store[n]
				e.Pool, e.Endpoint, e.Hashes, e.Stamp = it.pool, it.ev.Endpoint, it.ev.Hashes, it.ev.Stamp
				msg.Prefix = append(msg.Prefix, e)
			}
			if len(msg.Prefix)+len(msg.InFlight) == x.cfg.BatchSize {
				break
			}
			var more bool
			select {
			case it = <-p.queue:
				more = true
			default:
			}
			if !more {
				break
			}
		}
		evs := len(msg.Prefix) + len(msg.InFlight)
		if err := st.Send(msg); err != nil {
			// The events in msg are lost; the next stream starts with
			// what is queued now.
			p.dropped.Add(int64(evs))
			x.metrics.events.WithLabelValues(p.addr, "dropped").Add(float64(evs))
			if errors.Is(err, io.EOF) {
				err = <-ended // the real reason
			}
			return true, fmt.Errorf("peers: sending to %s: %w", p.addr, err)
		}
		p.sent.Add(int64(evs))
		x.metrics.events.WithLabelValues(p.addr, "sent").Add(float64(evs))
	}
}

// Exchange is the server side of a peer's stream: it applies the peer's
// events. It sends nothing back.
func (x *Exchange) Exchange(st grpc.BidiStreamingServer[tier1v1.PeerEvents, tier1v1.PeerEvents]) error {
	var replica string // the peer's name, once it sent something
	defer func() {
		// Its requests no longer count here: the replica stopped, or it
		// reconnects and reports its counts again.
		if box := x.into.Load(); box != nil && replica != "" {
			if fa, ok := box.Applier.(InFlightApplier); ok {
				fa.ForgetPeer(replica)
			}
		}
	}()
	for {
		m, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || st.Context().Err() != nil {
				return nil
			}
			return err
		}
		if m.GetReplica() == x.cfg.Replica {
			continue // our own, through a peer list that includes us
		}
		box := x.into.Load()
		var applied, unknown int64
		for _, pe := range m.GetPrefix() {
			ev := tier1.PrefixEvent{Endpoint: pe.GetEndpoint(), Stamp: pe.GetStamp(), Hashes: pe.GetHashes()}
			if box != nil && box.ApplyPrefixEvent(pe.GetPool(), ev) {
				applied++
			} else {
				unknown++
			}
		}
		if len(m.GetInFlight()) > 0 {
			replica = m.GetReplica()
			var fa InFlightApplier
			if box != nil {
				fa, _ = box.Applier.(InFlightApplier)
			}
			for _, f := range m.GetInFlight() {
				// A replica that predates the backlog sends none (0),
				// which adds nothing: it is treated as before.
				load := tier1.PeerLoad{InFlight: f.GetCount(), Backlog: f.GetPrefillBacklogTokens()}
				if fa != nil && fa.ApplyPeerInFlight(f.GetPool(), replica, f.GetEndpoint(), load) {
					x.inFlight.Add(1)
				}
			}
		}
		x.received.Add(applied + unknown)
		x.applied.Add(applied)
		x.unknown.Add(unknown)
		x.metrics.received.WithLabelValues("applied").Add(float64(applied))
		x.metrics.received.WithLabelValues("unknown").Add(float64(unknown))
	}
}

// Stats counts the exchange's events so far.
type Stats struct {
	// Sent and Dropped are summed over peers: events delivered to a
	// stream, and events lost to a full queue or a broken stream.
	Sent, Dropped int64
	// Received events from peers, of which Applied to an index and
	// Unknown (pool or endpoint not known here, or received before Start).
	Received, Applied, Unknown int64
	// Connected counts peers with an open stream.
	Connected int
	// InFlight counts other replicas' loads (in-flight count and
	// backlog) applied (not included in Received). Sent and Dropped
	// include them.
	InFlight int64
}

// Stats returns the counts so far.
func (x *Exchange) Stats() Stats {
	s := Stats{Received: x.received.Load(), Applied: x.applied.Load(), Unknown: x.unknown.Load(), InFlight: x.inFlight.Load()}
	for _, p := range x.peers {
		s.Sent += p.sent.Load()
		s.Dropped += p.dropped.Load()
		if p.connected.Load() {
			s.Connected++
		}
	}
	return s
}

type metrics struct {
	events    *prometheus.CounterVec
	received  *prometheus.CounterVec
	connected *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier1_peer_events_total",
			Help: "Prefix events for a peer replica, by result: sent, or dropped (queue full or stream broken)."}, []string{"peer", "result"}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier1_peer_events_received_total",
			Help: "Prefix events received from peer replicas, by result: applied, or unknown (pool or endpoint not known here)."}, []string{"result"}),
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_tier1_peer_connected",
			Help: "1 while the stream to a peer replica is open."}, []string{"peer"}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.received, m.connected)
	}
	return m
}
