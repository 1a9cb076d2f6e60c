package sim

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
)

// CharsPerToken is how many prompt characters a live pod counts as one
// token. Prefix blocks are BlockSize×CharsPerToken characters of prompt
// text, so repeated prompts hit the pod's prefix cache.
const CharsPerToken = 4

// maxBodyBytes bounds a request body.
const maxBodyBytes = 32 << 20

func (lp *LivePod) routes(metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", lp.traced("/v1/chat/completions", lp.handleChat))
	mux.HandleFunc("POST /v1/completions", lp.traced("/v1/completions", lp.handleCompletions))
	mux.HandleFunc("POST /v1/embeddings", lp.traced("/v1/embeddings", lp.handleEmbeddings))
	mux.HandleFunc("POST /v1/responses", lp.traced("/v1/responses", lp.handleResponses))
	mux.HandleFunc("GET /v1/models", lp.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /sim/faults", lp.handleGetFaults)
	mux.HandleFunc("PUT /sim/faults", lp.handlePutFaults)
	mux.HandleFunc("POST /sim/faults", lp.handlePutFaults)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// apiError is the OpenAI error body: {"error":{"message","type","code"}}.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, typ, msg string) {
	var e apiError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, typ, status
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(e)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// completionBody holds the fields of /v1/completions and
// /v1/chat/completions the simulator reads; others are ignored.
type completionBody struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
		// ContinuousUsage is vLLM's: usage in every chunk.
		ContinuousUsage bool `json:"continuous_usage_stats"`
	} `json:"stream_options"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// request is a parsed API call.
type request struct {
	chat         bool
	model        string // as the client named it (base model or adapter)
	adapter      string
	text         string // prompt text the token count and block hashes come from
	promptTokens int    // set when the prompt was given as token ids
	maxTokens    int
	limited      bool // max_tokens was set: finish_reason "length"
	stream       bool
	includeUsage bool
	continuous   bool // usage in every chunk (vLLM's continuous_usage_stats)
}

// parse decodes and validates a body; the error is a 400 or 404 already
// classified by status.
func (lp *LivePod) parse(w http.ResponseWriter, r *http.Request, chat bool) (*request, int, error) {
	var b completionBody
	body := http.MaxBytesReader(w, r.Body, maxBodyBytes)
	dec := json.NewDecoder(body)
	if err := dec.Decode(&b); err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("invalid JSON body: %v", err)
	}
	// Read the body to its end, so that cutting the connection later (a
	// crash) does not reset it with unread input, which could discard the
	// tokens already sent.
	io.Copy(io.Discard, body)
	req, status, err := lp.resolveModel(b.Model)
	if err != nil {
		return nil, status, err
	}
	req.chat, req.stream = chat, b.Stream
	if b.N != nil && *b.N != 1 {
		return nil, http.StatusBadRequest, fmt.Errorf("n = %d is not supported by the simulator; use n = 1", *b.N)
	}
	if b.StreamOptions != nil {
		if !b.Stream {
			return nil, http.StatusBadRequest, errors.New("stream_options is only allowed when stream is true")
		}
		req.includeUsage = b.StreamOptions.IncludeUsage
		req.continuous = b.StreamOptions.ContinuousUsage
	}
	max := b.MaxTokens
	if b.MaxCompletionTokens != nil {
		max = b.MaxCompletionTokens
	}
	switch {
	case max == nil:
		req.maxTokens = lp.spec.DefaultMaxTokens
		if req.maxTokens == 0 {
			req.maxTokens = 64
		}
	case *max < 1:
		return nil, http.StatusBadRequest, fmt.Errorf("max_tokens must be at least 1, got %d", *max)
	default:
		req.maxTokens, req.limited = *max, true
	}
	if chat {
		err = req.chatText(b.Messages)
	} else {
		err = req.promptText(b.Prompt)
	}
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	return req, 0, nil
}

func (req *request) chatText(msgs []chatMessage) error {
	if len(msgs) == 0 {
		return errors.New("messages: at least one message is required")
	}
	var sb strings.Builder
	for i, m := range msgs {
		if m.Role == "" {
			return fmt.Errorf("messages[%d].role: required", i)
		}
		sb.WriteString(m.Role)
		sb.WriteString("\n")
		var s string
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		switch {
		case len(m.Content) == 0 || string(m.Content) == "null":
		case json.Unmarshal(m.Content, &s) == nil:
			sb.WriteString(s)
		case json.Unmarshal(m.Content, &parts) == nil:
			for _, p := range parts {
				sb.WriteString(p.Text)
			}
		default:
			return fmt.Errorf("messages[%d].content: want a string or an array of content parts", i)
		}
		sb.WriteString("\n")
	}
	req.text = sb.String()
	return nil
}

func (req *request) promptText(raw json.RawMessage) error {
	var s string
	var ss []string
	var ids []int
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return errors.New("prompt: required")
	case json.Unmarshal(raw, &s) == nil:
		req.text = s
	case json.Unmarshal(raw, &ss) == nil:
		if len(ss) != 1 {
			return fmt.Errorf("prompt: %d prompts in one request are not supported by the simulator; send one", len(ss))
		}
		req.text = ss[0]
	case json.Unmarshal(raw, &ids) == nil:
		req.promptTokens = len(ids)
	default:
		return errors.New("prompt: want a string, an array of one string, or an array of token ids")
	}
	if req.text == "" && req.promptTokens == 0 {
		return errors.New("prompt: empty")
	}
	return nil
}

// modelRequest turns the API call into the model's token view: ~4
// characters a token, and one chained hash per full block of prompt text
// (salted with the adapter, as vLLM salts block hashes with the LoRA id).
func (lp *LivePod) modelRequest(req *request) Request {
	bs := lp.pod.prof.BlockSize
	r := Request{OutputTokens: req.maxTokens, Adapter: req.adapter, HashBlockTokens: bs}
	if req.promptTokens > 0 {
		r.PromptTokens = req.promptTokens
		return r
	}
	r.PromptTokens = max(1, (len(req.text)+CharsPerToken-1)/CharsPerToken)
	chunk := bs * CharsPerToken
	var prev [8]byte
	binary.LittleEndian.PutUint64(prev[:], xxhash.Sum64String(lp.pod.Model()+"\x00"+req.adapter))
	for i := 0; i+chunk <= len(req.text); i += chunk {
		d := xxhash.New()
		d.Write(prev[:])
		d.WriteString(req.text[i : i+chunk])
		h := d.Sum64()
		r.PrefixHashes = append(r.PrefixHashes, h)
		binary.LittleEndian.PutUint64(prev[:], h)
	}
	return r
}

func (lp *LivePod) handleChat(w http.ResponseWriter, r *http.Request)        { lp.serve(w, r, true) }
func (lp *LivePod) handleCompletions(w http.ResponseWriter, r *http.Request) { lp.serve(w, r, false) }

func (lp *LivePod) serve(w http.ResponseWriter, r *http.Request, chat bool) {
	req, status, err := lp.parse(w, r, chat)
	if err != nil {
		typ := "BadRequestError"
		if status == http.StatusNotFound {
			typ = "NotFoundError"
		}
		writeError(w, status, typ, err.Error())
		return
	}
	created := time.Now().Unix()
	// An opaque id, as vLLM's (a random UUID's hex): the pod's name
	// stays inside the cluster.
	id := "cmpl-" + responseID()
	if chat {
		id = "chatcmpl-" + responseID()
	}
	if req.stream {
		lr := &liveRequest{req: lp.modelRequest(req), notify: make(chan struct{}, 1)}
		if lp.submitOrRefuse(w, lr, true) {
			lp.stream(w, r, req, lr, id, created)
		}
		return
	}
	if out, ok := lp.run(w, r, lp.modelRequest(req)); ok {
		writeJSON(w, lp.final(req, id, created, &out))
	}
}

func (lp *LivePod) final(req *request, id string, created int64, out *Outcome) map[string]any {
	text := tokenText(0, out.OutputTokens)
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finishReason(req)}
	object := "text_completion"
	if req.chat {
		object = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": text}
	} else {
		choice["text"] = text
	}
	return map[string]any{
		"id": id, "object": object, "created": created, "model": req.model,
		"choices": []any{choice},
		"usage":   usage(out),
	}
}

func finishReason(req *request) string {
	if req.limited {
		return "length"
	}
	return "stop"
}

func usage(out *Outcome) map[string]any {
	return map[string]any{
		"prompt_tokens":         out.Request.PromptTokens,
		"completion_tokens":     out.OutputTokens,
		"total_tokens":          out.Request.PromptTokens + out.OutputTokens,
		"prompt_tokens_details": map[string]any{"cached_tokens": out.CachedTokens},
	}
}

// stream answers with server-sent events: a role chunk (chat), one chunk
// per step's new tokens, a chunk with finish_reason, a usage chunk if asked
// for, and [DONE]. A crash cuts the connection without the final chunks.
func (lp *LivePod) stream(w http.ResponseWriter, r *http.Request, req *request, lr *liveRequest, id string, created int64) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	bw := bufio.NewWriter(w)
	object := "text_completion"
	if req.chat {
		object = "chat.completion.chunk"
	}
	send := func(choices []any, extra map[string]any) {
		ev := map[string]any{"id": id, "object": object, "created": created, "model": req.model, "choices": choices}
		for k, v := range extra {
			ev[k] = v
		}
		b, _ := json.Marshal(ev)
		bw.WriteString("data: ")
		bw.Write(b)
		bw.WriteString("\n\n")
	}
	choice := func(text string, finish any, role bool) []any {
		c := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish}
		if req.chat {
			delta := map[string]any{}
			if role {
				delta["role"] = "assistant"
			}
			if text != "" || role {
				delta["content"] = text
			}
			c["delta"] = delta
		} else {
			c["text"] = text
		}
		return []any{c}
	}
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		return rc.Flush()
	}
	// The headers go at once (vLLM's server, Starlette, sends them before
	// the first engine output), the chat role chunk with the first token:
	// vLLM emits it on the engine's first output, so a proxy timing the
	// first body byte measures the time to first token.
	if rc.Flush() != nil {
		lp.cancel(lr)
		return
	}
	role := req.chat
	sent := 0
	var chunkBuf [512]byte
	for {
		if !lp.await(r, lr) {
			return
		}
		tokens, done, out := lp.progress(lr)
		if role && tokens > 0 {
			send(choice("", nil, true), nil)
			role = false
		}
		if tokens > sent {
			// The chunk every step sends, encoded without reflection
			// (json.Marshal of its maps was most of a simulated pod's
			// CPU per request, which on a shared machine is taken from
			// the proxies being measured).
			usage := -1
			if req.continuous {
				usage = lr.req.PromptTokens
			}
			bw.WriteString("data: ")
			bw.Write(appendTokenChunk(chunkBuf[:0], id, object, req.model, created, req.chat, tokenText(sent, tokens), usage, tokens))
			bw.WriteString("\n\n")
			sent = tokens
		}
		if done && out.Err != nil {
			flush()
			panic(http.ErrAbortHandler) // crash mid-stream: no final chunk, no [DONE]
		}
		if done {
			send(choice("", finishReason(req), false), nil)
			if req.includeUsage {
				bw.WriteString("data: ")
				bw.Write(appendUsageChunk(chunkBuf[:0], id, object, req.model, created, out.Request.PromptTokens, out.OutputTokens, out.CachedTokens))
				bw.WriteString("\n\n")
			}
			bw.WriteString("data: [DONE]\n\n")
			flush()
			return
		}
		if flush() != nil {
			lp.cancel(lr)
			return
		}
	}
}

// words are the simulated output; token i is words[i%len(words)].
var words = []string{" The", " sim", "ulated", " model", " is", " answering", " your", " request", "."}

// tokenText is the text of output tokens [from, to).
func tokenText(from, to int) string {
	var sb strings.Builder
	for i := from; i < to; i++ {
		sb.WriteString(words[i%len(words)])
	}
	return sb.String()
}

func (lp *LivePod) handleModels(w http.ResponseWriter, r *http.Request) {
	created := lp.start.Unix()
	lp.mu.Lock()
	model, maxLen, adapters := lp.pod.Model(), lp.pod.prof.MaxModelLen, slices.Clone(lp.pod.cfg.Adapters)
	lp.mu.Unlock()
	data := []any{map[string]any{
		"id": model, "object": "model", "created": created, "owned_by": "vllm",
		"root": model, "parent": nil, "max_model_len": maxLen,
	}}
	for _, a := range adapters {
		data = append(data, map[string]any{
			"id": a, "object": "model", "created": created, "owned_by": "vllm",
			"root": a, "parent": model, "max_model_len": maxLen,
		})
	}
	writeJSON(w, map[string]any{"object": "list", "data": data})
}

func (lp *LivePod) handleGetFaults(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, lp.Faults())
}

// handlePutFaults replaces the pod's faults with the JSON body, e.g.
// {"errorRate":0.1,"slowFactor":3}; an empty object clears them.
func (lp *LivePod) handlePutFaults(w http.ResponseWriter, r *http.Request) {
	var f Faults
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", "faults: "+err.Error())
		return
	}
	if err := lp.SetFaults(f); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	writeJSON(w, f)
}

// String describes the pod for logs and the sim command's listing.
func (lp *LivePod) String() string {
	lp.mu.Lock()
	adapters := strings.Join(lp.pod.cfg.Adapters, ",")
	lp.mu.Unlock()
	return fmt.Sprintf("%s %s model=%s adapters=%s labels=%s", lp.Name(), lp.URL(), lp.Model(), adapters, formatLabels(lp.Labels()))
}

func formatLabels(l map[string]string) string {
	keys := slices.Sorted(maps.Keys(l))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.Quote(l[k])
	}
	return strings.Join(parts, ",")
}

// appendTokenChunk appends the JSON of a streamed chunk carrying text: the
// bytes json.Marshal writes for the maps stream's send builds (keys in
// order), with usage so far when prompt >= 0 (vLLM's
// continuous_usage_stats).
func appendTokenChunk(b []byte, id, object, model string, created int64, chat bool, text string, prompt, completion int) []byte {
	b = append(b, `{"choices":[{`...)
	if chat {
		b = append(b, `"delta":{"content":`...)
		b = appendJSONString(b, text)
		b = append(b, `},"finish_reason":null,"index":0,"logprobs":null}]`...)
	} else {
		b = append(b, `"finish_reason":null,"index":0,"logprobs":null,"text":`...)
		b = appendJSONString(b, text)
		b = append(b, `}]`...)
	}
	b = appendChunkTail(b, id, object, model, created)
	if prompt >= 0 {
		b = appendUsage(b, prompt, completion, -1)
	}
	return append(b, '}')
}

// appendChunkTail appends what follows a chunk's choices: its created,
// id, model and object, in json.Marshal's key order.
func appendChunkTail(b []byte, id, object, model string, created int64) []byte {
	b = append(b, `,"created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"id":`...)
	b = appendJSONString(b, id)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, model)
	b = append(b, `,"object":`...)
	return appendJSONString(b, object)
}

// appendUsage appends a chunk's usage, with prompt_tokens_details when
// cached >= 0.
func appendUsage(b []byte, prompt, completion, cached int) []byte {
	b = append(b, `,"usage":{"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	b = append(b, `,"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	if cached >= 0 {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, int64(cached), 10)
		b = append(b, '}')
	}
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	return append(b, '}')
}

// appendJSONString appends s as json.Marshal encodes it.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c >= 0x80 {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// responseID is 32 random hex digits.
func responseID() string {
	var b [32]byte
	hex.Encode(b[:16], binary.BigEndian.AppendUint64(nil, rand.Uint64()))
	hex.Encode(b[16:], binary.BigEndian.AppendUint64(nil, rand.Uint64()))
	return string(b[:])
}

// appendUsageChunk appends the JSON of the final usage chunk (no choices):
// the bytes json.Marshal writes for the event with usage(&out).
func appendUsageChunk(b []byte, id, object, model string, created int64, prompt, completion, cached int) []byte {
	b = append(b, `{"choices":[]`...)
	b = appendChunkTail(b, id, object, model, created)
	b = appendUsage(b, prompt, completion, cached)
	return append(b, '}')
}
