package request

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-router/meridian/internal/testkit"
)

// gieHashes restates GIE's hashPrompt with a streaming digest: seed =
// xxHash64(model ‖ salt); block i = xxHash64(text[i·bs:(i+1)·bs] ‖ LE64(prev)).
func gieHashes(model, salt, text string, bs, max int) []uint64 {
	if len(text) < bs {
		return nil
	}
	if len(text) > bs*max {
		text = text[:bs*max]
	}
	h := xxhash.New()
	h.WriteString(model)
	if salt != "" {
		h.WriteString(salt)
	}
	return refBlockHashes(h.Sum64(), []byte(text), bs, max)
}

func TestBlockHashesMatchGIE(t *testing.T) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 500)
	tests := []struct {
		name, model, salt string
		n, bs, max        int
	}{
		{"short", "llama", "", 63, 64, 256},
		{"one block", "llama", "", 64, 64, 256},
		{"partial tail", "llama", "", 64*5 + 10, 64, 256},
		{"capped", "llama", "", len(text), 64, 256},
		{"salted", "llama", "tenant-a", 64 * 3, 64, 256},
		{"large blocks", "m", "", 4000, 1000, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := gieHashes(tt.model, tt.salt, text[:tt.n], tt.bs, tt.max)
			got := BlockHashes(nil, Seed(tt.model, tt.salt), []byte(text[:tt.n]), tt.bs, tt.max)
			if len(got) != len(want) {
				t.Fatalf("%d hashes, want %d", len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("hash %d = %x, want %x", i, got[i], want[i])
				}
			}
		})
	}
}

// TestBlockHashVector pins one value so a change of algorithm is noticed
// even if both implementations above changed together.
func TestBlockHashVector(t *testing.T) {
	got := BlockHashes(nil, Seed("m", ""), []byte(strings.Repeat("a", 64)), 64, 256)
	var buf [72]byte
	copy(buf[:], strings.Repeat("a", 64))
	binary.LittleEndian.PutUint64(buf[64:], xxhash.Sum64String("m"))
	if want := xxhash.Sum64(buf[:]); len(got) != 1 || got[0] != want {
		t.Fatalf("got %x, want [%x]", got, want)
	}
}

func TestBlockHashesPrefixProperty(t *testing.T) {
	seed := Seed("m", "")
	a := BlockHashes(nil, seed, []byte(strings.Repeat("x", 640)), 64, 256)
	b := BlockHashes(nil, seed, []byte(strings.Repeat("x", 320)+strings.Repeat("y", 320)), 64, 256)
	for i := range 5 {
		if a[i] != b[i] {
			t.Fatalf("shared block %d differs", i)
		}
	}
	for i := 5; i < 10; i++ {
		if a[i] == b[i] {
			t.Fatalf("diverged block %d equal", i)
		}
	}
	if c := BlockHashes(nil, Seed("other", ""), []byte(strings.Repeat("x", 640)), 64, 256); c[0] == a[0] {
		t.Fatal("model does not seed the hashes")
	}
	ids := make([]int64, 100)
	th := TokenBlockHashes(nil, seed, ids, 16, 256)
	if len(th) != 6 {
		t.Fatalf("token blocks: %d, want 6", len(th))
	}
}

func BenchmarkBlockHashes(b *testing.B) {
	text := []byte(strings.Repeat("x", 64*256))
	dst := make([]uint64, 0, 256)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	cpu := testkit.StartCPU()
	for b.Loop() {
		dst = BlockHashes(dst[:0], 1, text, 64, 256)
	}
	cpu.Report(b)
}

func BenchmarkParseChat(b *testing.B) {
	benchParse(b, []byte(`{"model":"llama","stream":true,"messages":[{"role":"system","content":"`+
		strings.Repeat("You are a helpful assistant. ", 300)+`"},{"role":"user","content":"What is the capital of France?"}]}`))
}

// benchParse measures Parse of body.
func benchParse(b *testing.B, body []byte) {
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	cpu := testkit.StartCPU()
	for b.Loop() {
		v, err := Parse(body, 0)
		if err != nil {
			b.Fatal(err)
		}
		v.Release()
	}
	cpu.Report(b)
}

// BenchmarkParseChatEscaped is BenchmarkParseChat over text written as
// Python's json.dumps writes it (newlines as \n, accents as \u00e9, an
// escape every 20 bytes or so), the form tier1's decision-path fixture
// uses: the prompt cannot alias the body and is decoded into the arena.
func BenchmarkParseChatEscaped(b *testing.B) {
	benchParse(b, []byte(`{"model":"llama","stream":true,"messages":[{"role":"system","content":"`+
		strings.Repeat(`You are a helpful assistant.\n Answer briefly, caf\u00e9 r\u00e9sum\u00e9. `, 400)+
		`"},{"role":"user","content":"What is the capital of France?"}]}`))
}

func TestPrefixHashes(t *testing.T) {
	chat, err := Parse([]byte(`{"model":"m","cache_salt":"s","messages":[{"role":"user","content":"`+strings.Repeat("q", 300)+`"}]}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := PrefixHashes(nil, chat, "target", 64, 256, nil)
	want := BlockHashes(nil, Seed("target", "s"), AppendPromptText(nil, chat), 64, 256)
	if len(got) != 4 || !slices.Equal(got, want) {
		t.Fatalf("chat: %x, want %x (4 blocks)", got, want)
	}
	ids, err := Parse([]byte(`{"model":"m","prompt":[`+strings.Repeat("7,", 40)+`7]}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = PrefixHashes(nil, ids, "target", 64, 256, nil)
	if want := TokenBlockHashes(nil, Seed("target", ""), ids.TokenIDs, 16, 256); len(got) != 2 || !slices.Equal(got, want) {
		t.Fatalf("token ids: %x, want %x (2 blocks of 16)", got, want)
	}
}

// refBlockHashes is BlockHashes written plainly with a streaming digest:
// the reference the fast paths are checked against.
func refBlockHashes(seed uint64, text []byte, blockSize, maxBlocks int) []uint64 {
	var out []uint64
	prev := seed
	for i := 0; (i+1)*blockSize <= len(text) && i < maxBlocks; i++ {
		var d xxhash.Digest
		d.Reset()
		d.Write(text[i*blockSize : (i+1)*blockSize])
		var le [8]byte
		binary.LittleEndian.PutUint64(le[:], prev)
		d.Write(le[:])
		prev = d.Sum64()
		out = append(out, prev)
	}
	return out
}

func TestHashBlockMatchesXXHash(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, size := range []int{32, 64, 96, 128, 480} {
		block := make([]byte, size)
		for range 50 {
			for i := range block {
				block[i] = byte(r.Uint32())
			}
			prev := r.Uint64()
			buf := binary.LittleEndian.AppendUint64(append([]byte{}, block...), prev)
			if got, want := hashBlock(block, prev), xxhash.Sum64(buf); got != want {
				t.Fatalf("size %d: hashBlock %x, xxhash %x", size, got, want)
			}
		}
	}
}

// TestChatBlockHashes: the hashes made from the messages' strings equal
// those of the prompt text, for every block size and cap, across message
// and part boundaries.
func TestChatBlockHashes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('a' + r.IntN(26))
		}
		return string(b)
	}
	for trial := range 300 {
		var msgs []Message
		for range r.IntN(6) {
			m := Message{Role: word(r.IntN(10))}
			if r.IntN(4) == 0 {
				m.Parts = []Part{}
				for range r.IntN(4) {
					if r.IntN(3) == 0 {
						m.Parts = append(m.Parts, Part{Type: "image_url", ImageURL: word(r.IntN(40))})
					} else {
						m.Parts = append(m.Parts, Part{Type: "text", Text: word(r.IntN(300))})
					}
				}
			} else {
				m.Content = word(r.IntN(700))
			}
			msgs = append(msgs, m)
		}
		b := &Body{Kind: Chat, Model: "m", Messages: msgs}
		text := AppendPromptText(nil, b)
		for _, bs := range []int{32, 64, 96, 48, 512} {
			for _, maxBlocks := range []int{1, 3, 256} {
				want := refBlockHashes(Seed("t", ""), text, bs, maxBlocks)
				got, _ := PrefixHashes(nil, b, "t", bs, maxBlocks, nil)
				if !slices.Equal(got, want) {
					t.Fatalf("trial %d, block %d, cap %d: %d hashes, want %d (first differs: %v)", trial, bs, maxBlocks, len(got), len(want), len(got) > 0 && len(want) > 0 && got[0] != want[0])
				}
				if got := BlockHashes(nil, Seed("t", ""), text, bs, maxBlocks); !slices.Equal(got, want) {
					t.Fatalf("trial %d, block %d, cap %d: BlockHashes differs from the reference", trial, bs, maxBlocks)
				}
			}
		}
	}
}
