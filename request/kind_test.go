package request

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func TestKindOf(t *testing.T) {
	for path, want := range map[string]Kind{
		"/v1/chat/completions": Chat, "/v1/completions": Completion, "/v1/embeddings": Embedding,
		"/v1/responses?x=1": Response, "/v1/models": 0, "/v1/embeddings/": 0,
	} {
		if got := KindOf(path); got != want {
			t.Errorf("KindOf(%q) = %s, want %s", path, got, want)
		}
	}
}

// TestParseEmbedding reads each shape of an embeddings input, estimates
// its tokens, and refuses the shapes the API refuses with param "input".
func TestParseEmbedding(t *testing.T) {
	for _, tc := range []struct {
		body   string
		prompt string
		inputs []string
		ids    []int64
		tokens int
	}{
		{`{"model":"e","input":"abcdefgh"}`, "abcdefgh", nil, nil, 2},
		{`{"model":"e","input":["abcd","abcdefgh"],"prompt":"ignored","messages":7}`, "", []string{"abcd", "abcdefgh"}, nil, 3},
		{`{"model":"e","input":[1,2,3]}`, "", nil, []int64{1, 2, 3}, 3},
		{`{"model":"e","input":[[1,2],[3]]}`, "", nil, []int64{1, 2, 3}, 3},
	} {
		b, err := ParseAs([]byte(tc.body), 0, Embedding)
		if err != nil {
			t.Errorf("%s: %v", tc.body, err)
			continue
		}
		if b.Kind != Embedding || b.Prompt != tc.prompt || !slices.Equal(b.Inputs, tc.inputs) || !slices.Equal(b.TokenIDs, tc.ids) || b.EstimateTokens() != tc.tokens {
			t.Errorf("%s: kind %s prompt %q inputs %q ids %v tokens %d", tc.body, b.Kind, b.Prompt, b.Inputs, b.TokenIDs, b.EstimateTokens())
		}
	}
	for _, body := range []string{
		`{"model":"e"}`, `{"model":"e","prompt":"x"}`, `{"model":"e","input":[]}`, `{"model":"e","input":5}`,
		`{"model":"e","input":["a",1]}`, `{"model":"e","input":[[1],[]]}`, `{"model":"e","input":[{"a":1}]}`,
		`{"model":"e","input":[` + strings.Repeat(`"a",`, MaxInputs) + `"a"]}`,
	} {
		_, err := ParseAs([]byte(body), 0, Embedding)
		var pe *ParamError
		if !errors.As(err, &pe) || pe.Param != "input" || BodyError(err).Status != http.StatusBadRequest {
			t.Errorf("%.60s: %v, want a 400 on input", body, err)
		}
	}
	if _, err := ParseAs([]byte(`{"model":"e","input":[1,`), 0, Embedding); !errors.Is(err, ErrMalformed) {
		t.Errorf("truncated: %v", err)
	}
}

// TestParseResponse reads a Response's instructions and input as the
// messages of a chat, and its max_output_tokens.
func TestParseResponse(t *testing.T) {
	b, err := ParseAs([]byte(`{"model":"r","instructions":"Be brief.","input":"hello","max_output_tokens":9,"stream":true}`), 0, Response)
	if err != nil {
		t.Fatal(err)
	}
	want := []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "hello"}}
	if b.Kind != Response || !b.Stream || b.MaxTokens != 9 || !slices.EqualFunc(b.Messages, want, func(a, b Message) bool { return a.Role == b.Role && a.Content == b.Content }) {
		t.Errorf("got %+v", b)
	}
	b, err = ParseAs([]byte(`{"model":"r","input":[{"role":"user","content":[{"type":"input_text","text":"a long question"}]},{"type":"function_call_output","call_id":"c","output":"42"}]}`), 0, Response)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Messages) != 2 || b.Messages[0].Parts[0].Text != "a long question" || b.Messages[1].Role != "function_call_output" || b.Messages[1].Content != "42" {
		t.Errorf("got %+v", b.Messages)
	}
	// The prompt text hashes input_text parts as text, as a chat's.
	chat, _ := Parse([]byte(`{"model":"r","messages":[{"role":"user","content":[{"type":"text","text":"a long question"}]},{"role":"function_call_output","content":"42"}]}`), 0)
	if got, want := string(AppendPromptText(nil, b)), string(AppendPromptText(nil, chat)); got != want {
		t.Errorf("prompt text %q, want the chat's %q", got, want)
	}
	for _, body := range []string{`{"model":"r"}`, `{"model":"r","input":5}`, `{"model":"r","input":[5]}`} {
		var pe *ParamError
		if _, err := ParseAs([]byte(body), 0, Response); !errors.As(err, &pe) || pe.Param != "input" {
			t.Errorf("%s: %v, want an error on input", body, err)
		}
	}
	p, err := ValidateParsed([]byte(`{"model":"r","input":"x","max_output_tokens":12}`), b)
	if err != nil || p.MaxTokens != 12 {
		t.Errorf("validate: %+v %v", p, err)
	}
	if _, err := Validate([]byte(`{"model":"r","input":"x","max_output_tokens":0}`)); err == nil {
		t.Error("max_output_tokens 0 accepted")
	}
}

// TestRequestID keeps a caller's id only when it is one valid value.
func TestRequestID(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		keep bool
	}{
		{[]string{"abc-123_X.y:z"}, true},
		{[]string{strings.Repeat("a", MaxIDLen)}, true},
		{[]string{strings.Repeat("a", MaxIDLen+1)}, false},
		{[]string{""}, false},
		{[]string{"a b"}, false},
		{[]string{"a\nlevel=ERROR"}, false},
		{[]string{`a"`}, false},
		{[]string{"a", "b"}, false},
		{nil, false},
	} {
		in, out := http.Header{}, http.Header{}
		if tc.in != nil {
			in[HeaderID] = tc.in
		}
		var id ID
		got := id.Use(in, out)
		if tc.keep && got != tc.in[0] || !tc.keep && (len(got) != IDLen || !strings.HasPrefix(got, "req_") || !ValidID(got)) {
			t.Errorf("%q: id %q", tc.in, got)
		}
		if in.Get(HeaderID) != got || out.Get(HeaderID) != got || len(in[HeaderID]) != 1 {
			t.Errorf("%q: headers %v %v, want %q in both", tc.in, in, out, got)
		}
	}
	var a, b ID
	if a.Use(http.Header{}, http.Header{}) == b.Use(http.Header{}, http.Header{}) {
		t.Error("two generated ids are equal")
	}
}
