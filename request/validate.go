package request

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// ErrInvalidParam is wrapped by every *ParamError.
var ErrInvalidParam = errors.New("invalid parameter")

// ParamError is a request parameter of the wrong type or out of range.
// Param names it as OpenAI's errors do ("max_tokens",
// "stream_options.include_usage").
type ParamError struct {
	Param string
	// Code is OpenAI's: invalid_type or invalid_value.
	Code    string
	Message string
}

func (e *ParamError) Error() string { return e.Message }
func (e *ParamError) Unwrap() error { return ErrInvalidParam }

// Limits of the parameters Validate checks. MaxOutputTokens is far above
// any model's context window: it only keeps the token estimates that
// rate limits charge at admission in range.
const (
	MaxOutputTokens = 1 << 24
	MaxChoices      = 128 // n, best_of
	MaxTopLogprobs  = 20
	MaxStop         = 4
)

// Params are what Validate reads from a body besides what Parse reads.
// Absent and null fields are zero, except N, which defaults to 1.
type Params struct {
	// MaxTokens is max_completion_tokens, or max_tokens when it is
	// absent, or a Response's max_output_tokens.
	MaxTokens int64
	N         int64
	Stream    bool
	// StreamOptions: the body has a non-null "stream_options".
	StreamOptions bool
	// IncludeUsage and ContinuousUsage are stream_options.include_usage
	// and vLLM's stream_options.continuous_usage_stats.
	IncludeUsage, ContinuousUsage bool
}

// Validate checks the types and ranges of an OpenAI completion or chat
// body's sampling and streaming parameters, the way the OpenAI API does,
// so that a request the model server would refuse is refused before it is
// admitted and charged. As in Parse, the last of duplicated keys wins:
// what Validate reads is what a model server reads. It does not check the
// model or the prompt (Parse does). A refused body returns a *ParamError,
// or an error wrapping ErrMalformed when it is not a JSON object.
func Validate(data []byte) (Params, error) {
	return validate(data, nil)
}

// ValidateParsed is Validate for data that b was parsed from (Parse,
// Read, ReadSized): it steps over the prompt's value, which Parse has
// already read, instead of scanning it again. For other data it is
// Validate.
func ValidateParsed(data []byte, b *Body) (Params, error) {
	if b == nil || b.parsed != len(data) {
		b = nil
	}
	return validate(data, b)
}

func validate(data []byte, parsed *Body) (Params, error) {
	v := validator{s: scanner{b: data}, p: Params{N: 1}}
	if v.s.peek() != '{' {
		return Params{}, malformed(v.s.errorf("want a JSON object"))
	}
	var maxTokens, maxCompletion, maxOutput int64
	err := v.s.object(func(key []byte) error {
		if v.s.peek() == 0 {
			return v.s.errorf("unexpected end of input")
		}
		// A switch on string(key) does not allocate; the cases name
		// their parameter with a constant for the same reason.
		switch string(key) {
		case "max_tokens":
			return v.integer("max_tokens", 1, MaxOutputTokens, &maxTokens)
		case "max_completion_tokens":
			return v.integer("max_completion_tokens", 1, MaxOutputTokens, &maxCompletion)
		case "max_output_tokens": // /v1/responses
			return v.integer("max_output_tokens", 1, MaxOutputTokens, &maxOutput)
		case "n":
			return v.choices("n", &v.p.N)
		case "best_of":
			var n int64
			return v.choices("best_of", &n)
		case "temperature":
			return v.float("temperature", 0, 2)
		case "top_p":
			return v.float("top_p", 0, 1)
		case "presence_penalty":
			return v.float("presence_penalty", -2, 2)
		case "frequency_penalty":
			return v.float("frequency_penalty", -2, 2)
		case "seed":
			var seed int64
			return v.integer("seed", math.MinInt64, math.MaxInt64, &seed)
		case "top_logprobs":
			var n int64
			return v.integer("top_logprobs", 0, MaxTopLogprobs, &n)
		case "logprobs":
			// A boolean in chat, an integer in completions.
			if c := v.s.peek(); c == 't' || c == 'f' {
				_, err := v.s.boolean()
				return err
			}
			var n int64
			return v.integer("logprobs", 0, MaxTopLogprobs, &n)
		case "stream":
			b, err := v.boolean("stream")
			v.p.Stream = b
			return err
		case "stop":
			return v.stop()
		case "user":
			return v.str("user", "a string")
		case "stream_options":
			return v.streamOptions()
		}
		if parsed != nil {
			for _, r := range parsed.prompts[:parsed.nprompts] {
				if r[0] == v.s.i {
					v.s.i = r[1] // read by Parse: well-formed
					return nil
				}
			}
		}
		return v.s.skip()
	})
	if err != nil {
		var pe *ParamError
		if errors.As(err, &pe) {
			return Params{}, pe
		}
		return Params{}, malformed(err)
	}
	if v.s.peek() != 0 || v.s.i < len(v.s.b) {
		return Params{}, malformed(v.s.errorf("trailing data after the JSON object"))
	}
	v.p.MaxTokens = maxTokens
	if maxCompletion > 0 {
		v.p.MaxTokens = maxCompletion
	}
	if maxOutput > 0 {
		v.p.MaxTokens = maxOutput
	}
	if v.p.StreamOptions && !v.p.Stream {
		return Params{}, &ParamError{Param: "stream_options", Code: "invalid_value",
			Message: `"stream_options" is only allowed when "stream" is true`}
	}
	return v.p, nil
}

type validator struct {
	s scanner
	p Params
}

func typeError(param, want string) *ParamError {
	return &ParamError{Param: param, Code: "invalid_type", Message: fmt.Sprintf("invalid type for %q: expected %s", param, want)}
}

// choices reads n or best_of: 1 to MaxChoices, 0 meaning 1.
func (v *validator) choices(name string, out *int64) error {
	n := int64(0)
	if err := v.integer(name, 1, MaxChoices, &n); err != nil {
		return err
	}
	*out = max(n, 1)
	return nil
}

// number reads a JSON number, returning its text, or null, returning nil;
// any other value is a type error for param, which expects want.
func (v *validator) number(param, want string) ([]byte, error) {
	s := &v.s
	switch c := s.peek(); {
	case c == 'n':
		return nil, s.literal("null")
	case c != '-' && (c < '0' || c > '9'):
		return nil, typeError(param, want)
	}
	return s.number()
}

// integer reads an integer in [lo, hi] or null (which leaves *dst 0).
func (v *validator) integer(param string, lo, hi int64, dst *int64) error {
	num, err := v.number(param, "an integer")
	if err != nil {
		return err
	}
	if num == nil {
		*dst = 0
		return nil
	}
	n, err := strconv.ParseInt(string(num), 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return &ParamError{Param: param, Code: "invalid_value", Message: fmt.Sprintf("%q must be between %d and %d, got %s", param, lo, hi, num)}
		}
		return typeError(param, "an integer")
	}
	if n < lo || n > hi {
		return &ParamError{Param: param, Code: "invalid_value", Message: fmt.Sprintf("%q must be between %d and %d, got %d", param, lo, hi, n)}
	}
	*dst = n
	return nil
}

// float reads a number in [lo, hi] or null.
func (v *validator) float(param string, lo, hi float64) error {
	num, err := v.number(param, "a number")
	if err != nil || num == nil {
		return err
	}
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil || f < lo || f > hi {
		return &ParamError{Param: param, Code: "invalid_value", Message: fmt.Sprintf("%q must be between %g and %g, got %s", param, lo, hi, num)}
	}
	return nil
}

func (v *validator) boolean(param string) (bool, error) {
	s := &v.s
	switch s.peek() {
	case 'n':
		return false, s.literal("null")
	case 't', 'f':
		return s.boolean()
	}
	return false, typeError(param, "a boolean")
}

// str reads a string or null; any other value is a type error for param,
// which expects want.
func (v *validator) str(param, want string) error {
	s := &v.s
	switch s.peek() {
	case 'n':
		return s.literal("null")
	case '"':
		return s.skipString()
	}
	return typeError(param, want)
}

// stop reads stop: a string, an array of at most MaxStop strings, or null.
func (v *validator) stop() error {
	const want = "a string or an array of strings"
	s := &v.s
	if s.peek() != '[' {
		return v.str("stop", want)
	}
	n := 0
	return s.array(func() error {
		if n++; n > MaxStop {
			return &ParamError{Param: "stop", Code: "invalid_value", Message: fmt.Sprintf(`"stop" takes at most %d sequences`, MaxStop)}
		}
		if s.peek() != '"' {
			return typeError("stop", want)
		}
		return s.skipString()
	})
}

func (v *validator) streamOptions() error {
	s := &v.s
	v.p.StreamOptions, v.p.IncludeUsage, v.p.ContinuousUsage = false, false, false
	switch s.peek() {
	case 'n':
		return s.literal("null")
	case '{':
	default:
		return typeError("stream_options", "an object")
	}
	v.p.StreamOptions = true
	return s.object(func(key []byte) error {
		switch string(key) {
		case "include_usage":
			b, err := v.boolean("stream_options.include_usage")
			v.p.IncludeUsage = b
			return err
		case "continuous_usage_stats":
			b, err := v.boolean("stream_options.continuous_usage_stats")
			v.p.ContinuousUsage = b
			return err
		}
		return s.skip()
	})
}

// EstimateCharge is the token estimate rate limits charge at admission:
// the prompt plus n times the output allowance, saturating at MaxInt64
// (the operands are caller-supplied).
func EstimateCharge(prompt, maxTokens, n int64) int64 {
	out, overflow := mulSat(maxTokens, max(n, 1))
	if overflow || prompt > math.MaxInt64-out {
		return math.MaxInt64
	}
	return prompt + out
}

func mulSat(a, b int64) (int64, bool) {
	if a <= 0 || b <= 0 {
		return 0, false
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64, true
	}
	return a * b, false
}
