package sim

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/meridian-router/meridian/internal/tracing"
	meridianreq "github.com/meridian-router/meridian/request"
)

// traced wraps an OpenAI endpoint's handler: the answer carries the
// request's x-request-id (the caller's, as vLLM's
// --enable-request-id-headers echoes it, else a new one), and with
// PodSpec.Tracer set the request is a span ("llm_request", as vLLM names
// it) that continues the caller's traceparent.
func (lp *LivePod) traced(route string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := meridianreq.UseID(r.Header, w.Header())
		if lp.spec.Tracer == nil {
			h(w, r)
			return
		}
		ctx, span := lp.spec.Tracer.Start(tracing.Extract(r.Context(), r.Header), "llm_request",
			trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.route", route), attribute.String("meridian.pod", lp.Name()),
				attribute.String("meridian.request_id", id)))
		defer span.End()
		h(w, r.WithContext(ctx))
	}
}

// embeddingBody holds the fields of /v1/embeddings the simulator reads.
type embeddingBody struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
}

// embeddingDims is the length of a simulated embedding when the request
// does not set dimensions.
const embeddingDims = 16

// handleEmbeddings answers /v1/embeddings as vLLM serves an embedding
// model: the inputs run as one prefill (a request of one output step on
// the pod, so that it queues and loads the pod like any other), and each
// input gets a unit vector derived from its text (equal inputs, equal
// vectors), as floats or base64 of little-endian float32s.
func (lp *LivePod) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	var b embeddingBody
	if err := decodeBody(w, r, &b); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	req, status, err := lp.resolveModel(b.Model)
	if err != nil {
		writeError(w, status, "NotFoundError", err.Error())
		return
	}
	texts, tokens, err := embeddingInputs(b.Input)
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	dims := embeddingDims
	if b.Dimensions != nil {
		if *b.Dimensions < 1 || *b.Dimensions > 4096 {
			writeError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("dimensions must be 1 to 4096, got %d", *b.Dimensions))
			return
		}
		dims = *b.Dimensions
	}
	switch b.EncodingFormat {
	case "", "float", "base64":
	default:
		writeError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("encoding_format %q: want float or base64", b.EncodingFormat))
		return
	}
	// One output step: the pooling pass after the prefill.
	// Each input counts its own tokens, as each is tokenized alone.
	req.text, req.promptTokens = strings.Join(texts, "\n"), tokens
	for _, text := range texts {
		req.promptTokens += max(1, (len(text)+CharsPerToken-1)/CharsPerToken)
	}
	req.maxTokens, req.limited = 1, true
	out, ok := lp.run(w, r, lp.modelRequest(req))
	if !ok {
		return
	}
	data := make([]any, 0, max(len(texts), 1))
	keys := texts
	if len(keys) == 0 {
		keys = []string{string(b.Input)}
	}
	for i, text := range keys {
		vec := embedding(text, dims)
		var v any = vec
		if b.EncodingFormat == "base64" {
			raw := make([]byte, 0, 4*len(vec))
			for _, f := range vec {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(f))
			}
			v = base64.StdEncoding.EncodeToString(raw)
		}
		data = append(data, map[string]any{"object": "embedding", "index": i, "embedding": v})
	}
	writeJSON(w, map[string]any{
		"id": "embd-" + responseID(), "object": "list", "created": time.Now().Unix(), "model": req.model, "data": data,
		"usage": map[string]any{"prompt_tokens": out.Request.PromptTokens, "total_tokens": out.Request.PromptTokens},
	})
}

// embeddingInputs reads an embeddings input: a string, an array of
// strings, of token ids or of arrays of token ids. It returns the texts
// and the number of token ids.
func embeddingInputs(raw json.RawMessage) (texts []string, tokens int, err error) {
	var s string
	var ss []string
	var ids []int
	var batches [][]int
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, 0, errors.New("input: required")
	case json.Unmarshal(raw, &s) == nil:
		return []string{s}, 0, nil
	case json.Unmarshal(raw, &ss) == nil && len(ss) > 0:
		return ss, 0, nil
	case json.Unmarshal(raw, &ids) == nil && len(ids) > 0:
		return nil, len(ids), nil
	case json.Unmarshal(raw, &batches) == nil && len(batches) > 0:
		for _, b := range batches {
			tokens += len(b)
		}
		return nil, tokens, nil
	}
	return nil, 0, errors.New("input: want a string, an array of strings, an array of token ids or an array of arrays of token ids, not empty")
}

// embedding is a unit vector of dims derived from text.
func embedding(text string, dims int) []float32 {
	vec := make([]float32, dims)
	var norm float64
	h := xxhash.Sum64String(text)
	for i := range vec {
		h = h*6364136223846793005 + 1442695040888963407 // an LCG step per dimension
		f := float64(int64(h>>11))/float64(1<<52) - 1
		vec[i] = float32(f)
		norm += f * f
	}
	if norm = math.Sqrt(norm); norm > 0 {
		for i := range vec {
			vec[i] = float32(float64(vec[i]) / norm)
		}
	}
	return vec
}

// responsesBody holds the fields of /v1/responses the simulator reads.
type responsesBody struct {
	Model           string          `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    *string         `json:"instructions"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	Stream          bool            `json:"stream"`
}

// handleResponses answers /v1/responses: the instructions and input are
// the prompt, the output one assistant message. Streamed, it sends typed
// events (event: TYPE, data: {"type":TYPE,...}) from response.created to
// response.completed, whose response.usage has input_tokens and
// output_tokens; a crash cuts the stream before response.completed.
func (lp *LivePod) handleResponses(w http.ResponseWriter, r *http.Request) {
	var b responsesBody
	if err := decodeBody(w, r, &b); err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	req, status, err := lp.resolveModel(b.Model)
	if err != nil {
		writeError(w, status, "NotFoundError", err.Error())
		return
	}
	text, err := responsesText(b.Instructions, b.Input)
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error())
		return
	}
	req.text, req.stream = text, b.Stream
	switch {
	case b.MaxOutputTokens == nil:
		req.maxTokens = cmpOr(lp.spec.DefaultMaxTokens, 64)
	case *b.MaxOutputTokens < 1:
		writeError(w, http.StatusBadRequest, "BadRequestError", fmt.Sprintf("max_output_tokens must be at least 1, got %d", *b.MaxOutputTokens))
		return
	default:
		req.maxTokens, req.limited = *b.MaxOutputTokens, true
	}
	rs := &responseState{id: "resp_" + responseID(), msgID: "msg_" + responseID(), created: time.Now().Unix(), model: req.model,
		instructions: b.Instructions, maxOutput: b.MaxOutputTokens}
	if !b.Stream {
		out, ok := lp.run(w, r, lp.modelRequest(req))
		if !ok {
			return
		}
		writeJSON(w, rs.object("completed", tokenText(0, out.OutputTokens), &out))
		return
	}
	lr := &liveRequest{req: lp.modelRequest(req), notify: make(chan struct{}, 1)}
	if !lp.submitOrRefuse(w, lr, true) {
		return
	}
	lp.streamResponse(w, r, rs, lr)
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// responsesText is the prompt text of a response request: the
// instructions, then each input message's role and text.
func responsesText(instructions *string, raw json.RawMessage) (string, error) {
	var sb strings.Builder
	if instructions != nil {
		sb.WriteString("system\n" + *instructions + "\n")
	}
	var s string
	var items []struct {
		Role    string          `json:"role"`
		Type    string          `json:"type"`
		Content json.RawMessage `json:"content"`
		Output  string          `json:"output"`
	}
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return "", errors.New("input: required")
	case json.Unmarshal(raw, &s) == nil:
		sb.WriteString("user\n" + s + "\n")
	case json.Unmarshal(raw, &items) == nil:
		for i, it := range items {
			sb.WriteString(cmpOrString(it.Role, it.Type) + "\n")
			var text string
			var parts []struct {
				Text string `json:"text"`
			}
			switch {
			case len(it.Content) == 0 || string(it.Content) == "null":
				sb.WriteString(it.Output)
			case json.Unmarshal(it.Content, &text) == nil:
				sb.WriteString(text)
			case json.Unmarshal(it.Content, &parts) == nil:
				for _, p := range parts {
					sb.WriteString(p.Text)
				}
			default:
				return "", fmt.Errorf("input[%d].content: want a string or an array of content parts", i)
			}
			sb.WriteString("\n")
		}
	default:
		return "", errors.New("input: want a string or an array of input items")
	}
	if sb.Len() == 0 {
		return "", errors.New("input: empty")
	}
	return sb.String(), nil
}

func cmpOrString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// responseState is what every event of one response repeats.
type responseState struct {
	id, msgID    string
	created      int64
	model        string
	instructions *string
	maxOutput    *int
	seq          int
}

// object is the response object in status with text as its output (none
// while in progress) and the usage of out (nil: null).
func (rs *responseState) object(status, text string, out *Outcome) map[string]any {
	output := []any{}
	var usage any
	if out != nil {
		output = append(output, rs.message("completed", text))
		usage = map[string]any{
			"input_tokens": out.Request.PromptTokens, "input_tokens_details": map[string]any{"cached_tokens": out.CachedTokens},
			"output_tokens": out.OutputTokens, "output_tokens_details": map[string]any{"reasoning_tokens": 0},
			"total_tokens": out.Request.PromptTokens + out.OutputTokens,
		}
	}
	return map[string]any{
		"id": rs.id, "object": "response", "created_at": rs.created, "status": status, "model": rs.model,
		"instructions": rs.instructions, "max_output_tokens": rs.maxOutput, "output": output,
		"parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{}, "temperature": 1.0, "top_p": 1.0,
		"error": nil, "incomplete_details": nil, "metadata": map[string]any{}, "text": map[string]any{"format": map[string]any{"type": "text"}},
		"usage": usage,
	}
}

func (rs *responseState) message(status, text string) map[string]any {
	content := []any{}
	if status == "completed" {
		content = append(content, outputText(text))
	}
	return map[string]any{"type": "message", "id": rs.msgID, "status": status, "role": "assistant", "content": content}
}

func outputText(text string) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
}

// event writes one typed event.
func (rs *responseState) event(bw *bufio.Writer, typ string, fields map[string]any) {
	fields["type"] = typ
	fields["sequence_number"] = rs.seq
	rs.seq++
	b, _ := json.Marshal(fields)
	bw.WriteString("event: " + typ + "\ndata: ")
	bw.Write(b)
	bw.WriteString("\n\n")
}

// streamResponse streams a response's events as the pod generates.
func (lp *LivePod) streamResponse(w http.ResponseWriter, r *http.Request, rs *responseState, lr *liveRequest) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	bw := bufio.NewWriter(w)
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		return rc.Flush()
	}
	if rc.Flush() != nil {
		lp.cancel(lr)
		return
	}
	item := func() map[string]any {
		return map[string]any{"item_id": rs.msgID, "output_index": 0, "content_index": 0}
	}
	started := false
	sent := 0
	for {
		if !lp.await(r, lr) {
			return
		}
		tokens, done, out := lp.progress(lr)
		if !started && (tokens > 0 || done) {
			// As the chat stream's role chunk, the opening events leave
			// with the first token.
			rs.event(bw, "response.created", map[string]any{"response": rs.object("in_progress", "", nil)})
			rs.event(bw, "response.in_progress", map[string]any{"response": rs.object("in_progress", "", nil)})
			rs.event(bw, "response.output_item.added", map[string]any{"output_index": 0, "item": rs.message("in_progress", "")})
			f := item()
			f["part"] = outputText("")
			rs.event(bw, "response.content_part.added", f)
			started = true
		}
		if tokens > sent {
			f := item()
			f["delta"], f["logprobs"] = tokenText(sent, tokens), []any{}
			rs.event(bw, "response.output_text.delta", f)
			sent = tokens
		}
		if done && out.Err != nil {
			flush()
			panic(http.ErrAbortHandler) // crash mid-stream: no response.completed
		}
		if done {
			text := tokenText(0, out.OutputTokens)
			f := item()
			f["text"], f["logprobs"] = text, []any{}
			rs.event(bw, "response.output_text.done", f)
			f = item()
			f["part"] = outputText(text)
			rs.event(bw, "response.content_part.done", f)
			rs.event(bw, "response.output_item.done", map[string]any{"output_index": 0, "item": rs.message("completed", text)})
			rs.event(bw, "response.completed", map[string]any{"response": rs.object("completed", text, &out)})
			flush()
			return
		}
		if flush() != nil {
			lp.cancel(lr)
			return
		}
	}
}

// decodeBody decodes a JSON request body of at most maxBodyBytes and reads
// it to its end (see parse).
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, maxBodyBytes)
	if err := json.NewDecoder(body).Decode(v); err != nil {
		return fmt.Errorf("invalid JSON body: %v", err)
	}
	io.Copy(io.Discard, body)
	return nil
}

// resolveModel is a request for model: the pod's base model ("" too) or
// one of its adapters; another is a 404.
func (lp *LivePod) resolveModel(model string) (*request, int, error) {
	req := &request{model: model}
	switch {
	case model == "" || model == lp.pod.Model():
		req.model = lp.pod.Model()
	case lp.pod.HasAdapter(model):
		req.adapter = model
	default:
		return nil, http.StatusNotFound, fmt.Errorf("The model `%s` does not exist.", model)
	}
	return req, 0, nil
}

// submitOrRefuse submits lr, or answers the pod's refusal and reports
// false.
func (lp *LivePod) submitOrRefuse(w http.ResponseWriter, lr *liveRequest, stream bool) bool {
	err := lp.submit(lr, stream)
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrRateLimited):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, "RateLimitError", err.Error())
	case errors.Is(err, ErrServerError):
		writeError(w, http.StatusInternalServerError, "InternalServerError", err.Error())
	case errors.Is(err, ErrUnknownAdapter):
		writeError(w, http.StatusNotFound, "NotFoundError", err.Error())
	default:
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error())
	}
	return false
}

// run submits mr and waits for its outcome; false: the answer was
// written (a refusal) or the client went away. A crash aborts the
// handler.
func (lp *LivePod) run(w http.ResponseWriter, r *http.Request, mr Request) (Outcome, bool) {
	lr := &liveRequest{req: mr, notify: make(chan struct{}, 1)}
	if !lp.submitOrRefuse(w, lr, false) {
		return Outcome{}, false
	}
	for {
		if !lp.await(r, lr) {
			return Outcome{}, false
		}
		if _, done, out := lp.progress(lr); done {
			if out.Err != nil {
				panic(http.ErrAbortHandler) // a crash: the server dies without answering
			}
			return out, true
		}
	}
}
