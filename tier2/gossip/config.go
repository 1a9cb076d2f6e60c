package gossip

import (
	"bytes"
	"fmt"
	"log/slog"
	"time"

	"github.com/hashicorp/memberlist"
)

// Profiles name memberlist's timing presets. Every node of one cluster
// should use the same profile: memberlist has one set of timers for the
// whole membership, Regions included.
//
// For Tier-2 instances spread over Regions, run "lan" with ProbeTimeout
// above twice the worst cross-Region round trip: measured with 30 nodes in
// three Regions 80 ms apart, a digest reached all of them in 0.55 s
// (median) with lan and 1.05 s with wan, whose 500 ms gossip interval
// misses the 1 s goal. Use wan only where round trips approach a second.
const (
	// ProfileLAN is memberlist's DefaultLANConfig: 200 ms gossip, 1 s probes
	// with 500 ms timeouts, 30 s push/pull. The default.
	ProfileLAN = "lan"
	// ProfileWAN is DefaultWANConfig: 500 ms gossip to 4 nodes, 5 s probes
	// with 3 s timeouts, 60 s push/pull. Tolerates very long round trips at
	// the cost of slower spreading and failure detection.
	ProfileWAN = "wan"
	// ProfileLocal is DefaultLocalConfig: 100 ms gossip, 200 ms probe
	// timeouts. For loopback and tests.
	ProfileLocal = "local"
)

// Channel ids in use across Meridian. One byte each; a Node carries up to
// 256 channels. Listed here so two subsystems never pick the same id.
const (
	// ChannelRegions carries pool-health digests (regions.DigestStore).
	ChannelRegions byte = 1
	// ChannelRateLimit carries per-instance demand for global rate limits.
	ChannelRateLimit byte = 2
	// ChannelTest is free for tests.
	ChannelTest byte = 255
)

// Config configures one gossip Node. The zero value of every field but Name
// has a usable meaning, given next to the field.
type Config struct {
	// Name identifies this node in the cluster; it must be unique among the
	// members (a restarted instance may reuse its name). Required.
	Name string

	// Region is the failure domain this node runs in (for example
	// "us-east-1"). It travels in memberlist's node metadata, so every
	// member learns every other member's Region without extra messages, and
	// it keys cross-Region round-trip times. Empty means unknown. At most
	// MaxRegionLen bytes.
	Region string

	// BindAddr and BindPort are where this node listens for gossip (UDP)
	// and state sync (TCP) on the same port. Empty BindAddr means 0.0.0.0;
	// zero BindPort picks a free port (read it back with Node.Addr).
	// Ignored when Transport is set: the transport has already bound.
	BindAddr string
	BindPort int

	// AdvertiseAddr and AdvertisePort are the address other members use to
	// reach this node, when it differs from the bind address (NAT, a
	// wildcard bind). Empty/zero mean "derive from the bind address".
	AdvertiseAddr string
	AdvertisePort int

	// Join lists host:port addresses of existing members to contact at
	// start. Reaching any one of them is enough; reaching none is an error
	// unless the list is empty (the first node of a new cluster).
	Join []string

	// Profile picks memberlist's timing preset: ProfileLAN, ProfileWAN or
	// ProfileLocal. Empty means ProfileLAN.
	Profile string

	// GossipInterval is how often this node sends queued broadcasts to
	// GossipNodes random members. Shorter spreads news faster and costs
	// more packets: a broadcast reaches n members in about
	// log(n)/log(GossipNodes+1) intervals. Zero means the profile's
	// (100 ms local, 200 ms LAN, 500 ms WAN).
	GossipInterval time.Duration

	// GossipNodes is how many random members each gossip round goes to.
	// Zero means the profile's (3, or 4 for WAN).
	GossipNodes int

	// PushPullInterval is how often this node exchanges full state (every
	// channel's LocalState) with one random member over TCP. It repairs
	// what gossip lost: partitions, drops, members that joined late.
	// memberlist stretches it for clusters above 32 members. Zero means the
	// profile's (15 s local, 30 s LAN, 60 s WAN).
	PushPullInterval time.Duration

	// ProbeInterval and ProbeTimeout drive failure detection and the RTT
	// measurements behind Node.RTT: each interval one member is pinged and
	// the round trip recorded. Zero means the profile's (1 s and 200 ms
	// local, 1 s and 500 ms LAN, 5 s and 3 s WAN).
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration

	// StreamTimeout bounds a TCP exchange (a join or a push/pull) with one
	// member. Longer tolerates slow links and loaded hosts; shorter frees a
	// stuck exchange sooner. Zero means the profile's (1 s local, 10 s LAN,
	// 30 s WAN).
	StreamTimeout time.Duration

	// RetransmitMult bounds how many members each node sends one channel
	// broadcast to: RetransmitMult × ⌈log10(members+1)⌉. Every member that
	// receives it does the same, so with m members a given member misses a
	// broadcast with probability about exp(−2·RetransmitMult·⌈log10(m+1)⌉)
	// (push/pull repairs it later). Higher costs bandwidth. Zero means 6:
	// with 30 members a miss anywhere in the cluster is about 1 in 10,000
	// broadcasts, where memberlist's local-profile default of 2 misses one
	// node in roughly a third of them. Membership messages use the larger
	// of this and the profile's.
	RetransmitMult int

	// ReconnectInterval is how often a member that departed is asked to
	// rejoin, so that two sides of a healed partition find each other again
	// after memberlist has given up gossiping to the dead. memberlist does
	// not tell a failure from a graceful leave, so members that left are
	// retried too (their dial fails). Zero means 10 s; negative disables.
	ReconnectInterval time.Duration

	// ReconnectTimeout is how long a departed member keeps being retried
	// before it is forgotten: the longest partition that still heals by
	// itself. Zero means 1 h.
	ReconnectTimeout time.Duration

	// MaxQueuedBroadcasts bounds the broadcasts waiting to be sent; when
	// exceeded, the ones already sent most often are dropped first (push/pull
	// still carries their effect). Zero means 4096.
	MaxQueuedBroadcasts int

	// SecretKey encrypts and authenticates all gossip with AES-GCM; 16, 24
	// or 32 bytes. Nil means plaintext: use it only on a trusted network.
	SecretKey []byte

	// Keys, when set, replace SecretKey with a keyring: the first key
	// encrypts what this node sends, every key is tried on what it
	// receives, so keys can be rotated without a split (Node.SetKeys).
	// Each is 16, 24 or 32 bytes.
	Keys [][]byte

	// Channels are registered before the node joins, so the first state
	// sync with the join target already carries them. Register adds more
	// later.
	Channels map[byte]Channel

	// Transport replaces memberlist's UDP/TCP transport, for fault
	// injection in tests (see package faultnet). Nil means a
	// memberlist.NetTransport on BindAddr:BindPort.
	Transport memberlist.Transport

	// Logger receives memberlist's log lines at their own levels. Nil
	// discards them.
	Logger *slog.Logger
}

// MaxRegionLen bounds Config.Region; the Region rides in memberlist's node
// metadata, which is capped at 512 bytes.
const MaxRegionLen = 255

func (c *Config) validate() error {
	if c.Name == "" {
		return fmt.Errorf("gossip: config: name is required")
	}
	if len(c.Region) > MaxRegionLen {
		return fmt.Errorf("gossip: config: region %.20q…: %d bytes, at most %d", c.Region, len(c.Region), MaxRegionLen)
	}
	switch c.Profile {
	case "", ProfileLAN, ProfileWAN, ProfileLocal:
	default:
		return fmt.Errorf("gossip: config: profile %q: want %q, %q or %q", c.Profile, ProfileLAN, ProfileWAN, ProfileLocal)
	}
	switch len(c.SecretKey) {
	case 0, 16, 24, 32:
	default:
		return fmt.Errorf("gossip: config: secret key is %d bytes, want 16, 24 or 32", len(c.SecretKey))
	}
	if len(c.SecretKey) > 0 && len(c.Keys) > 0 {
		return fmt.Errorf("gossip: config: secret key and keys: set one")
	}
	if err := checkKeys(c.Keys); err != nil {
		return fmt.Errorf("gossip: config: %w", err)
	}
	if c.BindPort < 0 || c.BindPort > 65535 || c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return fmt.Errorf("gossip: config: port out of range")
	}
	for id, ch := range c.Channels {
		if ch == nil {
			return fmt.Errorf("gossip: config: channel %d is nil", id)
		}
	}
	return nil
}

// memberlistConfig derives memberlist's configuration from c.
func (c *Config) memberlistConfig() *memberlist.Config {
	var mc *memberlist.Config
	switch c.Profile {
	case ProfileWAN:
		mc = memberlist.DefaultWANConfig()
	case ProfileLocal:
		mc = memberlist.DefaultLocalConfig()
	default:
		mc = memberlist.DefaultLANConfig()
	}
	mc.Name = c.Name
	if c.BindAddr != "" {
		mc.BindAddr = c.BindAddr
	}
	mc.BindPort = c.BindPort
	mc.AdvertiseAddr = c.AdvertiseAddr
	mc.AdvertisePort = c.AdvertisePort
	if c.Transport != nil {
		mc.Transport = c.Transport
	}
	override(&mc.GossipInterval, c.GossipInterval)
	override(&mc.GossipNodes, c.GossipNodes)
	override(&mc.PushPullInterval, c.PushPullInterval)
	override(&mc.ProbeInterval, c.ProbeInterval)
	override(&mc.TCPTimeout, c.StreamTimeout)
	override(&mc.ProbeTimeout, c.ProbeTimeout)
	// Membership messages spread like channel broadcasts and miss nodes
	// just as often; the profiles' 2–4 leaves a 30-node cluster waiting
	// for push/pull to learn of some joins.
	mc.RetransmitMult = max(mc.RetransmitMult, c.retransmitMult())
	if len(c.SecretKey) > 0 {
		mc.SecretKey = c.SecretKey
	}
	if len(c.Keys) > 0 {
		// validate checked the keys: NewKeyring cannot fail on them.
		mc.Keyring, _ = memberlist.NewKeyring(c.Keys[1:], c.Keys[0])
	}
	mc.LogOutput = nil
	mc.Logger = newLogBridge(c.Logger)
	return mc
}

// override sets *dst to v when v is positive; zero (or less) keeps the
// profile's value.
func override[T int | time.Duration](dst *T, v T) {
	if v > 0 {
		*dst = v
	}
}

func (c *Config) reconnectInterval() time.Duration {
	if c.ReconnectInterval == 0 {
		return 10 * time.Second
	}
	return c.ReconnectInterval
}

func (c *Config) reconnectTimeout() time.Duration {
	if c.ReconnectTimeout <= 0 {
		return time.Hour
	}
	return c.ReconnectTimeout
}

func (c *Config) retransmitMult() int {
	if c.RetransmitMult <= 0 {
		return 6
	}
	return c.RetransmitMult
}

func (c *Config) maxQueued() int {
	if c.MaxQueuedBroadcasts <= 0 {
		return 4096
	}
	return c.MaxQueuedBroadcasts
}

// checkKeys refuses a keyring memberlist could not use: a key of the wrong
// size, or the same key twice.
func checkKeys(keys [][]byte) error {
	for i, k := range keys {
		switch len(k) {
		case 16, 24, 32:
		default:
			return fmt.Errorf("key %d is %d bytes, want 16, 24 or 32", i+1, len(k))
		}
		for j := range i {
			if bytes.Equal(keys[j], k) {
				return fmt.Errorf("key %d repeats key %d", i+1, j+1)
			}
		}
	}
	return nil
}
