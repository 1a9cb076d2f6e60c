// Package gossip is Tier-2's membership: one hashicorp/memberlist cluster of
// every Tier-2 instance in every Region, shared by several subsystems, each
// on its own one-byte Channel (pool-health digests, rate-limit demand).
//
// It decides who the members are, which Region each runs in, how far away
// each is (round-trip times measured by memberlist's probes), and it
// carries two kinds of traffic for the channels: broadcasts, spread by
// gossip in well under a second, and full state, exchanged pairwise by
// memberlist's periodic push/pull so that whatever gossip lost (a
// partition, dropped packets, a late joiner) is repaired. It does not
// interpret payloads: a Channel merges what it receives by its own rules
// (versions, timestamps), and must tolerate duplicates, reordering and
// loss.
//
// memberlist does not forward user broadcasts beyond the nodes it sends them
// to; a Node therefore re-queues every broadcast the first time it sees it
// (deduplicated by origin and sequence number), which makes a broadcast
// epidemic: it reaches n members in about log(n) gossip rounds.
package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Channel is one subsystem's share of the gossip.
type Channel interface {
	// LocalState returns this node's full state for a push/pull exchange
	// with one peer. It is called from memberlist goroutines and must not
	// block. The result is not modified by the Node.
	LocalState() []byte

	// Merge applies a peer's full state (from push/pull) or one broadcast
	// payload. from names the member that produced it (not the relay that
	// passed it on). It is called from memberlist goroutines, possibly
	// concurrently, and must not block. payload is never modified after the
	// call; Merge may keep it but must not modify it.
	Merge(from string, payload []byte)
}

// MemberObserver may be implemented by a Channel that keeps per-member
// state or counts members. Its methods are called from one memberlist
// goroutine, never concurrently with each other, and must not block:
// MemberJoined when a member (this node included) is first seen alive or
// comes back, MemberLeft when one leaves gracefully or is declared dead.
type MemberObserver interface {
	MemberJoined(m Member)
	MemberLeft(name string)
}

// Member is one live (or suspected) member of the cluster.
type Member struct {
	Name   string
	Region string
	Addr   string // host:port of its gossip listener
	// RTT is the smoothed round trip measured by this node's probes; zero
	// when not measured yet (and for the local node).
	RTT time.Duration
}

// Errors returned by Node methods.
var (
	ErrClosed   = errors.New("gossip: node is closed")
	ErrTooLarge = errors.New("gossip: broadcast does not fit in one gossip packet")
)

// Node is this process's membership in the gossip cluster.
type Node struct {
	cfg        Config
	ml         *memberlist.Memberlist
	mlReady    atomic.Pointer[memberlist.Memberlist] // ml, for memberlist's own goroutines
	queue      *memberlist.TransmitLimitedQueue
	maxMessage int
	keyring    *memberlist.Keyring // Config.Keys' keyring, or nil

	regMu    sync.Mutex
	channels atomic.Pointer[[256]Channel]

	seq  atomic.Uint64
	seen dedupe

	latestMu sync.Mutex
	latest   map[string]uint64 // keyed broadcast name → newest seq queued

	rttMu sync.Mutex
	rtt   map[string]time.Duration
	// members are copies of memberlist's live and suspected nodes, taken
	// in its join/update/leave callbacks (which run under its lock):
	// the *memberlist.Node values Memberlist.Members returns are its own,
	// rewritten by its packet handler while we would read them.
	members map[string]Member // guarded by rttMu

	failMu sync.Mutex
	failed map[string]failedMember

	dropped atomic.Uint64

	closed    atomic.Bool
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

type failedMember struct {
	addr  string
	since time.Time
}

// New starts a node and joins the members listed in cfg.Join. It fails if
// none of them can be reached (a non-empty Join list means a cluster is
// expected to exist).
func New(cfg Config) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n := &Node{
		cfg:     cfg,
		latest:  make(map[string]uint64),
		rtt:     make(map[string]time.Duration),
		members: make(map[string]Member),
		failed:  make(map[string]failedMember),
		stop:    make(chan struct{}),
	}
	n.seen.init(16384)
	// Sequence numbers start at the wall clock so that a restarted node
	// reusing its name never repeats a (name, seq) pair peers still hold.
	n.seq.Store(uint64(time.Now().UnixNano()))
	var chans [256]Channel
	for id, ch := range cfg.Channels {
		chans[id] = ch
	}
	n.channels.Store(&chans)

	mc := cfg.memberlistConfig()
	d := &delegate{n}
	mc.Delegate, mc.Events, mc.Ping = d, d, d
	// memberlist may ask for broadcasts as soon as Create starts its
	// timers, before n.ml is set: count one member until then.
	n.queue = &memberlist.TransmitLimitedQueue{RetransmitMult: cfg.retransmitMult(), NumNodes: func() int {
		if ml := n.mlReady.Load(); ml != nil {
			return ml.NumMembers()
		}
		return 1
	}}
	n.maxMessage = mc.UDPBufferSize - 5 // compound header and user-message overheads
	if len(cfg.SecretKey) > 0 || len(cfg.Keys) > 0 {
		n.maxMessage -= 45 // worst-case AES-GCM overhead (version, IV, padding, tag)
	}

	n.keyring = mc.Keyring
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("gossip: start %s: %w", cfg.Name, err)
	}
	n.ml = ml
	n.mlReady.Store(ml)
	if len(cfg.Join) > 0 {
		if _, err := ml.Join(cfg.Join); err != nil {
			_ = ml.Shutdown()
			return nil, fmt.Errorf("gossip: %s: join %v: %w", cfg.Name, cfg.Join, err)
		}
	}
	if iv := cfg.reconnectInterval(); iv > 0 {
		n.wg.Add(1)
		go n.reconnectLoop(iv)
	}
	return n, nil
}

// Register attaches ch to channel id, replacing any channel there. It may be
// called before traffic starts (Config.Channels) or at any time after New;
// a channel registered late receives broadcasts from then on and peers'
// full state at the next push/pull. Messages for an id with no channel are
// dropped and counted (Dropped).
func (n *Node) Register(id byte, ch Channel) {
	n.regMu.Lock()
	defer n.regMu.Unlock()
	next := *n.channels.Load()
	next[id] = ch
	n.channels.Store(&next)
}

// Broadcast sends payload to every member on channel id. Every receiver
// passes it on once, so it spreads epidemically; it is not delivered to the
// sending node's own channel. Delivery is best effort: a member may miss it
// (push/pull repairs that) or see it twice. The payload must fit in one
// packet (MaxPayload); larger state belongs in LocalState.
func (n *Node) Broadcast(id byte, payload []byte) error {
	return n.broadcast(id, false, "", payload)
}

// BroadcastLatest is Broadcast for state where only the newest value per
// key matters (one pool's digest, one instance's demand): a newer payload
// for the same (sender, channel, key) replaces an older one still waiting to
// be sent, here and at every relay, and a relay discards an older one that
// arrives after a newer.
func (n *Node) BroadcastLatest(id byte, key string, payload []byte) error {
	return n.broadcast(id, true, key, payload)
}

// MaxPayload returns the largest payload Broadcast (key "") or
// BroadcastLatest(key) accepts on this node.
func (n *Node) MaxPayload(key string) int {
	m := broadcastMsg{keyed: key != "", origin: n.cfg.Name, seq: ^uint64(0), key: key}
	return n.maxMessage - len(appendBroadcast(nil, &m))
}

func (n *Node) broadcast(id byte, keyed bool, key string, payload []byte) error {
	if n.closed.Load() {
		return ErrClosed
	}
	if max := n.MaxPayload(key); len(payload) > max {
		return fmt.Errorf("gossip: broadcast on channel %d: payload of %d bytes, at most %d: %w", id, len(payload), max, ErrTooLarge)
	}
	m := broadcastMsg{channel: id, keyed: keyed, origin: n.cfg.Name, seq: n.seq.Add(1), key: key, payload: payload}
	msg := appendBroadcast(make([]byte, 0, 16+len(n.cfg.Name)+len(key)+len(payload)), &m)
	n.seen.add(m.origin, m.seq) // our own message may come back from a relay
	n.enqueue(msg, &m)
	return nil
}

// enqueue queues msg for gossip, unless it is a keyed broadcast older than
// one already queued for the same key. It reports whether msg was queued.
func (n *Node) enqueue(msg []byte, m *broadcastMsg) bool {
	if !m.keyed {
		n.queue.QueueBroadcast(&uniqueBroadcast{msg})
	} else {
		name := m.origin + "\x00" + strconv.Itoa(int(m.channel)) + "\x00" + m.key
		n.latestMu.Lock()
		if last, ok := n.latest[name]; ok && last >= m.seq {
			n.latestMu.Unlock()
			return false
		}
		n.latest[name] = m.seq
		n.latestMu.Unlock()
		n.queue.QueueBroadcast(&namedBroadcast{msg, name})
	}
	if n.queue.NumQueued() > n.cfg.maxQueued() {
		n.queue.Prune(n.cfg.maxQueued())
	}
	return true
}

// Members returns the live and suspected members, this node included.
func (n *Node) Members() []Member {
	n.rttMu.Lock()
	defer n.rttMu.Unlock()
	out := make([]Member, 0, len(n.members))
	for name, m := range n.members {
		m.RTT = n.rtt[name]
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// noteMember records a member as memberlist reports it (from its
// callbacks, under its lock).
func (n *Node) noteMember(nd *memberlist.Node) Member {
	region, _ := decodeMeta(nd.Meta) // a malformed region reads as unknown
	m := Member{Name: nd.Name, Region: region, Addr: nd.Address()}
	n.rttMu.Lock()
	n.members[nd.Name] = m
	n.rttMu.Unlock()
	return m
}

// NumMembers returns how many members are alive, this node included.
func (n *Node) NumMembers() int { return n.ml.NumMembers() }

// RTT returns the smoothed round trip to the named member, as measured by
// memberlist's probes (one member per ProbeInterval, so each peer is
// re-measured about every members × ProbeInterval). ok is false until the
// first measurement.
func (n *Node) RTT(name string) (rtt time.Duration, ok bool) {
	n.rttMu.Lock()
	defer n.rttMu.Unlock()
	rtt, ok = n.rtt[name]
	return rtt, ok
}

// Name returns this node's name.
func (n *Node) Name() string { return n.cfg.Name }

// Region returns this node's Region.
func (n *Node) Region() string { return n.cfg.Region }

// SetKeys replaces the gossip keyring of a node started with
// Config.Keys: keys[0] encrypts from now on, every key decrypts. To rotate
// without a split, give every node the new key second, then first, then
// drop the old one, letting each step reach every node before the next.
func (n *Node) SetKeys(keys [][]byte) error {
	if len(keys) == 0 {
		return errors.New("gossip: set keys: no keys (gossip cannot go back to plaintext while running)")
	}
	if err := checkKeys(keys); err != nil {
		return fmt.Errorf("gossip: set keys: %w", err)
	}
	kr := n.keyring
	if kr == nil {
		return errors.New("gossip: set keys: the node was started without a keyring (Config.Keys)")
	}
	for _, k := range keys {
		if err := kr.AddKey(k); err != nil {
			return fmt.Errorf("gossip: set keys: %w", err)
		}
	}
	if err := kr.UseKey(keys[0]); err != nil {
		return fmt.Errorf("gossip: set keys: %w", err)
	}
	for _, old := range kr.GetKeys() {
		if !slices.ContainsFunc(keys, func(k []byte) bool { return bytes.Equal(k, old) }) {
			if err := kr.RemoveKey(old); err != nil {
				return fmt.Errorf("gossip: set keys: %w", err)
			}
		}
	}
	return nil
}

// Addr returns the host:port other members reach this node at.
func (n *Node) Addr() string { return n.ml.LocalNode().Address() }

// Queued returns how many broadcasts are waiting to be sent (or re-sent).
func (n *Node) Queued() int { return n.queue.NumQueued() }

// Dropped counts messages discarded as malformed or addressed to a channel
// with nothing registered.
func (n *Node) Dropped() uint64 { return n.dropped.Load() }

// Leave announces a graceful departure and waits up to timeout for it to
// spread. Peers then forget this node at once instead of suspecting it.
// Call Close afterwards.
func (n *Node) Leave(timeout time.Duration) error {
	if err := n.ml.Leave(timeout); err != nil {
		return fmt.Errorf("gossip: %s: leave: %w", n.cfg.Name, err)
	}
	return nil
}

// Close stops the node without announcing it (peers will detect the
// failure); call Leave first for a graceful exit. It is safe to call more
// than once.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.closed.Store(true)
		close(n.stop)
		n.wg.Wait()
		if err := n.ml.Shutdown(); err != nil {
			n.closeErr = fmt.Errorf("gossip: %s: shutdown: %w", n.cfg.Name, err)
		}
	})
	return n.closeErr
}

// reconnectLoop asks departed members to rejoin. memberlist gossips to dead
// members only for GossipToTheDeadTime; after a longer partition the two
// sides would otherwise never merge again.
func (n *Node) reconnectLoop(every time.Duration) {
	defer n.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		var addrs []string
		now := time.Now()
		n.failMu.Lock()
		for name, f := range n.failed {
			if now.Sub(f.since) > n.cfg.reconnectTimeout() {
				delete(n.failed, name)
				continue
			}
			addrs = append(addrs, f.addr)
		}
		n.failMu.Unlock()
		// A few at a time: an unreachable address costs a full dial
		// timeout, and one slow address must not hold up the rest.
		sem := make(chan struct{}, 4)
		var wg sync.WaitGroup
		for _, a := range addrs {
			select {
			case <-n.stop:
				wg.Wait()
				return
			case sem <- struct{}{}:
			}
			wg.Go(func() {
				defer func() { <-sem }()
				_, _ = n.ml.Join([]string{a}) // failure is the expected case while partitioned
			})
		}
		wg.Wait()
	}
}

// deliver hands a payload to its channel.
func (n *Node) deliver(id byte, from string, payload []byte) {
	ch := n.channels.Load()[id]
	if ch == nil {
		n.dropped.Add(1)
		return
	}
	ch.Merge(from, payload)
}

// delegate implements memberlist's Delegate, EventDelegate and
// PingDelegate without exporting those methods on Node.
type delegate struct{ n *Node }

func (d *delegate) NodeMeta(limit int) []byte {
	return encodeMeta(d.n.cfg.Region) // validated to fit: MaxRegionLen + 3 < 512
}

func (d *delegate) NotifyMsg(buf []byte) {
	n := d.n
	if len(buf) == 0 || buf[0] != kindBroadcast {
		n.dropped.Add(1)
		return
	}
	own := bytes.Clone(buf) // memberlist reuses buf after we return
	m, err := decodeBroadcast(own)
	if err != nil {
		n.dropped.Add(1)
		return
	}
	if m.origin == n.cfg.Name || !n.seen.add(m.origin, m.seq) {
		return
	}
	if !n.enqueue(own, &m) {
		return // a newer payload for this key was already seen
	}
	n.deliver(m.channel, m.origin, m.payload)
}

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.n.queue.GetBroadcasts(overhead, limit)
}

func (d *delegate) LocalState(join bool) []byte {
	chans := d.n.channels.Load()
	var entries []stateEntry
	for id, ch := range chans {
		if ch != nil {
			entries = append(entries, stateEntry{byte(id), ch.LocalState()})
		}
	}
	return appendState(nil, d.n.cfg.Name, entries)
}

func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	origin, entries, err := decodeState(buf)
	if err != nil {
		d.n.dropped.Add(1)
		return
	}
	if origin == d.n.cfg.Name {
		return
	}
	for _, e := range entries {
		d.n.deliver(e.channel, origin, e.state)
	}
}

func (d *delegate) NotifyJoin(nd *memberlist.Node) {
	d.n.failMu.Lock()
	delete(d.n.failed, nd.Name)
	d.n.failMu.Unlock()
	m := d.n.noteMember(nd)
	for _, ch := range d.n.channels.Load() {
		if o, ok := ch.(MemberObserver); ok {
			o.MemberJoined(m)
		}
	}
}

func (d *delegate) NotifyLeave(nd *memberlist.Node) {
	n := d.n
	n.rttMu.Lock()
	delete(n.rtt, nd.Name)
	delete(n.members, nd.Name)
	n.rttMu.Unlock()
	// memberlist does not say whether the member failed or left
	// gracefully (Node.State is not maintained), so both are retried; a
	// member that really left refuses the connection.
	n.failMu.Lock()
	n.failed[nd.Name] = failedMember{addr: nd.Address(), since: time.Now()}
	n.failMu.Unlock()
	prefix := nd.Name + "\x00"
	n.latestMu.Lock()
	for k := range n.latest {
		if len(k) > len(prefix) && k[:len(prefix)] == prefix {
			delete(n.latest, k)
		}
	}
	n.latestMu.Unlock()
	for _, ch := range n.channels.Load() {
		if o, ok := ch.(MemberObserver); ok {
			o.MemberLeft(nd.Name)
		}
	}
}

func (d *delegate) NotifyUpdate(nd *memberlist.Node) { d.n.noteMember(nd) }

func (d *delegate) AckPayload() []byte { return nil }

// NotifyPingComplete smooths probe round trips like TCP's SRTT (gain 1/4,
// quicker than TCP's 1/8 because each peer is probed rarely).
func (d *delegate) NotifyPingComplete(other *memberlist.Node, rtt time.Duration, _ []byte) {
	n := d.n
	n.rttMu.Lock()
	if old, ok := n.rtt[other.Name]; ok {
		rtt = old + (rtt-old)/4
	}
	n.rtt[other.Name] = rtt
	n.rttMu.Unlock()
}

type uniqueBroadcast struct{ msg []byte }

func (b *uniqueBroadcast) Invalidates(memberlist.Broadcast) bool { return false }
func (b *uniqueBroadcast) Message() []byte                       { return b.msg }
func (b *uniqueBroadcast) Finished()                             {}
func (b *uniqueBroadcast) UniqueBroadcast()                      {}

type namedBroadcast struct {
	msg  []byte
	name string
}

func (b *namedBroadcast) Invalidates(o memberlist.Broadcast) bool {
	nb, ok := o.(memberlist.NamedBroadcast)
	return ok && nb.Name() == b.name
}
func (b *namedBroadcast) Message() []byte { return b.msg }
func (b *namedBroadcast) Finished()       {}
func (b *namedBroadcast) Name() string    { return b.name }

// dedupe remembers the last capacity broadcast ids seen.
type dedupe struct {
	mu   sync.Mutex
	set  map[msgID]struct{}
	ring []msgID
	next int
}

type msgID struct {
	origin string
	seq    uint64
}

func (d *dedupe) init(capacity int) {
	d.set = make(map[msgID]struct{}, capacity)
	d.ring = make([]msgID, 0, capacity)
}

// add records id and reports whether it was new.
func (d *dedupe) add(origin string, seq uint64) bool {
	id := msgID{origin, seq}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.set[id]; ok {
		return false
	}
	if len(d.ring) < cap(d.ring) {
		d.ring = append(d.ring, id)
	} else {
		delete(d.set, d.ring[d.next])
		d.ring[d.next] = id
		d.next = (d.next + 1) % len(d.ring)
	}
	d.set[id] = struct{}{}
	return true
}
