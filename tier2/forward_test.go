package tier2

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

func TestRewriteBody(t *testing.T) {
	cases := []struct {
		name, body, public, target string
		usage                      bool
	}{
		{"rename", `{"model":"chat","messages":[]}`, "chat", "chat-v2", false},
		{"usage only", `{"model":"chat","stream":true}`, "chat", "chat", true},
		{"both", `{"model":"chat","stream":true,"messages":[{"role":"user","content":"say \"model\":\"chat\""}]}`, "chat", "chat-v2", true},
		{"spaced key (slow path)", `{"model": "chat", "stream": true}`, "chat", "chat-v2", true},
		{"existing stream_options (slow path)", `{"model":"chat","stream":true,"stream_options":{"continuous_usage_stats":false}}`, "chat", "chat-v2", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := rewriteBody([]byte(tc.body), tc.public, tc.target, tc.usage, strings.Contains(tc.body, "stream_options"))
			if err != nil {
				t.Fatal(err)
			}
			out := sb.bytes()
			if got, _ := io.ReadAll(sb.reader()); !bytes.Equal(got, out) || int64(len(out)) != sb.size() {
				t.Fatalf("reader gives %q (%d bytes announced), want %q", got, sb.size(), out)
			}
			var v struct {
				Model         string
				StreamOptions map[string]any `json:"stream_options"`
				Messages      []struct{ Content string }
			}
			if err := json.Unmarshal(out, &v); err != nil {
				t.Fatalf("rewritten body is not JSON: %v\n%s", err, out)
			}
			if v.Model != tc.target {
				t.Fatalf("model %q, want %q", v.Model, tc.target)
			}
			if tc.usage && v.StreamOptions["include_usage"] != true {
				t.Fatalf("include_usage not set: %s", out)
			}
			if len(v.Messages) > 0 && v.Messages[0].Content != `say "model":"chat"` {
				t.Fatalf("message content changed: %q", v.Messages[0].Content)
			}
		})
	}
}

func TestUsageTokens(t *testing.T) {
	for in, want := range map[string]int64{
		`{"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":2,"total_tokens":5}}`: 5,
		`{"usage": {"total_tokens": 1234}}`:                                                 1234,
		`{"choices":[{"delta":{"content":"x"}}]}`:                                           0,
	} {
		if got := usageTokens([]byte(in)); got != want {
			t.Errorf("usageTokens(%s) = %d, want %d", in, got, want)
		}
	}
}
