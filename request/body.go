// Package request reads what routing needs from an OpenAI-style inference
// request body, and turns a prompt into prefix-block hashes.
//
// Both tiers use it: Tier-2 to estimate tokens and to steer a prompt toward
// the cluster that has its prefix cached, Tier-1 to pick the pod. It decides
// nothing about where a request goes; it only extracts the model, the
// stream flag, the cache salt and the prompt (completions text, token ids,
// or chat messages in order) in one pass over the body, with errors a
// caller can classify with errors.Is: ErrTooLarge, ErrMalformed,
// ErrMissingModel, ErrPromptType.
//
// Keys match exactly (vLLM's server is case-sensitive) and, as in most JSON
// readers, the last of duplicated keys wins.
package request

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// DefaultMaxBytes is the body size limit used when none is given.
const DefaultMaxBytes = 4 << 20

// Errors returned by Parse and Read. Each is wrapped with detail.
var (
	// ErrTooLarge: the body is longer than the limit.
	ErrTooLarge = errors.New("request body too large")
	// ErrMalformed: the body is not a JSON object.
	ErrMalformed = errors.New("malformed JSON body")
	// ErrMissingModel: the body has no non-empty "model" string.
	ErrMissingModel = errors.New(`missing "model"`)
	// ErrPromptType: "prompt", "messages" or a message's content has a type
	// routing cannot read, or the body has neither prompt nor messages.
	ErrPromptType = errors.New("unsupported prompt")
)

// Kind says which API a body belongs to.
type Kind uint8

const (
	// Completion is /v1/completions: a "prompt".
	Completion Kind = iota + 1
	// Chat is /v1/chat/completions: "messages".
	Chat
	// Embedding is /v1/embeddings: an "input" of a string, strings, token
	// ids or arrays of token ids. It generates no output tokens.
	Embedding
	// Response is /v1/responses: "instructions" and an "input" of a string
	// or of items (messages), read as a chat's messages.
	Response
)

func (k Kind) String() string {
	switch k {
	case Completion:
		return "completion"
	case Chat:
		return "chat"
	case Embedding:
		return "embedding"
	case Response:
		return "response"
	}
	return "unknown"
}

// KindOf is the Kind of the OpenAI endpoint at path (a query is ignored),
// or 0 for a path that is none of the four.
func KindOf(path string) Kind {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch path {
	case "/v1/chat/completions":
		return Chat
	case "/v1/completions":
		return Completion
	case "/v1/embeddings":
		return Embedding
	case "/v1/responses":
		return Response
	}
	return 0
}

// MaxInputs bounds the strings or token arrays of one embeddings "input"
// (OpenAI's limit): each is an item of the batch the pod runs.
const MaxInputs = 2048

// Body is what routing reads from a request body. Strings are copies; a
// Body does not alias the bytes it was parsed from.
type Body struct {
	Model  string
	Stream bool
	Kind   Kind
	// CacheSalt is vLLM's "cache_salt": requests with different salts never
	// share cached prefixes, so it seeds the prefix hashes.
	CacheSalt string
	// Prompt is a completion's text prompt.
	Prompt string
	// TokenIDs is a completion's prompt when given as token ids.
	TokenIDs []int64
	// Messages are a chat's messages in order; for a Response, its
	// instructions (as a "system" message) and then its input (a string
	// as one "user" message, items in order).
	Messages []Message
	// Inputs is an Embedding's input when it is an array of strings (a
	// single string is Prompt; token ids, one array or several, are
	// TokenIDs, joined).
	Inputs []string
	// MaxTokens is "max_tokens" (or "max_completion_tokens", or a
	// Response's "max_output_tokens"): the most output tokens the caller
	// allows; 0 when absent or not a positive integer. Rate limits charge
	// it at admission.
	MaxTokens int

	// parsed is the length of the body parsed, and prompts the byte ranges
	// of its first prompt values ("prompt", "messages"), each well-formed
	// JSON: ValidateParsed steps over them.
	parsed   int
	prompts  [2][2]int
	nprompts int

	// arena is the pooled buffer Prompt's and Messages' strings share,
	// which Release returns; nil for a Body that Parse did not make or
	// that was released.
	arena *[]byte
}

// Release ends the body's use of its prompt: Prompt and Messages become
// empty, and the buffer their strings shared is reused by a later Parse.
// Model, CacheSalt and every other field stay valid. Call it when the
// prompt is no longer needed (once the request is scheduled), and never
// while a string taken from Prompt or Messages is still in use: such a
// string would change under its holder. Release is optional (an
// unreleased body is collected as usual), idempotent, and a no-op on nil.
func (b *Body) Release() {
	if b == nil {
		return
	}
	b.Prompt, b.Messages, b.Inputs = "", nil, nil
	if b.arena != nil {
		putArena(b.arena)
		b.arena = nil
	}
}

// Message is one chat message.
type Message struct {
	Role string
	// Content is the message's content when it was a string.
	Content string
	// Parts is the content when it was an array of parts; nil when it was a
	// string, null or absent, non-nil (possibly empty) when an array.
	Parts []Part
}

// Part is one element of a message's content array.
type Part struct {
	Type     string // "text", "image_url", ...
	Text     string
	ImageURL string // image_url.url
}

// Read reads a body of at most maxBytes bytes (DefaultMaxBytes when
// maxBytes ≤ 0) from r and parses it.
func Read(r io.Reader, maxBytes int64) (*Body, []byte, error) {
	return readAs(r, maxBytes, 0)
}

func readAs(r io.Reader, maxBytes int64, kind Kind) (*Body, []byte, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	data, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("request: reading body: %w", err)
	}
	if int64(len(data)) > maxBytes {
		return nil, nil, fmt.Errorf("request: %w: more than %d bytes", ErrTooLarge, maxBytes)
	}
	b, err := parse(data, maxBytes, nil, kind)
	return b, data, err
}

// ReadSized is Read for a body that announces its length (an HTTP
// Content-Length; ≤ 0 when unknown): a body of that length within the
// limit is read into a buffer that grows to its size, four times over
// from sizedStart (a 220 KB body moves once), without the many copies of
// an unsized one. The buffer is never larger than four times what arrived
// (and sizedStart): an announced length alone, whose body never comes,
// holds little.
func ReadSized(r io.Reader, size, maxBytes int64) (*Body, []byte, error) {
	return ReadSizedAs(r, size, maxBytes, 0)
}

// ReadSizedAs is ReadSized for a body of the endpoint of kind (KindOf):
// an Embedding's or a Response's prompt is its "input" (and a Response's
// "instructions"), and "prompt" and "messages" are not read. Kind 0,
// Chat or Completion read a body as ReadSized does: its kind is Chat
// when it has "messages", else Completion.
func ReadSizedAs(r io.Reader, size, maxBytes int64, kind Kind) (*Body, []byte, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if size > maxBytes { // announced too long: refused unread
		return nil, nil, fmt.Errorf("request: %w: %d bytes announced, limit %d", ErrTooLarge, size, maxBytes)
	}
	if size <= 0 {
		return readAs(r, maxBytes, kind)
	}
	data := make([]byte, 0, min(size, sizedStart))
	for int64(len(data)) < size {
		if len(data) == cap(data) {
			grown := make([]byte, len(data), min(size, 4*int64(cap(data))))
			copy(grown, data)
			data = grown
		}
		n, err := io.ReadFull(r, data[len(data):cap(data)])
		data = data[:len(data)+n]
		if err != nil {
			return nil, nil, fmt.Errorf("request: reading body: %w", err)
		}
	}
	var one [1]byte
	if n, _ := r.Read(one[:]); n > 0 {
		// Longer than announced: read the rest as Read does.
		rest, err := io.ReadAll(io.LimitReader(r, maxBytes-size))
		if err != nil {
			return nil, nil, fmt.Errorf("request: reading body: %w", err)
		}
		data = append(append(data, one[0]), rest...)
		if int64(len(data)) > maxBytes {
			return nil, nil, fmt.Errorf("request: %w: more than %d bytes", ErrTooLarge, maxBytes)
		}
	}
	b, err := parse(data, maxBytes, nil, kind)
	return b, data, err
}

// sizedStart is the buffer ReadSized starts with.
const sizedStart = 64 << 10

// Parse reads a body of at most maxBytes bytes (DefaultMaxBytes when
// maxBytes ≤ 0).
func Parse(data []byte, maxBytes int64) (*Body, error) { return parse(data, maxBytes, nil, 0) }

// ParseAs is Parse for a body of the endpoint of kind (ReadSizedAs).
func ParseAs(data []byte, maxBytes int64, kind Kind) (*Body, error) {
	return parse(data, maxBytes, nil, kind)
}

// parse is Parse, taking the strings pre decoded ahead (nil: none), for a
// body of kind (0: Chat or Completion, by its fields).
func parse(data []byte, maxBytes int64, pre *Prescan, kind Kind) (*Body, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if int64(len(data)) > maxBytes {
		return nil, fmt.Errorf("request: %w: %d bytes, limit %d", ErrTooLarge, len(data), maxBytes)
	}
	// One allocation for the Body and its first messages, and one for the
	// bytes of every string it keeps unless a released body's can be
	// reused.
	pb := new(parsedBody)
	arena := getArena(len(data))
	p := parser{s: scanner{b: data, pre: pre}, out: &pb.Body, msgs: pb.msgs[:0], arena: (*arena)[:0]}
	if kind == Embedding || kind == Response {
		p.input = kind
	}
	if err := p.body(); err != nil {
		return nil, err
	}
	pb.parsed = len(data)
	// The strings that outlive Release move out of the arena.
	pb.Model = pb.keep(pb.Model)
	pb.CacheSalt = pb.keep(pb.CacheSalt)
	if cap(p.arena) == cap(*arena) {
		// (Decoding never moved the arena: the rare string that decodes
		// longer than its JSON can, and then the strings are in two
		// buffers and neither is reused.)
		pb.arena = arena
	}
	return &pb.Body, nil
}

// inlineMessages is how many messages a parsed Body holds without another
// allocation.
const inlineMessages = 8

// parsedBody is a Body and the backing array of its first messages,
// allocated together.
type parsedBody struct {
	Body
	msgs [inlineMessages]Message
	// kept holds the model and cache salt (keep) when they fit.
	kept  [keptBytes]byte
	nkept int
}

// keptBytes is room for a model name and a cache salt of usual lengths in
// the parsed Body itself.
const keptBytes = 96

// keep returns a copy of s that does not share the arena: in pb.kept when
// it fits, else a string of its own.
func (pb *parsedBody) keep(s string) string {
	if s == "" {
		return ""
	}
	if len(s) > len(pb.kept)-pb.nkept {
		return strings.Clone(s)
	}
	n := copy(pb.kept[pb.nkept:], s)
	v := unsafe.String(&pb.kept[pb.nkept], n)
	pb.nkept += n
	return v
}

// Arenas of released bodies, by size class: class k holds buffers of
// 1 KiB << k bytes. A body longer than the largest class gets a buffer of
// its own that is never pooled.
const (
	minArenaShift = 10
	arenaClasses  = 11 // 1 KiB … 1 MiB
)

var arenas [arenaClasses]sync.Pool // *[]byte

// arenaClass is the smallest class whose buffers hold n bytes, or −1.
func arenaClass(n int) int {
	k := 0
	if n > 1<<minArenaShift {
		k = bits.Len(uint(n-1)) - minArenaShift
	}
	if k >= arenaClasses {
		return -1
	}
	return k
}

// GetBuffer returns an empty buffer with room for at least n bytes, from
// the pool Parse's arenas come from: a buffer PutBuffer returned, which
// still holds its last user's bytes past its length (append over it; never
// read past what was written). Tier-2's event loops read request bodies
// into them.
func GetBuffer(n int) *[]byte { return getArena(n) }

// PutBuffer returns a buffer from GetBuffer for reuse. Its holder must
// keep no slice of it: the next GetBuffer hands it out again. A buffer of
// no pooled size is left to the collector.
func PutBuffer(b *[]byte) { putArena(b) }

// getArena returns a buffer of at least n bytes for Parse.
func getArena(n int) *[]byte {
	k := arenaClass(n)
	if k < 0 {
		b := make([]byte, 0, n)
		return &b
	}
	if v, ok := arenas[k].Get().(*[]byte); ok {
		return v
	}
	b := make([]byte, 0, 1<<(minArenaShift+k))
	return &b
}

// putArena returns a released body's buffer to its class.
func putArena(b *[]byte) {
	if k := arenaClass(cap(*b)); k >= 0 && cap(*b) == 1<<(minArenaShift+k) {
		*b = (*b)[:0]
		arenas[k].Put(b)
	}
}

type parser struct {
	s   scanner
	out *Body
	// msgs is the backing array for out.Messages.
	msgs []Message
	// arena holds the bytes of every string out keeps. It is only ever
	// appended to, so that a string made from it never changes: when an
	// append moves it, the strings made so far keep the old array.
	arena []byte

	// Which prompt fields were present and their type errors, reported
	// only for the field that decides the kind (messages over prompt).
	hasPrompt, hasMsgs bool
	promptErr, msgErr  error
	hasModel           bool

	// input is the kind whose "input" holds the prompt (Embedding or
	// Response), or 0: then "input" and "instructions" are not read.
	input           Kind
	hasInput        bool
	inputErr        error
	instructions    string
	hasInstructions bool
	inputMsgs       []Message // a Response's input
}

// scanned records that the value from start to the cursor is well-formed
// JSON (the prompt's, the bulk of a body), for ValidateParsed to step over.
func (p *parser) scanned(start int) {
	if n := p.out.nprompts; n < len(p.out.prompts) && p.s.i > start {
		p.out.prompts[n] = [2]int{start, p.s.i}
		p.out.nprompts++
	}
}

func malformed(err error) error {
	return fmt.Errorf("request: %w: %w", ErrMalformed, err)
}

func (p *parser) body() error {
	s := &p.s
	if s.peek() != '{' {
		return malformed(s.errorf("want a JSON object"))
	}
	err := s.object(func(key []byte) error {
		switch string(key) {
		case "model":
			if s.peek() != '"' {
				if err := s.skip(); err != nil {
					return err
				}
				p.out.Model, p.hasModel = "", true
				return nil
			}
			v, err := p.string()
			p.out.Model, p.hasModel = v, true
			return err
		case "stream":
			if s.peek() == 'n' {
				p.out.Stream = false
				return s.literal("null")
			}
			v, err := s.boolean()
			if err != nil {
				return fmt.Errorf(`%w ("stream" must be true or false)`, err)
			}
			p.out.Stream = v
			return nil
		case "cache_salt":
			if s.peek() != '"' {
				p.out.CacheSalt = ""
				return s.skip()
			}
			v, err := p.string()
			p.out.CacheSalt = v
			return err
		case "max_tokens", "max_completion_tokens":
			start := s.i
			if err := s.skip(); err != nil {
				return err
			}
			if n, err := strconv.Atoi(strings.TrimSpace(string(s.b[start:s.i]))); err == nil && n > 0 {
				p.out.MaxTokens = n
			}
			return nil
		case "max_output_tokens":
			if p.input != Response {
				return s.skip()
			}
			start := s.i
			if err := s.skip(); err != nil {
				return err
			}
			if n, err := strconv.Atoi(strings.TrimSpace(string(s.b[start:s.i]))); err == nil && n > 0 {
				p.out.MaxTokens = n
			}
			return nil
		case "input":
			if p.input == 0 {
				return s.skip()
			}
			p.hasInput = true
			p.out.Prompt, p.out.TokenIDs, p.out.Inputs, p.inputMsgs = "", nil, nil, nil
			start := s.i
			if p.input == Embedding {
				p.inputErr = p.field(p.embeddingInput)
			} else {
				p.inputErr = p.field(p.responseInput)
			}
			p.scanned(start)
			return p.syntaxOnly(p.inputErr)
		case "instructions":
			if p.input != Response {
				return s.skip()
			}
			p.hasInstructions = s.peek() == '"'
			if !p.hasInstructions {
				p.instructions = ""
				return s.skip()
			}
			v, err := p.string()
			p.instructions = v
			return err
		case "prompt":
			if p.input != 0 {
				return s.skip()
			}
			p.hasPrompt = true
			p.out.Prompt, p.out.TokenIDs = "", nil
			start := s.i
			p.promptErr = p.field(p.prompt)
			p.scanned(start)
			return p.syntaxOnly(p.promptErr)
		case "messages":
			if p.input != 0 {
				return s.skip()
			}
			p.hasMsgs = true
			p.out.Messages = nil
			start := s.i
			p.msgErr = p.field(p.messages)
			p.scanned(start)
			return p.syntaxOnly(p.msgErr)
		}
		return s.skip()
	})
	if err != nil {
		return malformed(err)
	}
	if s.peek() != 0 || s.i < len(s.b) {
		return malformed(s.errorf("trailing data after the JSON object"))
	}
	if p.out.Model == "" {
		if p.hasModel {
			return fmt.Errorf("request: %w: \"model\" must be a non-empty string", ErrMissingModel)
		}
		return fmt.Errorf("request: %w", ErrMissingModel)
	}
	switch {
	case p.input != 0:
		return p.inputBody()
	case p.hasMsgs:
		p.out.Kind = Chat
		p.out.Prompt, p.out.TokenIDs = "", nil // a chat has no completion prompt
		if p.msgErr != nil {
			return fmt.Errorf("request: %w", p.msgErr)
		}
		return nil
	case p.hasPrompt:
		p.out.Kind = Completion
		if p.promptErr != nil {
			return fmt.Errorf("request: %w", p.promptErr)
		}
		return nil
	}
	return fmt.Errorf("request: %w: the body has neither \"prompt\" nor \"messages\"", ErrPromptType)
}

// inputBody finishes a body whose prompt is its "input" (p.input).
func (p *parser) inputBody() error {
	p.out.Kind = p.input
	if !p.hasInput {
		return fmt.Errorf("request: %w", &ParamError{Param: "input", Code: "missing_required_parameter", Message: `missing required parameter: "input"`})
	}
	if p.inputErr != nil {
		return fmt.Errorf("request: %w", p.inputErr)
	}
	if p.input == Response {
		msgs := p.msgs[:0]
		if p.instructions != "" {
			msgs = append(msgs, Message{Role: "system", Content: p.instructions})
		}
		p.out.Messages = append(msgs, p.inputMsgs...)
	}
	return nil
}

// embeddingInput reads an Embedding's "input": a string, or an array of
// strings, of token ids, or of arrays of token ids (not mixed), at most
// MaxInputs items, none of them empty arrays.
func (p *parser) embeddingInput() error {
	s := &p.s
	typeErr := &ParamError{Param: "input", Code: "invalid_type",
		Message: `"input" must be a string, an array of strings, an array of token ids or an array of arrays of token ids`}
	switch s.peek() {
	case '"':
		v, err := p.string()
		p.out.Prompt = v
		return err
	case '[':
	default:
		return typeErr
	}
	n := 0
	var first byte // the items' kind: '"' strings, '0' token ids, '[' arrays of token ids
	err := s.array(func() error {
		if n++; n > MaxInputs {
			return &ParamError{Param: "input", Code: "invalid_value", Message: fmt.Sprintf(`"input" has more than %d items`, MaxInputs)}
		}
		k := s.peek()
		if k == '-' || (k >= '0' && k <= '9') {
			k = '0'
		}
		if first == 0 {
			first = k
		}
		if k != first {
			return typeErr
		}
		switch k {
		case '"':
			v, err := p.string()
			p.out.Inputs = append(p.out.Inputs, v)
			return err
		case '0':
			return p.tokenID()
		case '[':
			m := 0
			err := s.array(func() error {
				if c := s.peek(); c != '-' && (c < '0' || c > '9') {
					return typeErr
				}
				m++
				return p.tokenID()
			})
			if err == nil && m == 0 {
				return &ParamError{Param: "input", Code: "invalid_value", Message: fmt.Sprintf(`"input"[%d] is an empty array of token ids`, n-1)}
			}
			return err
		}
		return typeErr
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return &ParamError{Param: "input", Code: "invalid_value", Message: `"input" must not be an empty array`}
	}
	return nil
}

// tokenID reads one token id into TokenIDs.
func (p *parser) tokenID() error {
	num, err := p.s.number()
	if err != nil {
		return err
	}
	id, err := strconv.ParseInt(string(num), 10, 64)
	if err != nil {
		return fmt.Errorf("%w: token id %s is not an integer", ErrPromptType, num)
	}
	p.out.TokenIDs = append(p.out.TokenIDs, id)
	return nil
}

// responseInput reads a Response's "input": a string (one user message)
// or an array of items, each read as a message: its role (else its type),
// and its content (a string or parts) or a tool output's "output".
func (p *parser) responseInput() error {
	s := &p.s
	switch s.peek() {
	case '"':
		v, err := p.string()
		p.inputMsgs = append(p.inputMsgs[:0], Message{Role: "user", Content: v})
		return err
	case '[':
	default:
		return &ParamError{Param: "input", Code: "invalid_type", Message: `"input" must be a string or an array of input items`}
	}
	p.inputMsgs = []Message{}
	return s.array(func() error {
		n := len(p.inputMsgs)
		if s.peek() != '{' {
			return &ParamError{Param: "input", Code: "invalid_type", Message: fmt.Sprintf(`"input"[%d] must be an object`, n)}
		}
		var m Message
		var typ, output string
		err := s.object(func(key []byte) error {
			var dst *string
			switch string(key) {
			case "content":
				return p.content(&m, n)
			case "role":
				dst = &m.Role
			case "type":
				dst = &typ
			case "output":
				dst = &output
			default:
				return s.skip()
			}
			if s.peek() != '"' {
				*dst = ""
				return s.skip()
			}
			v, err := p.string()
			*dst = v
			return err
		})
		if m.Role == "" {
			m.Role = typ
		}
		if m.Parts == nil && m.Content == "" {
			m.Content = output
		}
		p.inputMsgs = append(p.inputMsgs, m)
		return err
	})
}

// field decodes a prompt field with decode. A type error is returned for
// later (the field may lose to another one) after the value has been
// skipped, so that the rest of the body is still checked.
func (p *parser) field(decode func() error) error {
	start := p.s.i
	err := decode()
	if err == nil || errors.Is(err, errSyntax) {
		return err
	}
	p.s.i = start
	if serr := p.s.skip(); serr != nil {
		return serr
	}
	return err
}

// syntaxOnly passes syntax errors on and keeps type errors for the end.
func (p *parser) syntaxOnly(err error) error {
	if err != nil && errors.Is(err, errSyntax) {
		return err
	}
	return nil
}

// string decodes a string value into the arena and returns it as a Go
// string that shares the arena's bytes.
func (p *parser) string() (string, error) {
	start := len(p.arena)
	v, decoded, err := p.s.scanString(p.arena, true)
	if err != nil {
		return "", err
	}
	if p.s.taken {
		// Decoded as the body arrived: the string shares the Prescan's
		// buffer, as ParseScanned says, rather than being copied.
		p.s.taken = false
		if len(v) == 0 {
			return "", nil
		}
		return unsafe.String(&v[0], len(v)), nil
	}
	if decoded {
		p.arena = v
	} else {
		p.arena = append(p.arena, v...)
	}
	if len(p.arena) == start {
		return "", nil
	}
	return unsafe.String(&p.arena[start], len(p.arena)-start), nil
}

func (p *parser) prompt() error {
	s := &p.s
	switch s.peek() {
	case '"':
		v, err := p.string()
		p.out.Prompt = v
		return err
	case '[':
		// Token ids. A list of strings is a batch of prompts, which one
		// routing decision cannot serve well; it is refused.
		err := s.array(func() error {
			c := s.peek()
			if c != '-' && (c < '0' || c > '9') {
				return fmt.Errorf("%w: \"prompt\" must be a string or an array of token ids", ErrPromptType)
			}
			return p.tokenID()
		})
		if err != nil {
			return err
		}
		if p.out.TokenIDs == nil {
			p.out.TokenIDs = []int64{}
		}
		return nil
	}
	return fmt.Errorf("%w: \"prompt\" must be a string or an array of token ids", ErrPromptType)
}

func (p *parser) messages() error {
	s := &p.s
	if s.peek() != '[' {
		return fmt.Errorf("%w: \"messages\" must be an array", ErrPromptType)
	}
	p.out.Messages = p.msgs[:0]
	return s.array(func() error {
		n := len(p.out.Messages)
		if s.peek() != '{' {
			return fmt.Errorf("%w: messages[%d] must be an object", ErrPromptType, n)
		}
		var m Message
		err := s.object(func(key []byte) error {
			switch string(key) {
			case "role":
				if s.peek() != '"' {
					m.Role = ""
					return s.skip()
				}
				v, err := p.string()
				m.Role = v
				return err
			case "content":
				return p.content(&m, n)
			}
			return s.skip()
		})
		if err != nil {
			return err
		}
		p.out.Messages = append(p.out.Messages, m)
		return nil
	})
}

func (p *parser) content(m *Message, n int) error {
	s := &p.s
	m.Content, m.Parts = "", nil
	switch s.peek() {
	case '"':
		v, err := p.string()
		m.Content = v
		return err
	case 'n':
		return s.literal("null")
	case '[':
		m.Parts = []Part{}
		return s.array(func() error {
			if s.peek() != '{' {
				return fmt.Errorf("%w: messages[%d].content[%d] must be an object", ErrPromptType, n, len(m.Parts))
			}
			var part Part
			err := s.object(func(key []byte) error {
				var dst *string
				switch string(key) {
				case "type":
					dst = &part.Type
				case "text":
					dst = &part.Text
				case "image_url":
					if s.peek() != '{' {
						return s.skip()
					}
					return s.object(func(key []byte) error {
						if string(key) != "url" || s.peek() != '"' {
							return s.skip()
						}
						v, err := p.string()
						part.ImageURL = v
						return err
					})
				default:
					return s.skip()
				}
				if s.peek() != '"' {
					*dst = ""
					return s.skip()
				}
				v, err := p.string()
				*dst = v
				return err
			})
			m.Parts = append(m.Parts, part)
			return err
		})
	}
	return fmt.Errorf("%w: messages[%d].content must be a string or an array of parts", ErrPromptType, n)
}

// EstimateTokens estimates the prompt's length in tokens: token ids are
// counted, text is taken at four bytes a token (the rule of thumb GIE uses
// too), and each chat message adds the few tokens of its template.
func (b *Body) EstimateTokens() int {
	switch b.Kind {
	case Completion:
		if b.TokenIDs != nil {
			return len(b.TokenIDs)
		}
		return (len(b.Prompt) + 3) / 4
	case Embedding:
		n := len(b.TokenIDs) + (len(b.Prompt)+3)/4
		for _, s := range b.Inputs {
			n += (len(s) + 3) / 4
		}
		return n
	case Chat, Response:
		n := 0
		for i := range b.Messages {
			m := &b.Messages[i]
			chars := len(m.Role) + len(m.Content)
			for j := range m.Parts {
				chars += len(m.Parts[j].Text)
			}
			n += (chars+3)/4 + 4
		}
		return n
	}
	return 0
}
