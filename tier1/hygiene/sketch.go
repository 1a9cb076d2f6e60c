// Package hygiene tells each tenant where its prompts break the prefix
// cache, and what that costs.
//
// Prefix caching matches from a prompt's first token, so one changed byte
// near the top (a timestamp or request id in the system prompt, tool
// schemas whose keys a library reorders) makes everything after it
// uncacheable even though most of the prompt is the same as the tenant's
// last one. For each tenant and model, a Sketch compares every prompt with
// the tenant's few most recent ones and decides whether it diverged early:
// whether it shares a long stretch of content with an earlier prompt yet
// stops matching it near the top. It estimates the prefill tokens lost
// (shared content after the divergence, which a cache could have served
// had the changing part come last), keeps the typical block offset of the
// divergence over a sliding window and, when asked to, a short sample of
// the bytes where the prompt changes.
//
// It keeps a fixed-size sketch per tenant and model (block fingerprints at
// fixed offsets, windowed counters), never the prompts; prompt bytes leave
// the process only in the opt-in sample. It decides nothing about routing.
package hygiene

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-router/meridian/internal/defaults"
	"github.com/meridian-router/meridian/request"
)

// Config tunes a Sketch. Zero fields take the documented defaults.
type Config struct {
	// BlockSize is the characters per block, as Tier-1 hashes prompts.
	// Default 64 (config.DefaultPolicy's block size): offsets are reported
	// in the same blocks the scheduler's prefix index uses.
	BlockSize int
	// MaxBlocks is how much of a prompt is compared, in blocks: 256 by
	// default (16 KiB of prompt, Tier-1's default prefix cap), at most
	// 1024. Longer prompts are compared on their head only, so the cost
	// per request does not grow with the prompt.
	MaxBlocks int
	// Window is the sliding window of the report: counts older than this
	// drop out. Default 10 minutes, kept in 5 buckets (the window slides
	// by a fifth of itself).
	Window time.Duration
	// MaxKeys bounds the tenant-and-model pairs tracked; past it the pair
	// seen least recently (within its shard) is forgotten. Default 10000;
	// each costs about 1.3 KiB (TestMemoryBoundedPerTenant).
	MaxKeys int
	// MinSharedBlocks is how much content (in blocks) a prompt must share
	// with an earlier one before a divergence counts: short prompts that
	// merely differ are not a cache problem. Default 8 (512 characters,
	// about 128 tokens).
	MinSharedBlocks int
	// Samples keeps, per tenant and model, a short window of the prompt
	// bytes where the latest early divergence happened, for the report.
	// Off by default: it is the only prompt text that leaves the process.
	// `meridian up` turns it on (a local platform sends your own prompts).
	Samples bool
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{BlockSize: 64, MaxBlocks: 256, Window: 10 * time.Minute, MaxKeys: 10000, MinSharedBlocks: 8}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	c.BlockSize = defaults.Positive(c.BlockSize, d.BlockSize)
	c.MaxBlocks = defaults.Positive(c.MaxBlocks, d.MaxBlocks)
	c.MaxBlocks = min(c.MaxBlocks, 1024)
	c.Window = defaults.Positive(c.Window, d.Window)
	c.MaxKeys = defaults.Positive(c.MaxKeys, d.MaxKeys)
	c.MinSharedBlocks = defaults.Positive(c.MinSharedBlocks, d.MinSharedBlocks)
	return c
}

const (
	numShards  = 32
	numBuckets = 5
	// recent is how many earlier prompts of a tenant and model a prompt
	// is compared with: enough for a tenant alternating a few system
	// prompts, few enough to keep a key small.
	recent = 4
	// sampleBefore and sampleAfter bound the redacted sample around the
	// first changed byte.
	sampleBefore = 24
	sampleAfter  = 40
	sampleLen    = sampleBefore + sampleAfter
	// charsPerToken converts characters to tokens, the rule of thumb
	// request.Body.EstimateTokens uses.
	charsPerToken = 4
)

// positions are the block offsets whose content is fingerprinted: every
// block of the first eight, then two a doubling (8, 12, 16, 24, …). Dense at the top, where
// divergences that matter happen, and a bounded number however long the
// prompt. Block positions[i] stands for blocks [positions[i],
// positions[i+1]) when estimating shared content.
var positions = func() []int {
	p := []int{0, 1, 2, 3, 4, 5, 6, 7}
	for base := 8; base < 1<<20; base *= 2 {
		p = append(p, base, base+base/2)
	}
	return p
}()

// maxPositions is the number of positions below 1024 blocks.
const maxPositions = 8 + 2*7

// fingerprint is one prompt's content at the sampled positions: sums are
// the chained prefix hashes (or, past them, a hash of the block alone:
// either way, equal sums up to a position mean an equal prefix, to the
// positions' resolution); shingles hash a short run of bytes after
// the first line or sentence end at or after the block's start, so that
// content shifted by a few bytes (a timestamp whose length varies) still
// matches.
type fingerprint struct {
	blocks   int32 // complete blocks compared (≤ MaxBlocks); 0: empty slot
	sums     [maxPositions]uint32
	shingles [maxPositions]uint16
}

const (
	shingleLen    = 32
	maxAnchorScan = 128
)

// shingle hashes shingleLen bytes after the first '\n' or '.' within
// maxAnchorScan bytes of text[at:] (after text[at] itself when there is
// none).
func shingle(text []byte, at int) uint16 {
	win := text[at:min(len(text), at+maxAnchorScan)]
	// The first '.', then a '\n' only before it: the second scan is short.
	i := bytes.IndexByte(win, '.')
	if i < 0 {
		i = bytes.IndexByte(win, '\n')
	} else if j := bytes.IndexByte(win[:i], '\n'); j >= 0 {
		i = j
	}
	at += i + 1
	return mix(text[at:min(len(text), at+shingleLen)])
}

// mix is a small multiply-xorshift hash of up to shingleLen bytes,
// inlined where a call to a general hash would cost more than the bytes:
// a shingle only has to tell content apart, not resist an adversary (a
// tenant fooling it only hides its own report).
func mix(b []byte) uint16 {
	if len(b) == shingleLen {
		// The common case, in four independent multiplies rather than a
		// chain of them. A product's high bits depend on every bit of its
		// word, so the sum's high bits do on all 32 bytes; the final
		// multiply spreads them before the top 16 are taken.
		h := (binary.LittleEndian.Uint64(b)^0x243f6a8885a308d3)*0xbf58476d1ce4e5b9 +
			(binary.LittleEndian.Uint64(b[8:])^0x13198a2e03707344)*0x94d049bb133111eb +
			(binary.LittleEndian.Uint64(b[16:])^0xa4093822299f31d0)*0x9e3779b97f4a7c15 +
			(binary.LittleEndian.Uint64(b[24:])^0x082efa98ec4e6c89)*0xd6e8feb86659fd93
		h ^= h >> 29
		return uint16((h * 0xbf58476d1ce4e5b9) >> 48)
	}
	h := 0x9e3779b97f4a7c15 ^ uint64(len(b))
	for len(b) >= 8 {
		h = (h ^ binary.LittleEndian.Uint64(b)) * 0xbf58476d1ce4e5b9
		h ^= h >> 31
		b = b[8:]
	}
	for _, c := range b {
		h = (h ^ uint64(c)) * 0x94d049bb133111eb
	}
	h ^= h >> 32
	return uint16(h ^ h>>16)
}

// bucket is one slice of the sliding window.
type bucket struct {
	epoch        int64 // which slice of time; stale when behind the clock
	requests     uint32
	early        uint32
	lostTokens   uint64
	sharedTokens uint64
	offsets      [offsetClasses]uint32 // early divergences by offset class
}

// offsetClasses group divergence offsets (in blocks): 0, 1, 2–3, 4–7, …,
// 64 and beyond.
const offsetClasses = 8

func offsetClass(block int) int {
	c := 0
	for block > 0 && c < offsetClasses-1 {
		c++
		block >>= 1
	}
	return c
}

// classLow is the smallest block offset in class c.
func classLow(c int) int {
	if c == 0 {
		return 0
	}
	return 1 << (c - 1)
}

// entry is the sketch of one tenant and model.
type entry struct {
	tenant, model string
	lastSeen      int64 // unix nanos
	refs          [recent]fingerprint
	next          int // refs slot the next prompt replaces
	buckets       [numBuckets]bucket

	// Cumulative counters for Prometheus.
	requests, early, lostTokens uint64

	// Opt-in sample (Config.Samples).
	sample    [sampleLen]byte
	sampleN   uint8
	sampleAt  int32 // block offset of the sampled divergence
	sampleAge int64 // unix nanos of the sample
	// lastBlock is the previous early divergence's block, compared
	// byte by byte with the next one's to find the changed byte.
	lastBlock    [maxBlockSample]byte
	lastBlockN   uint8
	lastBlockPos int32
}

// maxBlockSample bounds the bytes of a block kept for sampling.
const maxBlockSample = 64

type key struct{ tenant, model string }

type shard struct {
	mu      sync.Mutex
	entries map[key]*entry
}

// Sketch is the per-tenant, per-model prompt-divergence sketch. It is safe
// for concurrent use; Observe is on the request path and allocates nothing
// once a tenant and model are known.
type Sketch struct {
	cfg      Config
	npos     int // positions below MaxBlocks
	perShard int
	seed     maphash.Seed
	shards   [numShards]shard
	scratch  sync.Pool // *scratch
}

type scratch struct {
	text []byte
}

// New returns a Sketch with cfg's settings.
func New(cfg Config) *Sketch {
	cfg = cfg.withDefaults()
	s := &Sketch{cfg: cfg, seed: maphash.MakeSeed(), perShard: max(1, (cfg.MaxKeys+numShards-1)/numShards)}
	for s.npos < len(positions) && positions[s.npos] < cfg.MaxBlocks && s.npos < maxPositions {
		s.npos++
	}
	for i := range s.shards {
		s.shards[i].entries = map[key]*entry{}
	}
	s.scratch.New = func() any { return &scratch{text: make([]byte, 0, cfg.BlockSize*cfg.MaxBlocks+256)} }
	return s
}

// Config returns the settings in force (defaults filled in).
func (s *Sketch) Config() Config { return s.cfg }

// Observe compares one prompt of tenant for model with that pair's recent
// prompts and records the outcome at now. hashes are the prompt's chained
// prefix-block hashes as Tier-1 computed them for routing
// (tier1.Request.Hashes, blocks of BlockSize characters): where they
// reach, they decide how far the prefix matched, at no cost; past them
// (or when nil) the sketch hashes the blocks itself. A nil Sketch does
// nothing. Token-id prompts carry no text and are not compared.
//
// Observe copies the head of the prompt's text (request.AppendPromptText's
// form) to compare it; a caller that has built that text already passes
// it to ObserveText instead.
func (s *Sketch) Observe(tenant, model string, body *request.Body, hashes []uint64, now time.Time) {
	if s == nil || body == nil || ((body.Kind == request.Completion || body.Kind == request.Embedding) && body.TokenIDs != nil) {
		return
	}
	sc := s.scratch.Get().(*scratch)
	sc.text = appendPromptHead(sc.text[:0], body, s.Limit())
	s.observe(tenant, model, sc.text, hashes, now)
	s.scratch.Put(sc)
}

// Limit is how many bytes of a prompt's text are compared:
// BlockSize × MaxBlocks.
func (s *Sketch) Limit() int { return s.cfg.BlockSize * s.cfg.MaxBlocks }

// ObserveText is Observe on the prompt's text as request.AppendPromptText
// builds it, or its head of at least Limit() bytes (request.AppendPromptHead),
// such as the text Tier-1 hashed for routing: nothing is copied. text is
// only read, and not kept past the call. Empty text (a token-id prompt)
// is not compared.
func (s *Sketch) ObserveText(tenant, model string, text []byte, hashes []uint64, now time.Time) {
	if s == nil {
		return
	}
	s.observe(tenant, model, text[:min(len(text), s.Limit())], hashes, now)
}

func (s *Sketch) observe(tenant, model string, text []byte, hashes []uint64, now time.Time) {
	bs := s.cfg.BlockSize
	n := min(len(text)/bs, s.cfg.MaxBlocks)
	if n == 0 {
		return
	}
	var fp fingerprint
	fp.blocks = int32(n)
	// weights[i] is how many blocks position i stands for in a prompt of
	// n blocks: up to the next position, or to n.
	var weights [maxPositions]int32
	np := 0
	for np < s.npos && positions[np] < n {
		p := positions[np]
		if p < len(hashes) {
			fp.sums[np] = uint32(hashes[p])
		} else {
			fp.sums[np] = uint32(xxhash.Sum64(text[p*bs : (p+1)*bs]))
		}
		fp.shingles[np] = shingle(text, p*bs)
		if np > 0 {
			weights[np-1] = int32(p - positions[np-1])
		}
		np++
	}
	weights[np-1] = int32(n - positions[np-1])

	sh := &s.shards[s.shardOf(tenant, model)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.entries[key{tenant, model}]
	if e == nil {
		e = s.insertLocked(sh, tenant, model)
	}
	nowNs := now.UnixNano()
	e.lastSeen = nowNs
	b := e.bucket(nowNs, s.cfg.Window)
	b.requests++
	e.requests++

	// Compare with each recent prompt: cached is how far the prefix
	// matched (the first sampled block whose content differs), shared how
	// much content the two have at the same offsets.
	bestCached, bestShared := -1, 0
	for r := range e.refs {
		ref := &e.refs[r]
		if ref.blocks == 0 {
			continue
		}
		m, k, w := n, np, &weights
		var short [maxPositions]int32
		if int(ref.blocks) < n {
			// The earlier prompt is shorter: compare the positions below
			// its length, the last standing for blocks up to it.
			m, k, w = int(ref.blocks), 0, &short
			for k < np && positions[k] < m {
				short[k] = weights[k]
				k++
			}
			short[k-1] = int32(m - positions[k-1])
		}
		shared := int32(0)
		for i := range k {
			if fp.shingles[i] == ref.shingles[i] {
				shared += w[i]
			}
		}
		cached := m
		for i := range k {
			if fp.sums[i] != ref.sums[i] {
				cached = positions[i]
				break
			}
		}
		bestCached = max(bestCached, cached)
		bestShared = max(bestShared, int(shared))
	}
	e.refs[e.next] = fp
	e.next = (e.next + 1) % recent
	if bestCached < 0 {
		return // the first prompt: nothing to compare with
	}
	lost := max(0, bestShared-bestCached)
	b.sharedTokens += uint64(bestShared * bs / charsPerToken)
	if bestShared < s.cfg.MinSharedBlocks || 2*lost < bestShared {
		return
	}
	tokens := uint64(lost * bs / charsPerToken)
	b.early++
	b.lostTokens += tokens
	b.offsets[offsetClass(bestCached)]++
	e.early++
	e.lostTokens += tokens
	if s.cfg.Samples && bestCached < n {
		e.takeSample(text[bestCached*bs:(bestCached+1)*bs], int32(bestCached), nowNs)
	}
}

// appendPromptHead appends at most limit bytes of the prompt as Tier-1
// hashes it (request.AppendPromptText), without copying the rest of a long
// prompt.
func appendPromptHead(dst []byte, b *request.Body, limit int) []byte {
	switch b.Kind {
	case request.Completion, request.Embedding:
		head := request.Body{Kind: request.Completion, Prompt: b.Prompt[:min(len(b.Prompt), limit)]}
		dst = request.AppendPromptText(dst, &head)
	case request.Chat, request.Response:
		start := len(dst)
		for i := range b.Messages {
			room := limit - (len(dst) - start)
			if room <= 0 {
				break
			}
			one := [1]request.Message{b.Messages[i]}
			if one[0].Parts == nil && len(one[0].Content) > room {
				// Content is copied verbatim after the role, so its head
				// is the head of the message's text.
				one[0].Content = one[0].Content[:room]
			}
			msg := request.Body{Kind: request.Chat, Messages: one[:]}
			dst = request.AppendPromptText(dst, &msg)
		}
		if len(dst)-start > limit {
			dst = dst[:start+limit]
		}
	}
	return dst
}

func (s *Sketch) shardOf(tenant, model string) int {
	h := maphash.String(s.seed, tenant) ^ 0x9e3779b97f4a7c15*maphash.String(s.seed, model)
	return int(h % numShards)
}

// insertLocked adds a key to sh, forgetting the least recently seen one
// when the shard is full.
func (s *Sketch) insertLocked(sh *shard, tenant, model string) *entry {
	if len(sh.entries) >= s.perShard {
		var oldest key
		var at int64
		first := true
		for k, e := range sh.entries {
			if first || e.lastSeen < at {
				oldest, at, first = k, e.lastSeen, false
			}
		}
		delete(sh.entries, oldest)
	}
	e := &entry{tenant: cloneString(tenant), model: cloneString(model)}
	sh.entries[key{e.tenant, e.model}] = e
	return e
}

// cloneString copies s so that a kept key does not pin the request's
// header memory.
func cloneString(s string) string { return string([]byte(s)) }

// bucket returns the window slice for now, clearing it if it held an
// older slice.
func (e *entry) bucket(nowNs int64, window time.Duration) *bucket {
	width := int64(window) / numBuckets
	epoch := nowNs / max(width, 1)
	b := &e.buckets[epoch%numBuckets]
	if b.epoch != epoch {
		*b = bucket{epoch: epoch}
	}
	return b
}

// takeSample keeps a short window of block around the first byte that
// differs from the previous early divergence's block at the same offset
// (the whole block's head when there is none to compare with).
func (e *entry) takeSample(block []byte, at int32, nowNs int64) {
	block = block[:min(len(block), maxBlockSample)]
	first := 0
	if e.lastBlockN > 0 && e.lastBlockPos == at {
		prev := e.lastBlock[:e.lastBlockN]
		for first < len(block) && first < len(prev) && block[first] == prev[first] {
			first++
		}
		if first == len(block) {
			first = 0
		}
	}
	lo := max(0, first-sampleBefore)
	hi := min(len(block), lo+sampleLen)
	e.sampleN = uint8(copy(e.sample[:], block[lo:hi]))
	e.sampleAt, e.sampleAge = at, nowNs
	e.lastBlockN = uint8(copy(e.lastBlock[:], block))
	e.lastBlockPos = at
}
