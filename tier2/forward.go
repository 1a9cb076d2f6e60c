package tier2

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/request"
)

// NewTransport returns the transport Tier-2 uses to reach Tier-1s: pooled
// keep-alive connections, HTTP/2 when the Tier-1 offers it over TLS, a
// short connect timeout so an unreachable cluster fails over quickly.
func NewTransport() *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   true,
	}
}

// prefixHash keys cluster-level prefix affinity: a hash of the prompt's
// first PrefixBlocks blocks of 256 characters (a shared system prompt).
func (r *Router) prefixHash(c *call) uint64 {
	if c.body == nil {
		return 0
	}
	text := request.AppendPromptText(nil, c.body)
	n := min(len(text), 256*r.cfg.PrefixBlocks)
	if n < 256 {
		return 0 // too short to be a shared prefix worth following
	}
	return xxhash.Sum64(text[:n]) | 1
}

// retryable classifies a failed attempt before the first response byte.
type attemptErr struct {
	reason string // connect, timeout, 5xx, 429
	status int
	result regions.Result
}

// forward is stage 6-8: choose clusters, send, fail over before the first
// byte, stream back with the public model name, account.
func (r *Router) forward(st *state, c *call, w http.ResponseWriter, req *http.Request) {
	var buf [8]regions.Target
	targets := r.cfg.Fleet.Select(buf[:0], regions.Request{Model: c.resolved.Target, PrefixHash: r.prefixHash(c), Clusters: c.resolved.Clusters})
	if c.spill {
		targets = preferOtherRegions(targets, r.cfg.Region)
	}
	tenant := st.tenantLabel(c.caller.Tenant)
	if len(targets) == 0 {
		r.settle(c, 0)
		r.reject(st, c, request.Unavailable("no_cluster", fmt.Sprintf("no healthy cluster serves model %q", c.resolved.Target)), w)
		return
	}
	body := c.raw
	// A stream that does not ask for usage gets it anyway, so that token
	// limits settle on real counts; relay drops the extra chunk.
	c.hideUsage = c.body.Stream && !c.embed && r.cfg.Limiter != nil && !bytes.Contains(c.raw, []byte(`"include_usage":true`)) &&
		!bytes.Contains(c.raw, []byte(`"include_usage": true`))
	if c.resolved.Target != c.body.Model || c.hideUsage {
		var err error
		if body, err = rewriteBody(c.raw, c.body.Model, c.resolved.Target, c.hideUsage); err != nil {
			r.settle(c, 0)
			r.reject(st, c, request.BadRequest("bad_request", err.Error()), w)
			return
		}
	}
	budget := r.cfg.Fleet.Retries()
	budget.Request()
	var last *attemptErr
	for i, t := range targets {
		if i > 0 {
			if !budget.Retry() {
				r.m.budgetExhausted.Inc()
				break
			}
			r.m.retries.WithLabelValues(last.reason).Inc()
		}
		resp, aerr := r.send(req.Context(), t, req, body, c)
		if aerr != nil {
			r.cfg.Fleet.End(t, aerr.result)
			last = aerr
			if req.Context().Err() != nil {
				r.settle(c, 0)
				return // the caller went away
			}
			r.log.Warn("tier2: cluster failed before responding; failing over", "cluster", t.Cluster, "region", t.Region, "reason", aerr.reason)
			continue
		}
		if t.Region != targets[0].Region {
			r.m.failovers.WithLabelValues(targets[0].Region, t.Region).Inc()
		}
		c.served = t
		code := r.relay(w, resp, c)
		r.cfg.Fleet.End(t, regions.Success)
		r.m.requests.WithLabelValues(st.modelLabel(c.body.Model), st.modelLabel(c.resolved.Target), t.Region, t.Cluster, fmt.Sprint(code)).Inc()
		return
	}
	r.settle(c, 0)
	e := request.Unavailable("upstream_unavailable", fmt.Sprintf("every cluster serving %q failed before responding", c.resolved.Target))
	if last != nil && last.status == http.StatusTooManyRequests {
		e = request.TooManyRequests("capacity", fmt.Sprintf("every cluster serving %q is at capacity", c.resolved.Target), 1)
	}
	r.m.rejected.WithLabelValues(tenant, c.band.String(), e.Code).Inc()
	r.m.requests.WithLabelValues(st.modelLabel(c.body.Model), st.modelLabel(c.resolved.Target), "", "", fmt.Sprint(e.Status)).Inc()
	e.Write(w)
}

// send tries one cluster. A response is returned only when it may be
// relayed: connect errors, 5xx and 429 come back as attemptErr.
func (r *Router) send(ctx context.Context, t regions.Target, in *http.Request, body []byte, c *call) (*http.Response, *attemptErr) {
	r.cfg.Fleet.Begin(t)
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(t.Tier1, "/")+in.URL.Path, bytes.NewReader(body))
	if err != nil {
		return nil, &attemptErr{reason: "connect", result: regions.Failure}
	}
	for k, vs := range in.Header {
		switch k {
		case "Authorization", "Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length":
			continue // the credential stops here
		}
		out.Header[k] = vs
	}
	out.Header.Set("X-Meridian-Tenant", c.caller.Tenant)
	out.Header.Set("X-Meridian-Band", c.band.String())
	out.Header.Set("X-Gateway-Inference-Fairness-Id", c.caller.Tenant)
	out.ContentLength = int64(len(body))
	resp, err := r.cfg.Transport.RoundTrip(out)
	if err != nil {
		reason := "connect"
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			reason = "timeout"
		}
		return nil, &attemptErr{reason: reason, result: regions.Failure}
	}
	switch {
	case resp.StatusCode >= 500:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		return nil, &attemptErr{reason: "5xx", status: resp.StatusCode, result: regions.Failure}
	case resp.StatusCode == http.StatusTooManyRequests:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		return nil, &attemptErr{reason: "429", status: resp.StatusCode, result: regions.Overloaded}
	}
	return resp, nil
}

// relay streams a response back, rewriting the model name to the public
// one and reading the usage for token accounting. It returns the status.
func (r *Router) relay(w http.ResponseWriter, resp *http.Response, c *call) int {
	defer resp.Body.Close()
	h := w.Header()
	for k, vs := range resp.Header {
		switch k {
		case "Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length":
			continue
		}
		h[k] = vs
	}
	h.Set("x-meridian-region", c.served.Region)
	h.Set("x-meridian-cluster", c.served.Cluster)
	w.WriteHeader(resp.StatusCode)
	first := false
	markFirst := func() {
		if !first {
			first = true
			r.m.ttft.WithLabelValues(c.resolved.Public, c.resolved.Target).Observe(r.cfg.Now().Sub(c.start).Seconds())
		}
	}
	rc := http.NewResponseController(w)
	from, to := []byte(`"model":"`+c.resolved.Target+`"`), []byte(`"model":"`+c.resolved.Public+`"`)
	rename := c.resolved.Target != c.resolved.Public
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		markFirst()
		if rename {
			b = bytes.Replace(b, from, to, 1)
		}
		w.Write(b)
		if err != nil {
			r.settle(c, 0)
			panic(http.ErrAbortHandler)
		}
		r.settle(c, usageTokens(b))
		return resp.StatusCode
	}
	// Server-sent events: one event at a time, flushed at once.
	br := r.readers.Get().(*bufio.Reader)
	br.Reset(resp.Body)
	defer func() { br.Reset(nil); r.readers.Put(br) }()
	used := int64(0)
	skipBlank := false
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// An event line longer than the buffer: pass it through whole.
			rest, _ := br.ReadBytes('\n')
			line = append(append([]byte(nil), line...), rest...)
			err = nil
		}
		if len(line) > 0 {
			markFirst()
			drop := false
			if bytes.HasPrefix(line, []byte("data: {")) {
				if rename {
					line = bytes.Replace(line, from, to, 1)
				}
				if u := usageTokens(line[len("data: "):]); u > 0 {
					used = u
					// The usage chunk the caller did not ask for.
					drop = c.hideUsage && bytes.Contains(line, []byte(`"choices":[]`))
					skipBlank = drop
				}
			} else if skipBlank && len(bytes.TrimSpace(line)) == 0 {
				drop, skipBlank = true, false
			}
			if !drop {
				if _, werr := w.Write(line); werr != nil {
					r.settle(c, used)
					return resp.StatusCode
				}
				if len(bytes.TrimSpace(line)) == 0 {
					rc.Flush() // end of an event
				}
			}
		}
		if err == io.EOF {
			rc.Flush()
			r.settle(c, used)
			return resp.StatusCode
		}
		if err != nil {
			// After the first byte, never retry: end the stream with an
			// error event the OpenAI SDKs surface.
			w.Write([]byte(`data: {"error":{"message":"the upstream cluster failed mid-stream","type":"server_error","code":"upstream_failed"}}` + "\n\n"))
			rc.Flush()
			r.settle(c, used)
			return resp.StatusCode
		}
	}
}

// settle reconciles the token estimate charged at admission with the real
// usage (0 when unknown: the estimate stands for the prompt part only).
func (r *Router) settle(c *call, used int64) {
	if r.cfg.Limiter == nil || !c.rl.Allowed || c.settled {
		return
	}
	c.settled = true
	if used <= 0 && c.body != nil {
		used = int64(c.body.EstimateTokens())
	}
	r.cfg.Limiter.Settle(c.rl.Ticket, used)
}

// usageTokens reads usage.total_tokens from a response or event JSON
// without decoding it: this runs on the response path of every request.
func usageTokens(b []byte) int64 {
	i := bytes.Index(b, []byte(`"usage"`))
	if i < 0 {
		return 0
	}
	j := bytes.Index(b[i:], []byte(`"total_tokens"`))
	if j < 0 {
		return 0
	}
	rest := b[i+j+len(`"total_tokens"`):]
	k := 0
	for k < len(rest) && (rest[k] == ' ' || rest[k] == ':') {
		k++
	}
	var n int64
	for ; k < len(rest) && rest[k] >= '0' && rest[k] <= '9'; k++ {
		n = n*10 + int64(rest[k]-'0')
	}
	return n
}

// rewriteBody returns body with its "model" replaced by model and, when
// includeUsage, stream_options.include_usage set. The common cases are
// byte edits of the original (a body may be megabytes of prompt); anything
// unusual goes through a full decode.
func rewriteBody(body []byte, public, model string, includeUsage bool) ([]byte, error) {
	out := body
	if model != public {
		q, _ := json.Marshal(public)
		from := append([]byte(`"model":`), q...)
		if bytes.Count(body, from) != 1 {
			return rewriteBodySlow(body, model, includeUsage)
		}
		to, _ := json.Marshal(model)
		out = bytes.Replace(body, from, append([]byte(`"model":`), to...), 1)
	}
	if includeUsage {
		if bytes.Contains(out, []byte(`"stream_options"`)) {
			return rewriteBodySlow(body, model, includeUsage)
		}
		i := bytes.IndexByte(out, '{')
		if i < 0 {
			return nil, errors.New("malformed JSON body: not an object")
		}
		const field = `"stream_options":{"include_usage":true},`
		edited := make([]byte, 0, len(out)+len(field))
		edited = append(edited, out[:i+1]...)
		edited = append(edited, field...)
		edited = append(edited, out[i+1:]...)
		out = edited
	}
	return out, nil
}

// rewriteBodySlow is rewriteBody by a full decode and encode.
func rewriteBodySlow(body []byte, model string, includeUsage bool) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("malformed JSON body: %w", err)
	}
	q, _ := json.Marshal(model)
	m["model"] = q
	if includeUsage {
		opts := map[string]json.RawMessage{}
		if raw, ok := m["stream_options"]; ok && string(raw) != "null" {
			if err := json.Unmarshal(raw, &opts); err != nil {
				return nil, fmt.Errorf(`"stream_options" must be an object: %w`, err)
			}
		}
		opts["include_usage"] = json.RawMessage("true")
		m["stream_options"], _ = json.Marshal(opts)
	}
	return json.Marshal(m)
}

// preferOtherRegions moves clusters outside region ahead, keeping order.
func preferOtherRegions(ts []regions.Target, region string) []regions.Target {
	out := make([]regions.Target, 0, len(ts))
	for _, t := range ts {
		if t.Region != region {
			out = append(out, t)
		}
	}
	for _, t := range ts {
		if t.Region == region {
			out = append(out, t)
		}
	}
	return out
}

// readEmbedding parses an embeddings body: model and input.
func readEmbedding(req *http.Request, limit int64) (*request.Body, []byte, error) {
	raw, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		return nil, nil, fmt.Errorf("reading body: %w", err)
	}
	if int64(len(raw)) > limit {
		return nil, nil, fmt.Errorf("%w: more than %d bytes", request.ErrTooLarge, limit)
	}
	var v struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", request.ErrMalformed, err)
	}
	if v.Model == "" {
		return nil, nil, request.ErrMissingModel
	}
	if len(v.Input) == 0 {
		return nil, nil, fmt.Errorf("%w: \"input\" is required", request.ErrPromptType)
	}
	return &request.Body{Model: v.Model, Kind: request.Completion, Prompt: string(v.Input)}, raw, nil
}
