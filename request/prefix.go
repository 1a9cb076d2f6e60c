package request

import (
	"encoding/binary"

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
// scratch buffer (pass it back to reuse it). target is the name the model
// server knows the request by (the LoRA adapter, else the model after any
// rewrite); blockSize is in characters (64 by default), and token-id
// prompts are cut every blockSize/4 ids. A Tier-2 that hashes with the
// same target, block size and cap gets the same hashes as the Tier-1
// behind it.
func PrefixHashes(dst []uint64, b *Body, target string, blockSize, maxBlocks int, scratch []byte) ([]uint64, []byte) {
	seed := Seed(target, b.CacheSalt)
	if b.Kind == Completion && b.TokenIDs != nil {
		return TokenBlockHashes(dst, seed, b.TokenIDs, max(1, blockSize/4), maxBlocks), scratch
	}
	if blockSize > 0 && maxBlocks > 0 && maxBlocks <= (1<<40)/blockSize {
		// Only the first maxBlocks blocks are hashed: copy no more of a
		// long prompt than those.
		scratch = AppendPromptHead(scratch[:0], b, blockSize*maxBlocks)
	} else {
		scratch = AppendPromptText(scratch[:0], b)
	}
	return BlockHashes(dst, seed, scratch, blockSize, maxBlocks), scratch
}
