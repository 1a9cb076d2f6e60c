package request

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	cases := []struct {
		name, body string
		param      string // "" = accepted
		want       Params
	}{
		{"plain", `{"model":"m","prompt":"x"}`, "", Params{N: 1}},
		{"max_tokens", `{"max_tokens":5,"n":2}`, "", Params{MaxTokens: 5, N: 2}},
		{"max_completion_tokens wins", `{"max_tokens":5,"max_completion_tokens":7}`, "", Params{MaxTokens: 7, N: 1}},
		{"null max_tokens", `{"max_tokens":null}`, "", Params{N: 1}},
		{"max_tokens string", `{"max_tokens":"5"}`, "max_tokens", Params{}},
		{"max_tokens fraction", `{"max_tokens":1.5}`, "max_tokens", Params{}},
		{"max_tokens negative", `{"max_tokens":-5}`, "max_tokens", Params{}},
		{"max_tokens zero", `{"max_tokens":0}`, "max_tokens", Params{}},
		{"max_tokens 2^63-1", `{"max_tokens":9223372036854775807}`, "max_tokens", Params{}},
		{"max_tokens beyond int64", `{"max_tokens":99999999999999999999999}`, "max_tokens", Params{}},
		{"max_completion_tokens huge", `{"max_completion_tokens":16777217}`, "max_completion_tokens", Params{}},
		{"n 1000", `{"n":1000}`, "n", Params{}},
		{"n string", `{"n":"2"}`, "n", Params{}},
		{"best_of 0", `{"best_of":0}`, "best_of", Params{}},
		{"temperature 3", `{"temperature":3}`, "temperature", Params{}},
		{"temperature string", `{"temperature":"hot"}`, "temperature", Params{}},
		{"top_p 1.5", `{"top_p":1.5}`, "top_p", Params{}},
		{"presence_penalty -3", `{"presence_penalty":-3}`, "presence_penalty", Params{}},
		{"top_logprobs 21", `{"top_logprobs":21}`, "top_logprobs", Params{}},
		{"logprobs bool", `{"logprobs":true}`, "", Params{N: 1}},
		{"seed float", `{"seed":1.5}`, "seed", Params{}},
		{"stop five", `{"stop":["a","b","c","d","e"]}`, "stop", Params{}},
		{"stop number", `{"stop":5}`, "stop", Params{}},
		{"user number", `{"user":5}`, "user", Params{}},
		{"stream string", `{"stream":"yes"}`, "stream", Params{}},
		{"stream_options spaced", `{"stream":true,"stream_options" : { "include_usage" : true }}`, "", Params{N: 1, Stream: true, StreamOptions: true, IncludeUsage: true}},
		{"decoy nested include_usage", `{"stream":true,"x":{"include_usage":true}}`, "", Params{N: 1, Stream: true}},
		{"repeated stream_options: last wins", `{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"include_usage":false}}`, "",
			Params{N: 1, Stream: true, StreamOptions: true}},
		{"stream_options without stream", `{"stream_options":{"include_usage":true}}`, "stream_options", Params{}},
		{"stream_options not an object", `{"stream":true,"stream_options":true}`, "stream_options", Params{}},
		{"include_usage string", `{"stream":true,"stream_options":{"include_usage":"true"}}`, "stream_options.include_usage", Params{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Validate([]byte(tc.body))
			if tc.param == "" {
				if err != nil {
					t.Fatal(err)
				}
				if p != tc.want {
					t.Fatalf("Validate = %+v, want %+v", p, tc.want)
				}
				return
			}
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Param != tc.param || !errors.Is(err, ErrInvalidParam) {
				t.Fatalf("Validate error %v, want a ParamError for %q", err, tc.param)
			}
			e := BodyError(err)
			if e.Status != 400 || e.Param != tc.param || e.Type != "invalid_request_error" {
				t.Fatalf("BodyError = %+v", e)
			}
		})
	}
	if _, err := Validate([]byte(`{"max_tokens":`)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated body: %v, want ErrMalformed", err)
	}
}

func TestEstimateChargeSaturates(t *testing.T) {
	for _, tc := range []struct{ prompt, max, n, want int64 }{
		{10, 5, 2, 20},
		{10, 0, 3, 10},
		{math.MaxInt64, 1, 1, math.MaxInt64},
		{1, math.MaxInt64, 1, math.MaxInt64},
		{1, math.MaxInt64 / 2, 3, math.MaxInt64},
		{0, MaxOutputTokens, MaxChoices, MaxOutputTokens * MaxChoices},
	} {
		if got := EstimateCharge(tc.prompt, tc.max, tc.n); got != tc.want {
			t.Errorf("EstimateCharge(%d, %d, %d) = %d, want %d", tc.prompt, tc.max, tc.n, got, tc.want)
		}
	}
}

// FuzzValidate checks Validate against encoding/json: it never panics,
// accepts only valid JSON objects, and an accepted body's limits are
// integers in range, as encoding/json reads them (last key wins), and its
// charge estimate never wraps.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"x","max_tokens":5,"n":2,"temperature":0.5,"top_p":1}`,
		`{"max_tokens":9223372036854775807}`,
		`{"max_tokens":"5"}`,
		`{"max_tokens":1.5,"n":1000}`,
		`{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"include_usage":false}}`,
		`{"stream":true,"x":{"include_usage":true}}`,
		`{"stop":["a","b"],"logprobs":3,"seed":-1,"user":"u"}`,
		`{"max_completion_tokens":null,"max_tokens":16777216,"n":128}`,
		`[]`,
	} {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"messages":5,"messages":[],"n":3,"stream":true}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Validate(data)
		if b, perr := Parse(data, 0); perr == nil {
			// Stepping over what Parse read changes nothing.
			p2, err2 := ValidateParsed(data, b)
			if p2 != p || fmt.Sprint(err2) != fmt.Sprint(err) {
				t.Fatalf("ValidateParsed = %+v, %v; Validate = %+v, %v for %q", p2, err2, p, err, data)
			}
		}
		if err != nil {
			return
		}
		if !json.Valid(data) {
			t.Fatalf("Validate accepts invalid JSON %q", data)
		}
		if p.MaxTokens < 0 || p.MaxTokens > MaxOutputTokens || p.N < 1 || p.N > MaxChoices {
			t.Fatalf("accepted out of range: %+v for %q", p, data)
		}
		if e := EstimateCharge(int64(len(data)), p.MaxTokens, p.N); e < 0 {
			t.Fatalf("estimate wrapped: %d", e)
		}
		// Keys match exactly, as in vLLM's server (encoding/json's struct
		// decoding would fold case): decode into maps.
		var top map[string]json.RawMessage
		if json.Unmarshal(data, &top) != nil {
			return
		}
		num := func(raw json.RawMessage) *float64 {
			var f *float64
			if json.Unmarshal(raw, &f) != nil {
				return nil
			}
			return f
		}
		want := num(top["max_tokens"])
		if raw, ok := top["max_completion_tokens"]; ok && num(raw) != nil {
			want = num(raw)
		}
		if want != nil && float64(p.MaxTokens) != *want {
			t.Fatalf("MaxTokens %d, encoding/json reads %v in %q", p.MaxTokens, *want, data)
		}
		var opts map[string]json.RawMessage
		json.Unmarshal(top["stream_options"], &opts)
		got := string(opts["include_usage"]) == "true"
		if got != p.IncludeUsage {
			t.Fatalf("IncludeUsage %v, encoding/json reads %v in %q", p.IncludeUsage, got, data)
		}
	})
}

// ValidateParsed steps over the prompt values Parse read and otherwise
// reads what Validate reads: parameters before, between and after the
// prompt, repeated prompt keys (more than it records), and data that is
// not what the body was parsed from.
func TestValidateParsed(t *testing.T) {
	long := strings.Repeat(`caf\u00e9 \"x\" `, 500)
	cases := []string{
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"` + long + `"}],"n":2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[],"prompt":"` + long + `","temperature":3}`,
		`{"model":"m","messages":[{"role":"user","content":"a"}],"messages":5,"messages":[{"role":"user","content":"b"}],"top_p":0.5,"messages":[],"max_tokens":"x"}`,
		`{"model":"m","prompt":[1,2,3],"seed":1.5}`,
		`{"model":"m","prompt":{"x":[1,{"y":"z"}]},"stop":["a","b","c","d","e"],"messages":[{"role":"user","content":[{"type":"text","text":"` + long + `"}]}]}`,
	}
	for i, body := range cases {
		data := []byte(body)
		b, err := Parse(data, 0)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if b.nprompts == 0 {
			t.Fatalf("case %d: no prompt range recorded", i)
		}
		want, werr := Validate(data)
		got, gerr := ValidateParsed(data, b)
		if got != want || fmt.Sprint(gerr) != fmt.Sprint(werr) {
			t.Fatalf("case %d: ValidateParsed = %+v, %v; Validate = %+v, %v", i, got, gerr, want, werr)
		}
		b.Release()
		if got, gerr := ValidateParsed(data, b); got != want || fmt.Sprint(gerr) != fmt.Sprint(werr) {
			t.Fatalf("case %d after Release: %+v, %v", i, got, gerr)
		}
		// Other data than the body's: read whole.
		other := []byte(`{"model":"m","prompt":"x","n":1000}`)
		if _, err := ValidateParsed(other, b); err == nil {
			t.Fatalf("case %d: another body's n=1000 accepted", i)
		}
	}
}
