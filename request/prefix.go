package request

import (
	"encoding/binary"
	"math/bits"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// BlockHash identifies a prompt prefix: block i's hash covers blocks 0..i,
// the model and the cache salt. Equal hashes mean (up to xxHash64
// collisions) an identical prefix for the same model and salt.
type BlockHash = uint64

// Seed is the hash that chains into block 0: xxHash64 of the model name
// followed by the cache salt, as GIE's prefix-cache scorer computes it.
func Seed(model, cacheSalt string) uint64 {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(model)
	_, _ = d.WriteString(cacheSalt)
	return d.Sum64()
}

// maxInlineBlock is the largest block hashed through a stack buffer; larger
// blocks go through a streaming digest (same result, slower).
const maxInlineBlock = 504

// BlockHashes appends the chained hashes of text's complete blocks of
// blockSize bytes, at most maxBlocks of them, to dst and returns the
// extended slice. Block i's hash is xxHash64(block i ‖ little-endian hash
// of block i−1), with block −1's hash the seed. A trailing partial block is
// not hashed, so a text shorter than one block yields none. These are
// exactly the hashes of GIE's prefix-cache scorer for the same text, block
// size and cap.
func BlockHashes(dst []uint64, seed uint64, text []byte, blockSize, maxBlocks int) []uint64 {
	if blockSize <= 0 || maxBlocks <= 0 {
		return dst
	}
	n := min(len(text)/blockSize, maxBlocks)
	prev := seed
	if blockSize%32 == 0 {
		for i := range n {
			prev = hashBlock(text[i*blockSize:(i+1)*blockSize], prev)
			dst = append(dst, prev)
		}
		return dst
	}
	if blockSize <= maxInlineBlock {
		var buf [maxInlineBlock + 8]byte
		for i := range n {
			copy(buf[:blockSize], text[i*blockSize:(i+1)*blockSize])
			binary.LittleEndian.PutUint64(buf[blockSize:], prev)
			prev = xxhash.Sum64(buf[:blockSize+8])
			dst = append(dst, prev)
		}
		return dst
	}
	var d xxhash.Digest
	var le [8]byte
	for i := range n {
		d.Reset()
		_, _ = d.Write(text[i*blockSize : (i+1)*blockSize])
		binary.LittleEndian.PutUint64(le[:], prev)
		_, _ = d.Write(le[:])
		prev = d.Sum64()
		dst = append(dst, prev)
	}
	return dst
}

// TokenBlockHashes is BlockHashes over token ids: each block is
// blockTokens ids, each written as 4 little-endian bytes (vLLM's token ids
// fit in 32 bits). Prompts sent as token ids hash to blocks aligned with
// the model server's own KV blocks.
func TokenBlockHashes(dst []uint64, seed uint64, ids []int64, blockTokens, maxBlocks int) []uint64 {
	if blockTokens <= 0 || maxBlocks <= 0 {
		return dst
	}
	n := min(len(ids)/blockTokens, maxBlocks)
	prev := seed
	var d xxhash.Digest
	var w [8]byte
	for i := range n {
		d.Reset()
		for _, id := range ids[i*blockTokens : (i+1)*blockTokens] {
			binary.LittleEndian.PutUint32(w[:4], uint32(id))
			_, _ = d.Write(w[:4])
		}
		binary.LittleEndian.PutUint64(w[:], prev)
		_, _ = d.Write(w[:])
		prev = d.Sum64()
		dst = append(dst, prev)
	}
	return dst
}

// PrefixHashes appends the prompt's prefix-block hashes as Meridian
// computes them, in both tiers, and returns the extended slice and the
// scratch buffer (pass it back to reuse it; what it holds is not the
// prompt's text: a chat is hashed from its messages without building the
// text, see PrefixText). target is the name the model server knows the
// request by (the LoRA adapter, else the model after any rewrite);
// blockSize is in characters (64 by default), and token-id prompts are
// cut every blockSize/4 ids. A Tier-2 that hashes with the same target,
// block size and cap gets the same hashes as the Tier-1 behind it.
func PrefixHashes(dst []uint64, b *Body, target string, blockSize, maxBlocks int, scratch []byte) ([]uint64, []byte) {
	seed := Seed(target, b.CacheSalt)
	if (b.Kind == Completion || b.Kind == Embedding) && b.TokenIDs != nil {
		return TokenBlockHashes(dst, seed, b.TokenIDs, max(1, blockSize/4), maxBlocks), scratch
	}
	if (b.Kind == Chat || b.Kind == Response) && blockSize > 0 && blockSize%32 == 0 && maxBlocks > 0 {
		// The common case, without building the text: its blocks are
		// hashed from the messages' strings where they lie within one,
		// and only those that span a boundary are assembled.
		return chatBlockHashes(dst, seed, b.Messages, blockSize, maxBlocks), scratch
	}
	scratch = PrefixText(scratch[:0], b, blockSize, maxBlocks)
	return BlockHashes(dst, seed, scratch, blockSize, maxBlocks), scratch
}

// PrefixText appends the text PrefixHashes hashes for a text prompt
// (AppendPromptText's form): only the head that covers maxBlocks blocks
// of blockSize, when that is bounded. PrefixHashes of a text prompt equals
// BlockHashes of this text with Seed(target, b.CacheSalt).
func PrefixText(dst []byte, b *Body, blockSize, maxBlocks int) []byte {
	if blockSize > 0 && maxBlocks > 0 && maxBlocks <= (1<<40)/blockSize {
		// Only the first maxBlocks blocks are hashed: copy no more of a
		// long prompt than those.
		return AppendPromptHead(dst, b, blockSize*maxBlocks)
	}
	return AppendPromptText(dst, b)
}

// xxHash64's primes.
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime4 uint64 = 9650029242287828579
)

func xxRound(acc, in uint64) uint64 {
	return bits.RotateLeft64(acc+in*prime2, 31) * prime1
}

func xxMerge(acc, v uint64) uint64 {
	return (acc^xxRound(0, v))*prime1 + prime4
}

// hashBlock is xxHash64 (seed 0) of block followed by prev in little
// endian, for a block whose length is a multiple of 32 (xxHash's stripe):
// the same value as BlockHashes' copy and xxhash.Sum64, without the copy.
func hashBlock(block []byte, prev uint64) uint64 {
	// The initial lanes for seed 0: prime1+prime2 and −prime1, mod 2⁶⁴.
	v1, v2, v3, v4 := uint64(6983438078262162902), prime2, uint64(0), uint64(7046029288634856825)
	for b := block; len(b) >= 32; b = b[32:] {
		v1 = xxRound(v1, binary.LittleEndian.Uint64(b[0:8]))
		v2 = xxRound(v2, binary.LittleEndian.Uint64(b[8:16]))
		v3 = xxRound(v3, binary.LittleEndian.Uint64(b[16:24]))
		v4 = xxRound(v4, binary.LittleEndian.Uint64(b[24:32]))
	}
	h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
	h = xxMerge(h, v1)
	h = xxMerge(h, v2)
	h = xxMerge(h, v3)
	h = xxMerge(h, v4)
	h += uint64(len(block)) + 8
	h ^= xxRound(0, prev)
	h = bits.RotateLeft64(h, 27)*prime1 + prime4
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

// blockChain hashes a text given in pieces into BlockHashes' chain.
type blockChain struct {
	dst  []uint64
	prev uint64
	size int // block size, a multiple of 32 up to maxInlineBlock
	left int // blocks still wanted
	n    int // bytes of the current block in part
	part [maxInlineBlock]byte
}

// write hashes p's bytes into the chain; false once no more blocks are
// wanted.
func (c *blockChain) write(p []byte) bool {
	if c.n > 0 {
		k := copy(c.part[c.n:c.size], p)
		c.n += k
		p = p[k:]
		if c.n < c.size {
			return true
		}
		c.emit(c.part[:c.size])
		c.n = 0
	}
	for len(p) >= c.size && c.left > 0 {
		c.emit(p[:c.size])
		p = p[c.size:]
	}
	if c.left == 0 {
		return false
	}
	c.n = copy(c.part[:], p)
	return true
}

func (c *blockChain) writeString(s string) bool {
	return c.write(unsafe.Slice(unsafe.StringData(s), len(s)))
}

func (c *blockChain) writeByte(b byte) bool {
	return c.write([]byte{b})
}

func (c *blockChain) emit(block []byte) {
	c.prev = hashBlock(block, c.prev)
	c.dst = append(c.dst, c.prev)
	c.left--
}

// chatBlockHashes is BlockHashes of AppendPromptText's text for messages,
// for a block size that is a multiple of 32.
func chatBlockHashes(dst []uint64, seed uint64, msgs []Message, blockSize, maxBlocks int) []uint64 {
	if blockSize > maxInlineBlock {
		var text []byte
		text = AppendPromptText(text, &Body{Kind: Chat, Messages: msgs})
		return BlockHashes(dst, seed, text, blockSize, maxBlocks)
	}
	c := blockChain{dst: dst, prev: seed, size: blockSize, left: maxBlocks}
	for i := range msgs {
		m := &msgs[i]
		if !c.writeString(m.Role) || !c.writeByte(roleEnd) {
			break
		}
		if m.Parts == nil && !c.writeString(m.Content) {
			break
		}
		for j := range m.Parts {
			p := &m.Parts[j]
			if p.IsText() {
				if !c.writeString(p.Text) {
					return c.dst
				}
				continue
			}
			if !c.writeByte(partMark) || !c.writeString(p.Type) || !c.writeByte(':') || !c.writeString(p.ImageURL) {
				return c.dst
			}
		}
		if !c.writeByte(messageEnd) {
			break
		}
	}
	return c.dst
}
