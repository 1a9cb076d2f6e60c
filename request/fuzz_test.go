package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// FuzzParse checks Parse against encoding/json: it never panics, it accepts
// exactly the bodies encoding/json finds valid (within the nesting bound),
// and when it accepts, model, stream and the prompt agree with what
// encoding/json decodes.
func FuzzParse(f *testing.F) {
	seeds := []string{
		`{"model":"m","prompt":"hi"}`,
		`{"model":"m","prompt":[1,2,3],"stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"cache_salt":"s"}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]}]}`,
		`{"model":"m\u00e9\ud83d\ude00","prompt":"\ud800"}`,
		`{"model":"m","prompt":"x","model":"n"}`,
		`{"model":1}`,
		`{"model":"m","prompt":1e5}`,
		`[]`,
		`{"a":[{"b":[true,false,null,-0.5e-3]}],"model":"m","prompt":""}`,
		"{\"model\":\"m\",\"prompt\":\"\xff\"}",
		`{"model":"m","messages":[{"content":null}]}`,
		// The arena's decoding: every escape after a plain run, then the
		// cases it leaves to the general decoder (pairs, bad escapes,
		// invalid UTF-8, which decodes longer than it is written).
		`{"model":"m","messages":[{"role":"user","content":"a\n\t\r\b\f\/\\\"b\u0041\u00e9\u20ac\u0000é€x"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"a\u00e9\ud83d\ude00b\ud800c"}]}`,
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\n\xff\xfe\\u00e9\"}]}",
		`{"model":"m","messages":[{"role":"user","content":"a\n\q"}]}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := Parse(data, 0)
		valid := json.Valid(data)
		if err != nil {
			var obj map[string]json.RawMessage
			if errors.Is(err, ErrMalformed) && json.Unmarshal(data, &obj) == nil &&
				bytes.Count(data, []byte("["))+bytes.Count(data, []byte("{")) <= maxDepth {
				// A valid object is malformed only for a non-boolean stream.
				var stream *bool
				if json.Unmarshal(obj["stream"], &stream) == nil {
					t.Fatalf("Parse rejects a valid object %q: %v", data, err)
				}
			}
			return
		}
		if !valid {
			t.Fatalf("Parse accepts invalid JSON %q", data)
		}
		var ref map[string]json.RawMessage
		if err := json.Unmarshal(data, &ref); err != nil {
			t.Fatalf("reference decode of %q: %v", data, err)
		}
		// encoding/json matches keys case-insensitively when decoding into
		// a struct, but a map keeps them exact, like Parse.
		var model string
		if err := json.Unmarshal(ref["model"], &model); err != nil || model != b.Model {
			t.Fatalf("model = %q, reference %q (%v)", b.Model, model, err)
		}
		if raw, ok := ref["stream"]; ok {
			var stream bool
			_ = json.Unmarshal(raw, &stream)
			if stream != b.Stream {
				t.Fatalf("stream = %v, reference %v", b.Stream, stream)
			}
		}
		if b.Kind == Completion && b.TokenIDs == nil {
			var prompt string
			if err := json.Unmarshal(ref["prompt"], &prompt); err != nil || prompt != b.Prompt {
				t.Fatalf("prompt = %q, reference %q (%v)", b.Prompt, prompt, err)
			}
		}
		if b.Kind == Chat {
			if want, err := gieChatJSON(data); err == nil && !foldedKeys(data) {
				if got := AppendGIEPrompt(nil, b); !bytes.Equal(got, want) {
					t.Fatalf("GIE prompt of %q\n got %s\nwant %s", data, got, want)
				}
			}
			_ = AppendPromptText(nil, b)
		}
	})
}

// foldedKeys reports whether a body spells a key GIE reads in another case
// ("Content" for "content"): encoding/json matches struct fields
// case-insensitively, Parse does not, and vLLM does not either.
func foldedKeys(data []byte) bool {
	known := []string{"messages", "role", "content", "type", "text", "image_url", "url"}
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		k, ok := tok.(string)
		if !ok {
			continue
		}
		for _, w := range known {
			if k != w && strings.EqualFold(k, w) {
				return true
			}
		}
	}
}
