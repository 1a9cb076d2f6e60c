package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/meridian-router/meridian/internal/testkit"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Body
	}{
		{
			name: "completion",
			body: `{"model":"llama","prompt":"Hello","stream":true,"max_tokens":5}`,
			want: Body{Model: "llama", Stream: true, Kind: Completion, Prompt: "Hello", MaxTokens: 5},
		},
		{
			name: "completion with token ids and salt",
			body: ` {"prompt":[1, 2,30000],"cache_salt":"s1","model":"m"} `,
			want: Body{Model: "m", Kind: Completion, CacheSalt: "s1", TokenIDs: []int64{1, 2, 30000}},
		},
		{
			name: "chat with string and array contents in order",
			body: `{"model":"m","messages":[{"role":"system","content":"be brief"},` +
				`{"role":"user","content":[{"type":"text","text":"a\u00e9\n"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]},` +
				`{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}],"stream":false}`,
			want: Body{Model: "m", Kind: Chat, Messages: []Message{
				{Role: "system", Content: "be brief"},
				{Role: "user", Parts: []Part{{Type: "text", Text: "aé\n"}, {Type: "image_url", ImageURL: "http://x/y.png"}}},
				{Role: "assistant"},
			}},
		},
		{
			name: "last duplicate wins, unknown keys skipped",
			body: `{"model":"a","x":{"model":"nested"},"model":"b","stream":null}`,
			want: Body{Model: "b", Kind: Chat, Messages: []Message{}},
		},
		{
			name: "messages win over prompt",
			body: `{"model":"m","prompt":"p","messages":[]}`,
			want: Body{Model: "m", Kind: Chat, Messages: []Message{}},
		},
		{
			name: "escapes and surrogates decode like encoding/json",
			body: `{"model":"m\"\\\/\b\f\n\r\t","prompt":"\ud83d\ude00 \ud800x \udc00"}`,
			want: Body{Model: "m\"\\/\b\f\n\r\t", Kind: Completion, Prompt: "😀 \uFFFDx \uFFFD"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "last duplicate wins, unknown keys skipped" {
				tt.body = strings.Replace(tt.body, `"stream":null}`, `"stream":null,"messages":[]}`, 1)
			}
			got, err := Parse([]byte(tt.body), 0)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			g := *got
			g.arena, g.parsed, g.prompts, g.nprompts = nil, 0, [2][2]int{}, 0
			if !reflect.DeepEqual(g, tt.want) {
				t.Fatalf("Parse =\n%+v\nwant\n%+v", g, tt.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		body string
		max  int64
		want error
	}{
		{"not json", `hello`, 0, ErrMalformed},
		{"array", `[1]`, 0, ErrMalformed},
		{"truncated", `{"model":"m","prompt":"x`, 0, ErrMalformed},
		{"trailing", `{"model":"m","prompt":"x"} {}`, 0, ErrMalformed},
		{"bad escape", `{"model":"m","prompt":"\x"}`, 0, ErrMalformed},
		{"raw control char", "{\"model\":\"m\",\"prompt\":\"a\x01\"}", 0, ErrMalformed},
		{"bad number", `{"model":"m","n":01,"prompt":""}`, 0, ErrMalformed},
		{"stream not bool", `{"model":"m","stream":"yes","prompt":""}`, 0, ErrMalformed},
		{"missing model", `{"prompt":"x"}`, 0, ErrMissingModel},
		{"empty model", `{"model":"","prompt":"x"}`, 0, ErrMissingModel},
		{"model not string", `{"model":7,"prompt":"x"}`, 0, ErrMissingModel},
		{"no prompt", `{"model":"m"}`, 0, ErrPromptType},
		{"prompt object", `{"model":"m","prompt":{}}`, 0, ErrPromptType},
		{"batched prompts", `{"model":"m","prompt":["a","b"]}`, 0, ErrPromptType},
		{"fractional token", `{"model":"m","prompt":[1.5]}`, 0, ErrPromptType},
		{"messages not array", `{"model":"m","messages":"hi"}`, 0, ErrPromptType},
		{"message not object", `{"model":"m","messages":["hi"]}`, 0, ErrPromptType},
		{"content number", `{"model":"m","messages":[{"role":"user","content":3}]}`, 0, ErrPromptType},
		{"part not object", `{"model":"m","messages":[{"content":["x"]}]}`, 0, ErrPromptType},
		{"too large", `{"model":"m","prompt":"xxxxxxxxxx"}`, 16, ErrTooLarge},
		{"too deep", `{"model":"m","prompt":"","x":` + strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1) + `}`, 0, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.body), tt.max)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Parse error = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestRead(t *testing.T) {
	body := `{"model":"m","prompt":"` + strings.Repeat("x", 100) + `"}`
	if _, _, err := Read(strings.NewReader(body), int64(len(body))); err != nil {
		t.Fatalf("Read at the limit: %v", err)
	}
	if _, _, err := Read(strings.NewReader(body), int64(len(body)-1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Read over the limit: err = %v, want ErrTooLarge", err)
	}
}

// ReadSized reads exactly what Read reads, whatever length within the
// limit is announced; a length announced over it is refused unread.
func TestReadSized(t *testing.T) {
	body := `{"model":"m","prompt":"` + strings.Repeat("x", 100) + `"}`
	n := int64(len(body))
	for _, size := range []int64{0, -1, n, n - 10} {
		_, raw, err := ReadSized(strings.NewReader(body), size, n)
		switch {
		case err != nil:
			t.Errorf("announced %d: %v", size, err)
		case string(raw) != body:
			t.Errorf("announced %d: read %q", size, raw)
		}
	}
	if _, _, err := ReadSized(strings.NewReader(body), n-10, n-1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the limit with a short announced length: err = %v, want ErrTooLarge", err)
	}
	if _, _, err := ReadSized(strings.NewReader(body), n, n-1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("announced over the limit: err = %v, want ErrTooLarge", err)
	}
	r := strings.NewReader(body)
	if _, _, err := ReadSized(r, n+10, n); !errors.Is(err, ErrTooLarge) || r.Len() != len(body) {
		t.Fatalf("announced over the limit: err = %v and %d bytes read, want ErrTooLarge and none", err, len(body)-r.Len())
	}
	if _, _, err := ReadSized(strings.NewReader(body[:50]), n, n); err == nil {
		t.Fatal("a body shorter than announced was read without an error")
	}
	// Long bodies, announced: read whole, in a buffer that grew with them.
	for _, k := range []int{sizedStart - 40, sizedStart + 1, 3*sizedStart + 7, 1 << 20} {
		long := `{"model":"m","prompt":"` + strings.Repeat("y", k) + `"}`
		_, raw, err := ReadSized(strings.NewReader(long), int64(len(long)), DefaultMaxBytes)
		if err != nil || string(raw) != long {
			t.Errorf("%d bytes announced and sent: %v, %d bytes read", len(long), err, len(raw))
		}
	}
}

// A length announced alone holds little: ReadSized's buffer is never more
// than four times what arrived (and its first sizedStart bytes) until the
// body ends, early or not.
func TestReadSizedGrowsWithWhatArrives(t *testing.T) {
	for _, sent := range []int{10, sizedStart + 1, 5 * sizedStart} {
		r := &capReader{data: bytes.Repeat([]byte("z"), sent)}
		if _, _, err := ReadSized(r, DefaultMaxBytes, DefaultMaxBytes); err == nil {
			t.Fatalf("%d of %d bytes sent: no error", sent, DefaultMaxBytes)
		}
		if limit := max(sizedStart, 4*sent); r.maxBuf > limit {
			t.Errorf("%d of %d bytes sent: read into a buffer of %d, want at most %d", sent, DefaultMaxBytes, r.maxBuf, limit)
		}
	}
}

// capReader serves data, then EOF, and notes the largest buffer its
// reader held: what it had delivered and the room left past p, for a
// reader that reads each byte into the buffer it grows (ReadSized).
type capReader struct {
	data      []byte
	delivered int
	maxBuf    int
}

func (r *capReader) Read(p []byte) (int, error) {
	r.maxBuf = max(r.maxBuf, r.delivered+cap(p))
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	r.delivered += n
	return n, nil
}

// AppendPromptHead is the head of AppendPromptText, for every limit.
func TestAppendPromptHead(t *testing.T) {
	for _, raw := range []string{
		`{"model":"m","prompt":"` + strings.Repeat("abc", 200) + `"}`,
		`{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("s", 300) + `"},{"role":"user","content":[{"type":"text","text":"` +
			strings.Repeat("t", 300) + `"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]},{"role":"user","content":"` + strings.Repeat("u", 500) + `"}]}`,
	} {
		b, err := Parse([]byte(raw), 0)
		if err != nil {
			t.Fatal(err)
		}
		full := AppendPromptText(nil, b)
		for _, limit := range []int{0, 1, 255, 256, 300, 303, 304, 620, 1024, len(full), len(full) + 5} {
			want := full[:min(limit, len(full))]
			if got := AppendPromptHead([]byte("pre"), b, limit); string(got) != "pre"+string(want) {
				t.Errorf("limit %d: %q, want %q", limit, got, want)
			}
		}
	}
}

func TestEstimateTokens(t *testing.T) {
	b := Body{Kind: Completion, Prompt: strings.Repeat("x", 400)}
	if got := b.EstimateTokens(); got != 100 {
		t.Errorf("text: %d, want 100", got)
	}
	b = Body{Kind: Completion, TokenIDs: make([]int64, 37)}
	if got := b.EstimateTokens(); got != 37 {
		t.Errorf("ids: %d, want 37", got)
	}
	b = Body{Kind: Chat, Messages: []Message{{Role: "user", Content: strings.Repeat("x", 396)}}}
	if got := b.EstimateTokens(); got != 104 {
		t.Errorf("chat: %d, want 104", got)
	}
}

// gieMessage mirrors GIE's chat message type (pkg/epp/scheduling/types), so
// the test can check AppendGIEPrompt against encoding/json itself.
type gieMessage struct {
	Role    string     `json:"role,omitempty"`
	Content gieContent `json:"content,omitempty"`
}

type gieContent struct {
	Raw        string
	Structured []gieBlock
}

type gieBlock struct {
	Type     string   `json:"type"`
	Text     string   `json:"text,omitempty"`
	ImageURL gieImage `json:"image_url,omitempty"`
}

type gieImage struct {
	URL string `json:"url,omitempty"`
}

func (c *gieContent) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err == nil {
		c.Raw = s
		return nil
	}
	var blocks []gieBlock
	if err := json.Unmarshal(data, &blocks); err == nil {
		c.Structured = blocks
		return nil
	}
	return errors.New("content format not supported")
}

func (c gieContent) MarshalJSON() ([]byte, error) {
	if c.Raw != "" {
		return json.Marshal(c.Raw)
	}
	if c.Structured != nil {
		return json.Marshal(c.Structured)
	}
	return json.Marshal("")
}

// gieChatJSON is GIE's prompt text for a chat body: the JSON of its
// messages as GIE decodes and re-encodes them.
func gieChatJSON(body []byte) ([]byte, error) {
	var req struct {
		Messages []gieMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	return json.Marshal(req.Messages)
}

func TestAppendGIEPromptMatchesEncodingJSON(t *testing.T) {
	bodies := []string{
		`{"model":"m","messages":[{"role":"user","content":"Hi <b> & \"you\"\u2028\u0001 é 😀"}]}`,
		`{"model":"m","messages":[{"content":"no role"},{"role":"assistant","content":""},{"role":"tool"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u&v"}},{"type":"text"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[]}]}`,
		`{"model":"m","messages":[]}`,
	}
	for _, body := range bodies {
		want, err := gieChatJSON([]byte(body))
		if err != nil {
			t.Fatalf("reference: %v", err)
		}
		b, err := Parse([]byte(body), 0)
		if err != nil {
			t.Fatalf("Parse(%s): %v", body, err)
		}
		if got := AppendGIEPrompt(nil, b); !bytes.Equal(got, want) {
			t.Errorf("AppendGIEPrompt(%s)\n got %s\nwant %s", body, got, want)
		}
	}
}

func TestAppendPromptTextIgnoresSpelling(t *testing.T) {
	a, err := Parse([]byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse([]byte(`{ "messages" : [ { "content" : [ {"text":"hel\u006co","type":"text"} ], "role":"user" } ], "model":"m" }`), 0)
	if err != nil {
		t.Fatal(err)
	}
	if x, y := AppendPromptText(nil, a), AppendPromptText(nil, b); !bytes.Equal(x, y) {
		t.Fatalf("same conversation, different text: %q vs %q", x, y)
	}
	c, err := Parse([]byte(`{"model":"m","messages":[{"role":"system","content":"hello"}]}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(AppendPromptText(nil, a), AppendPromptText(nil, c)) {
		t.Fatal("different roles gave the same text")
	}
}

// TestParsePromptTypeErrorsFollowTheWinningField: a type error counts only
// for the field that decides the kind, and the rest of the body is still
// checked after one.
func TestParsePromptTypeErrorsFollowTheWinningField(t *testing.T) {
	if _, err := Parse([]byte(`{"model":"m","prompt":{"x":1},"messages":[]}`), 0); err != nil {
		t.Fatalf("bad prompt with good messages: %v", err)
	}
	if _, err := Parse([]byte(`{"model":"m","messages":[{"content":3}],"prompt":"p"}`), 0); !errors.Is(err, ErrPromptType) {
		t.Fatalf("bad messages: %v, want ErrPromptType", err)
	}
	if _, err := Parse([]byte(`{"model":"m","prompt":{"x":1},"messages":[],"y":tru}`), 0); !errors.Is(err, ErrMalformed) {
		t.Fatalf("syntax error after a bad prompt: %v, want ErrMalformed", err)
	}
	if _, err := Parse([]byte(`{"model":"m","messages":[{"content":[1,{"a":}]}]}`), 0); !errors.Is(err, ErrMalformed) {
		t.Fatalf("syntax error inside a badly typed content: %v, want ErrMalformed", err)
	}
}

func TestWithModel(t *testing.T) {
	for _, tc := range []struct{ name, raw, from, to, want string }{
		{"byte edit", `{"model":"a","prompt":"say \"model\":\"a\""}`, "a", "b", `{"model":"b","prompt":"say \"model\":\"a\""}`},
		{"spaced", `{"model" : "a", "prompt":"x"}`, "a", "b", `{"model":"b","prompt":"x"}`},
		{"same", `{"model":"a"}`, "a", "a", `{"model":"a"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := WithModel([]byte(tc.raw), tc.from, tc.to)
			if err != nil || string(got) != tc.want {
				t.Fatalf("WithModel = %s, %v; want %s", got, err, tc.want)
			}
		})
	}
	if _, err := WithModel([]byte(`[1]`), "a", "b"); err == nil {
		t.Fatal("a body that is not an object was accepted")
	}
}

// TestPlainRun checks plainRun's eight-byte test against plainByte: every
// byte value at every position of a word, after plain bytes and before
// random ones (whose borrows and flags must not matter).
func TestPlainRun(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for pos := range 8 {
		for c := range 256 {
			b := make([]byte, 16)
			for i := range b {
				b[i] = byte('a' + r.IntN(26))
			}
			b[pos] = byte(c)
			for i := pos + 1; i < len(b); i++ {
				b[i] = byte(r.Uint32())
			}
			want := 0
			for want < len(b) && plainByte[b[want]] {
				want++
			}
			if got := plainRun(b, 0); got != want {
				t.Fatalf("byte %#x at %d in %q: plainRun %d, want %d", c, pos, b, got, want)
			}
		}
	}
}

// TestParseLongEscaped checks the arena decoder's 64-byte blocks against
// encoding/json: long prompts mixing plain runs of every length with every
// kind of escape, raw and invalid UTF-8, across block boundaries.
func TestParseLongEscaped(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 2))
	pieces := []string{`\n`, `\"`, `\\`, `\/`, `\t`, `\u00e9`, `\u4e2d`, `\u0041`, `\ud83d\ude00`, `\ud800`,
		"é", "中", "😀", "\xff", "]", "#", " "}
	for range 3000 {
		var sb strings.Builder
		for sb.Len() < 100+r.IntN(700) {
			if r.IntN(3) == 0 {
				sb.WriteString(pieces[r.IntN(len(pieces))])
				continue
			}
			for range r.IntN(80) {
				sb.WriteByte(byte('a' + r.IntN(26)))
			}
		}
		body := `{"model":"m","prompt":"` + sb.String() + `"}`
		var want struct{ Prompt string }
		if err := json.Unmarshal([]byte(body), &want); err != nil {
			t.Fatalf("encoding/json: %v on %q", err, body)
		}
		got, err := Parse([]byte(body), 0)
		if err != nil {
			t.Fatalf("Parse: %v on %q", err, body)
		}
		if got.Prompt != want.Prompt {
			t.Fatalf("prompt of %q:\n got %q\nwant %q", body, got.Prompt, want.Prompt)
		}
	}
}

// chatBody is a chat body of about n bytes whose contents name tag.
func chatBody(model, salt, tag string, n int) []byte {
	text := strings.Repeat(tag+` caf\u00e9 `, n/(len(tag)+11)+1)
	return []byte(`{"model":"` + model + `","cache_salt":"` + salt + `","messages":[{"role":"user","content":"` + text + `"}]}`)
}

func TestReleaseKeepsModelAndSalt(t *testing.T) {
	long := strings.Repeat("m", 200) // beyond the body's own room
	for _, model := range []string{"llama", long} {
		a, err := Parse(chatBody(model, "salt-a", "aaaa", 4000), 0)
		if err != nil {
			t.Fatal(err)
		}
		content := strings.Clone(a.Messages[0].Content)
		a.Release()
		if a.Model != model || a.CacheSalt != "salt-a" || a.Kind != Chat {
			t.Fatalf("after Release: model %.10q, salt %q, kind %v", a.Model, a.CacheSalt, a.Kind)
		}
		if a.Messages != nil || a.Prompt != "" {
			t.Fatalf("after Release the prompt is still readable: %d messages", len(a.Messages))
		}
		// The next body of the size reuses a's buffer: a's model and salt
		// must not change, and b must read as itself.
		b, err := Parse(chatBody("other", "salt-b", "bbbb", 4000), 0)
		if err != nil {
			t.Fatal(err)
		}
		if a.Model != model || a.CacheSalt != "salt-a" {
			t.Fatalf("a's model or salt changed when b was parsed: %.10q %q", a.Model, a.CacheSalt)
		}
		if b.Model != "other" || b.CacheSalt != "salt-b" || !strings.HasPrefix(b.Messages[0].Content, "bbbb café") || len(b.Messages[0].Content) != len(content) {
			t.Fatalf("b = %q %q %.20q", b.Model, b.CacheSalt, b.Messages[0].Content)
		}
		b.Release()
	}
}

func TestReleaseReusesTheBuffer(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items: allocation counts mean nothing under it")
	}
	body := chatBody("llama", "", "x", 16000)
	allocs := testkit.AllocsPerRun(50, func() {
		b, err := Parse(body, 0)
		if err != nil {
			t.Fatal(err)
		}
		b.Release()
	})
	if allocs > 1 {
		t.Fatalf("Parse then Release: %v allocations, want 1 (the Body; the buffer is reused)", allocs)
	}
}

// TestReleaseTwice: a second Release must not return the buffer again, or
// two later bodies would share it.
func TestReleaseTwice(t *testing.T) {
	for range 20 {
		a, err := Parse(chatBody("m", "", "a", 3000), 0)
		if err != nil {
			t.Fatal(err)
		}
		a.Release()
		a.Release()
		b, err := Parse(chatBody("m", "", "b", 3000), 0)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Parse(chatBody("m", "", "c", 3000), 0)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(b.Messages[0].Content, "b café") || !strings.HasPrefix(c.Messages[0].Content, "c café") {
			t.Fatalf("two bodies share a buffer: %.10q %.10q", b.Messages[0].Content, c.Messages[0].Content)
		}
		b.Release()
		c.Release()
	}
}

// TestReleaseConcurrent parses and releases from many goroutines: each
// body must read as itself until released (run with -race).
func TestReleaseConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				tag := fmt.Sprintf("g%di%d", g, i)
				b, err := Parse(chatBody("m", tag, tag, 1000+500*(i%8)), 0)
				if err != nil {
					t.Error(err)
					return
				}
				if b.CacheSalt != tag || !strings.HasPrefix(b.Messages[0].Content, tag+" café") {
					t.Errorf("body %s reads %q %.20q", tag, b.CacheSalt, b.Messages[0].Content)
					return
				}
				b.Release()
			}
		})
	}
	wg.Wait()
}

func TestArenaClass(t *testing.T) {
	for _, tt := range []struct{ n, want int }{{0, 0}, {1, 0}, {1024, 0}, {1025, 1}, {2048, 1}, {2049, 2}, {1 << 20, 10}, {1<<20 + 1, -1}} {
		if got := arenaClass(tt.n); got != tt.want {
			t.Errorf("arenaClass(%d) = %d, want %d", tt.n, got, tt.want)
		}
	}
}
