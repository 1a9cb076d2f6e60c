package sim

import (
	"encoding/json"
	"testing"
)

// TestTokenChunkMatchesMarshal: the hand-written chunk encoder writes
// the bytes json.Marshal writes for the same event, for chat and
// completions, with and without usage, and for strings that need
// escaping.
func TestTokenChunkMatchesMarshal(t *testing.T) {
	for _, tc := range []struct {
		chat              bool
		id, model, text   string
		prompt, completed int
	}{
		{true, "chatcmpl-1", "llama", " The sim", -1, 2},
		{true, "chatcmpl-2", "llama", " answering", 40, 7},
		{false, "cmpl-3", "base-model", ".", 5, 1},
		{false, "cmpl-4", "m", "x", -1, 1},
		{true, `id"with\quote`, "<model>&", "tab\there\nünïcode \u2028", 3, 9},
	} {
		object := "text_completion"
		choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": nil}
		if tc.chat {
			object = "chat.completion.chunk"
			choice["delta"] = map[string]any{"content": tc.text}
		} else {
			choice["text"] = tc.text
		}
		ev := map[string]any{"id": tc.id, "object": object, "created": int64(1700000000), "model": tc.model, "choices": []any{choice}}
		if tc.prompt >= 0 {
			ev["usage"] = map[string]any{"prompt_tokens": tc.prompt, "completion_tokens": tc.completed, "total_tokens": tc.prompt + tc.completed}
		}
		want, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		got := appendTokenChunk(nil, tc.id, object, tc.model, 1700000000, tc.chat, tc.text, tc.prompt, tc.completed)
		if string(got) != string(want) {
			t.Errorf("chunk\n got %s\nwant %s", got, want)
		}
	}
}

// TestResponseIDIsOpaque: a response id says nothing about the pod that
// served it (callers must not learn pod names).
func TestResponseIDIsOpaque(t *testing.T) {
	a, b := responseID(), responseID()
	if len(a) != 32 || a == b {
		t.Fatalf("ids %q, %q: want 32 random hex digits each", a, b)
	}
	for _, c := range a {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			t.Fatalf("id %q is not hex", a)
		}
	}
}

// TestUsageChunkMatchesMarshal: the final usage chunk's encoder writes
// what json.Marshal writes for the event stream built before it.
func TestUsageChunkMatchesMarshal(t *testing.T) {
	out := Outcome{Request: &Request{PromptTokens: 812}, OutputTokens: 16, CachedTokens: 768}
	for _, object := range []string{"chat.completion.chunk", "text_completion"} {
		ev := map[string]any{"id": "chatcmpl-x", "object": object, "created": int64(1700000000), "model": "m<1>", "choices": []any{}, "usage": usage(&out)}
		want, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		got := appendUsageChunk(nil, "chatcmpl-x", object, "m<1>", 1700000000, 812, 16, 768)
		if string(got) != string(want) {
			t.Errorf("usage chunk\n got %s\nwant %s", got, want)
		}
	}
}
