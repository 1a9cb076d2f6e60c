package tier2

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/meridian-router/meridian/internal/tracing"
	"github.com/meridian-router/meridian/internal/trust"
	"github.com/meridian-router/meridian/regions"
	"github.com/meridian-router/meridian/request"
)

// NewTransport returns the transport Tier-2 uses to reach Tier-1s:
// net/http's, with keep-alive connections pooled per Tier-1 (a Tier-1
// carries many concurrent streams), HTTP/2 when a Tier-1 offers it over
// TLS, a short connect timeout so that an unreachable cluster fails over
// quickly, and a bound on a Tier-1's response headers. The wait for the
// response headers is the router's (UpstreamHeaderTimeout), not the
// transport's: it depends on whether the request streams.
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:                  nil, // Tier-1s are reached directly, whatever HTTP_PROXY says
		DialContext:            (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:    5 * time.Second,
		MaxIdleConns:           1024,
		MaxIdleConnsPerHost:    256,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: maxResponseHeader,
		DisableCompression:     true, // bodies pass through as the pod wrote them
		ForceAttemptHTTP2:      true,
	}
}

// maxResponseHeader bounds a Tier-1's response headers: a response whose
// headers are larger fails the attempt.
const maxResponseHeader = 64 << 10

// prefixHash keys cluster-level prefix affinity: a hash of the prompt's
// first PrefixBlocks blocks of 256 characters (a shared system prompt).
func (r *Router) prefixHash(c *call) uint64 {
	if c.body == nil {
		return 0
	}
	var buf [1024]byte // the default 4 blocks, without allocating
	limit := 256 * r.cfg.PrefixBlocks
	text := request.AppendPromptHead(buf[:0], c.body, limit)
	n := min(len(text), limit)
	if n < 256 {
		return 0 // too short to be a shared prefix worth following
	}
	return xxhash.Sum64(text[:n]) | 1
}

// Causes of an attempt's end that Tier-2 decides itself.
var (
	errHeaderTimeout = errors.New("no response headers within the upstream response-header timeout")
	errStreamIdle    = errors.New("the stream was idle longer than the stream idle timeout")
	errShutdown      = errors.New("the front door is shutting down")
)

// forward is stage 6-8: choose clusters, send, fail over before the first
// byte, stream back with the public model name, account.
func (r *Router) forward(st *state, c *call, w http.ResponseWriter, req *http.Request) {
	var buf [8]regions.Target
	var sp trace.Span
	if c.span != nil {
		_, sp = r.cfg.Tracer.Start(req.Context(), "tier2.cluster_choice")
	}
	targets, body, e := r.prepare(st, c, buf[:0])
	if sp != nil {
		if len(targets) > 0 {
			sp.SetAttributes(attribute.Int("meridian.candidates", len(targets)), attribute.String("meridian.cluster", targets[0].Cluster),
				attribute.String("meridian.cluster_region", targets[0].Region))
		}
		endSpan(sp, e)
	}
	if e != nil {
		r.reject(st, c, e, w)
		return
	}
	r.attempts(st, c, w, req, targets, body)
}

// attempts sends the request to the targets in turn until one answers,
// and relays its response.
func (r *Router) attempts(st *state, c *call, w http.ResponseWriter, req *http.Request, targets []regions.Target, body sendBody) {
	budget := r.cfg.Fleet.Retries()
	budget.Request()
	var last *attemptErr
	for i, t := range targets {
		if i > 0 && !r.retry(budget, last) {
			break
		}
		resp, cancel, aerr := r.send(req.Context(), t, req, &body, c)
		if aerr != nil {
			if c.upstream != nil {
				r.endUpstream(c, aerr.status, aerr.reason)
			}
			r.cfg.Fleet.End(t, aerr.result)
			last = aerr
			if req.Context().Err() != nil {
				// The caller went away: nothing is answered (an empty 200
				// would read as a success to a client that half-closed).
				r.settle(c, 0)
				panic(http.ErrAbortHandler)
			}
			if errors.Is(aerr.cause, errShutdown) {
				r.settle(c, 0)
				w.Header().Set("Connection", "close")
				c.status = http.StatusServiceUnavailable
				request.Unavailable("shutting_down", "the front door is shutting down; retry the request").Write(w)
				return
			}
			r.log.Warn("tier2: cluster failed before responding; failing over", "cluster", t.Cluster, "region", t.Region, "reason", aerr.reason, "request_id", c.id)
			continue
		}
		r.served(c, targets[0], t)
		code := r.relay(w, resp, c, cancel)
		cancel(nil)
		if c.upstream != nil {
			r.endUpstream(c, code, "")
		}
		r.finished(st, c, t, code)
		return
	}
	e := r.exhausted(st, c, last)
	c.status = e.Status
	e.Write(w)
}

// endUpstream ends the current attempt's span with its status (0: none
// came) and, for a failed attempt, why.
func (r *Router) endUpstream(c *call, status int, reason string) {
	if status > 0 {
		c.upstream.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	if reason != "" {
		c.upstream.SetAttributes(attribute.String("error.type", reason))
		c.upstream.SetStatus(codes.Error, reason)
	}
	c.upstream.End()
	c.upstream = nil
}

// prepare is what forward does before the first attempt: the clusters to
// try, in order, and the body to send them. On error the request has been
// refunded and the error is for reject.
func (r *Router) prepare(st *state, c *call, buf []regions.Target) ([]regions.Target, sendBody, *request.APIError) {
	targets := r.cfg.Fleet.Select(buf, regions.Request{Model: c.resolved.Target, PrefixHash: r.prefixHash(c), Clusters: c.resolved.Clusters,
		Tokens: requestTokens(c)})
	// The prompt has been estimated, charged and hashed: only the raw body
	// and the model are read from here on.
	c.body.Release()
	if c.spill {
		targets = preferOtherRegions(targets, r.cfg.Region)
	}
	if len(targets) == 0 {
		r.refund(c)
		return nil, sendBody{}, request.Unavailable("no_cluster", fmt.Sprintf("no healthy cluster serves model %q", c.resolved.Target))
	}
	body := bodyOf(c.raw)
	// Every stream asks upstream for usage (vLLM's per-chunk
	// continuous_usage_stats and the final include_usage chunk), so that
	// token limits settle on what was relayed even when the stream ends
	// early; relay removes what the caller did not ask for. The caller's
	// wishes are read as JSON (request.Validate), the way upstream reads
	// them.
	// (A Response stream reports its usage in its response.completed
	// event, and counts one token per text delta before it.)
	if c.body.Stream && (c.kind == request.Chat || c.kind == request.Completion) {
		c.hideUsage = !c.params.IncludeUsage
		c.hideContinuous = !c.params.ContinuousUsage
	}
	if c.resolved.Target != c.body.Model || c.hideUsage || c.hideContinuous {
		var err error
		if body, err = rewriteBody(c.raw, c.body.Model, c.resolved.Target, c.hideUsage || c.hideContinuous, c.params.StreamOptions); err != nil {
			r.refund(c)
			return nil, sendBody{}, request.BadRequest("bad_request", err.Error())
		}
	}
	return targets, body, nil
}

// requestTokens is the request's length as a model server counts it
// against its max_model_len: the prompt estimate plus the output tokens
// asked for (none when max_tokens is unset: the server then fits the
// output to what is left).
func requestTokens(c *call) int {
	n := c.promptTokens + max(0, c.params.MaxTokens)
	return int(min(n, math.MaxInt32))
}

// retry decides whether another cluster may be tried after last failed,
// and counts it.
func (r *Router) retry(budget *regions.RetryBudget, last *attemptErr) bool {
	if !budget.Retry() {
		r.m.budgetExhausted.Inc()
		return false
	}
	r.m.retries.WithLabelValues(last.reason).Inc()
	return true
}

// served records that cluster t answered the request (first was the first
// choice).
func (r *Router) served(c *call, first, t regions.Target) {
	if t.Region != first.Region {
		r.m.failovers.WithLabelValues(first.Region, t.Region).Inc()
	}
	c.served = t
}

// finished counts a relayed response.
func (r *Router) finished(st *state, c *call, t regions.Target, code int) {
	c.status = code
	r.cfg.Fleet.End(t, regions.Success)
	r.m.request(requestLabels{st.modelLabel(c.body.Model), st.modelLabel(c.resolved.Target), t.Region, t.Cluster, statusLabel(code)}).Inc()
}

// exhausted is the answer when no cluster served the request (last: the
// last attempt's failure), counted. The tokens go back; the request stays
// charged: the clusters were tried, and the requests limit is what bounds
// a caller flooding clusters that fail.
func (r *Router) exhausted(st *state, c *call, last *attemptErr) *request.APIError {
	r.refundTokens(c)
	e := request.Unavailable("upstream_unavailable", fmt.Sprintf("every cluster serving %q failed before responding", c.resolved.Target))
	switch {
	case last != nil && last.status == http.StatusTooManyRequests:
		e = request.TooManyRequests("capacity", fmt.Sprintf("every cluster serving %q is at capacity", c.resolved.Target), 1)
	case last != nil && last.status == http.StatusGatewayTimeout:
		e = &request.APIError{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "upstream_timeout",
			Message: fmt.Sprintf("no cluster serving %q answered within %s", c.resolved.Target, r.headerTimeout(c))}
	}
	r.m.rejected.WithLabelValues(st.tenantLabel(c.caller.Tenant), c.band.String(), e.Code).Inc()
	r.m.request(requestLabels{st.modelLabel(c.body.Model), st.modelLabel(c.resolved.Target), "", "", statusLabel(e.Status)}).Inc()
	return e
}

// headerTimeout is how long an attempt waits for response headers. A
// model server answers a non-streaming request's headers only once the
// whole completion is done.
func (r *Router) headerTimeout(c *call) time.Duration {
	if c.body != nil && c.body.Stream {
		return r.cfg.UpstreamHeaderTimeout
	}
	return r.cfg.UpstreamResponseTimeout
}

// retryable classifies a failed attempt before the first response byte.
type attemptErr struct {
	reason string // connect, timeout, 5xx, 429
	status int
	result regions.Result
	cause  error
}

// send tries one cluster. A response is returned only when it may be
// relayed: connect errors, timeouts, 5xx and 429 come back as attemptErr.
// The attempt's context ends with cancel (or a timeout, or Abort).
func (r *Router) send(ctx context.Context, t regions.Target, in *http.Request, body *sendBody, c *call) (*http.Response, context.CancelCauseFunc, *attemptErr) {
	r.cfg.Fleet.Begin(t)
	actx, cancel := context.WithCancelCause(ctx)
	stopAbort := context.AfterFunc(r.stopping, func() { cancel(errShutdown) })
	done := func(err error) { stopAbort(); cancel(err) }
	out, err := http.NewRequestWithContext(actx, http.MethodPost, strings.TrimSuffix(t.Tier1, "/")+in.URL.Path, nil)
	if err != nil {
		done(err)
		return nil, nil, &attemptErr{reason: "connect", result: regions.Failure, cause: err}
	}
	// A body in one piece of memory leaves with the request headers in
	// one write: net/http flushes the headers on their own before any
	// other kind of body, and writes each piece separately, and every
	// write on the way to a Tier-1 is a wake-up on both sides.
	if b := body.joined(); b != nil {
		out.Body = io.NopCloser(bytes.NewReader(b))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil } // a stale keep-alive connection is retried
	} else {
		out.Body = body.reader()
		out.GetBody = func() (io.ReadCloser, error) { return body.reader(), nil }
	}
	r.upstreamHeader(out.Header, in.Header, c)
	if c.span != nil {
		var span trace.Span
		actx, span = r.cfg.Tracer.Start(actx, "tier2.upstream", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("meridian.cluster", t.Cluster), attribute.String("meridian.cluster_region", t.Region),
				attribute.String("server.address", t.Tier1)))
		c.upstream = span
		out = out.WithContext(actx)
		tracing.Inject(actx, out.Header)
	}
	out.ContentLength = body.size()
	c.watch.arm(r.headerTimeout(c), cancel)
	resp, err := r.cfg.Transport.RoundTrip(out)
	if err != nil || resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		c.watch.stop()
	}
	if err != nil {
		cause := context.Cause(actx)
		done(err)
		switch {
		case errors.Is(cause, errHeaderTimeout):
			return nil, nil, &attemptErr{reason: "timeout", status: http.StatusGatewayTimeout, result: regions.Failure, cause: cause}
		case errors.Is(cause, errShutdown):
			return nil, nil, &attemptErr{reason: "shutdown", result: regions.Failure, cause: cause}
		}
		reason := "connect"
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			reason = "timeout"
		}
		return nil, nil, &attemptErr{reason: reason, result: regions.Failure, cause: err}
	}
	switch {
	case resp.StatusCode >= 500:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		done(nil)
		return nil, nil, &attemptErr{reason: "5xx", status: resp.StatusCode, result: regions.Failure}
	case resp.StatusCode == http.StatusTooManyRequests:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		done(nil)
		return nil, nil, &attemptErr{reason: "429", status: resp.StatusCode, result: regions.Overloaded}
	}
	return resp, done, nil
}

// upstreamHeader fills out with the headers a request to Tier-1 carries:
// the caller's that are passed on, and the identity Tier-2 vouches for.
func (r *Router) upstreamHeader(out, in http.Header, c *call) {
	for k, vs := range in {
		if passedOn(k) {
			out[k] = vs
		}
	}
	// Set as Header.Set does (the keys are canonical), with one array
	// for the values.
	band := c.band.String()
	vals := [...]string{c.caller.Tenant, band, ""}
	out["X-Meridian-Tenant"] = vals[0:1:1]
	out["X-Meridian-Band"] = vals[1:2:2]
	out["X-Gateway-Inference-Fairness-Id"] = vals[0:1:1]
	if r.cfg.Tier1Key != nil {
		vals[2] = trust.Sign(r.cfg.Tier1Key, c.caller.Tenant, band, r.cfg.Now())
		out[trust.Header] = vals[2:3:3]
	}
}

// passedOn says whether a caller's request header goes on to Tier-1: not
// the credential (nor the claim it replaces), nor the hop-by-hop headers.
func passedOn(k string) bool {
	switch k {
	// Expect: the front door has answered 100-continue itself and read the
	// body; a Tier-1's interim 100 is no answer to relay.
	case "Authorization", "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Expect", insecureCriticality:
		return false
	}
	return true
}

// responseHeader adds to h what the caller sees of a Tier-1's response
// headers, and the cluster that served it. A header Tier-2 set itself
// (h has it already: the rate limits) keeps Tier-2's value.
func (r *Router) responseHeader(h, up http.Header, c *call) {
	for k, vs := range up {
		if _, set := h[k]; set || !passedBack(k, r.cfg.ExposeUpstream) {
			continue
		}
		h[k] = vs
	}
	c.servedHdr = [...]string{c.served.Region, c.served.Cluster} // h.Set, without a slice each
	h["X-Meridian-Region"] = c.servedHdr[0:1:1]
	h["X-Meridian-Cluster"] = c.servedHdr[1:2:2]
}

// passedBack reports whether a Tier-1's response header (canonical key)
// reaches the caller: not one of a hop or of the framing, not the
// cluster's identity (Tier-2 writes its own), and not the serving pod's
// address unless expose.
func passedBack(k string, expose bool) bool {
	switch k {
	case "Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length", "X-Meridian-Region", "X-Meridian-Cluster":
		return false
	case "X-Gateway-Destination-Endpoint-Served", "X-Gateway-Destination-Endpoint":
		return expose
	}
	return true
}

// rateLimitHeader reports whether k (canonical) is one of the rate
// limiter's headers.
func rateLimitHeader(k string) bool {
	switch k {
	case "X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests",
		"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens", "Retry-After", "Retry-After-Ms":
		return true
	}
	return false
}

// relay streams a response back, rewriting the model name to the public
// one and counting what it relays for token accounting. It returns the
// status. cancel ends the upstream attempt (a stream idle too long).
func (r *Router) relay(w http.ResponseWriter, resp *http.Response, c *call, cancel context.CancelCauseFunc) int {
	defer resp.Body.Close()
	r.responseHeader(w.Header(), resp.Header, c)
	w.WriteHeader(resp.StatusCode)
	first := false
	// markFirst observes the first byte; streamed says whether the answer
	// is an event stream (otherwise its first byte is its last).
	markFirst := func(streamed string) {
		if !first {
			first = true
			r.m.firstByte(ttftLabels{c.resolved.Public, c.resolved.Target, streamed}).Observe(r.cfg.Now().Sub(c.start).Seconds())
		}
	}
	rc := http.NewResponseController(w)
	rename := c.resolved.Target != c.resolved.Public
	var from, to []byte
	if rename {
		from, to = renamePair(c)
	}
	idle := &c.watch
	idle.streaming(r.cfg.StreamIdleTimeout)
	defer idle.stop()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		markFirst("false")
		if rename {
			b = bytes.Replace(b, from, to, 1)
		}
		w.Write(b)
		if err != nil {
			r.settle(c, 0)
			// The abort skips what forward does after relay: the
			// attempt's context and the cluster's in-flight count end here.
			cancel(nil)
			r.cfg.Fleet.End(c.served, regions.Success)
			panic(http.ErrAbortHandler)
		}
		r.settle(c, usageTokens(b))
		return resp.StatusCode
	}
	// Server-sent events: one event at a time, flushed at once.
	rr := r.readers.Get().(*relayReader)
	rr.src = resp.Body
	rr.eof = false
	br := rr.br
	br.Reset(rr)
	defer func() { br.Reset(nil); rr.src = nil; r.readers.Put(rr) }()
	acct := streamAccount{responses: c.kind == request.Response}
	filter := newEventFilter(c)
	// pending: bytes written since the last flush. They are flushed
	// before any read that would wait on the network (nothing complete is
	// buffered), not after every event: events that arrived together
	// leave in one write, as nginx relays them, and none waits behind a
	// read.
	pending := false
	// done: "data: [DONE]" was relayed.
	done := false
	// buffered: a whole line is in br, so the next ReadSlice does not
	// wait on the network (and is no progress for the idle timer).
	buffered := false
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// An event line longer than the buffer: pass it through whole.
			if pending {
				if rc.Flush() != nil {
					r.settle(c, acct.tokens(c))
					return resp.StatusCode
				}
				pending = false
			}
			rest, _ := br.ReadBytes('\n')
			line = append(append([]byte(nil), line...), rest...)
			err = nil
		}
		if err == nil && !buffered {
			idle.touch()
		}
		if len(line) > 0 {
			markFirst("true")
			var ev streamEvent
			var drop bool
			line, ev, drop = filter.line(&acct, line)
			if drop {
				acct.commit(ev)
			} else {
				if _, werr := w.Write(line); werr != nil {
					r.settle(c, acct.tokens(c))
					return resp.StatusCode
				}
				acct.commit(ev)
				pending = true
			}
			if !done && bytes.HasPrefix(line, doneLine) {
				// The stream's last event: upstream ends next. It leaves
				// with the response's end, in one write, unless upstream
				// does not end within doneGrace.
				done = true
				idle.streaming(doneGrace)
			}
		}
		// Once upstream has ended, what is left is in br: nothing waits
		// on the network again, and the last events leave with the
		// response's end in one write when the handler returns.
		buffered = err == nil && (rr.eof || done || lineBuffered(br))
		if pending && err == nil && !buffered {
			if rc.Flush() != nil {
				r.settle(c, acct.tokens(c))
				return resp.StatusCode
			}
			pending = false
		}
		if err == io.EOF {
			r.settle(c, acct.tokens(c))
			return resp.StatusCode
		}
		if err != nil && done {
			// After [DONE] the answer is whole: what upstream does next
			// (not ending in time, failing) is none of the caller's.
			rc.Flush()
			r.settle(c, acct.tokens(c))
			return resp.StatusCode
		}
		if err != nil {
			// After the first byte, never retry: end the stream with an
			// error event the OpenAI SDKs surface.
			msg, code := "the upstream cluster failed mid-stream", "upstream_failed"
			switch cause := context.Cause(resp.Request.Context()); {
			case errors.Is(cause, errStreamIdle):
				msg, code = fmt.Sprintf("the upstream stream sent nothing for %s", r.cfg.StreamIdleTimeout), "stream_idle_timeout"
			case errors.Is(cause, errShutdown):
				msg, code = "the front door is shutting down; retry the request", "shutting_down"
			}
			w.Write([]byte(`data: {"error":{"message":"` + msg + `","type":"server_error","param":null,"code":"` + code + `"}}` + "\n\n"))
			rc.Flush()
			r.settle(c, acct.tokens(c))
			return resp.StatusCode
		}
	}
}

// doneLine starts the last event of an OpenAI stream.
var doneLine = []byte("data: [DONE]")

// doneGrace is how long relay waits, after the stream's last event, for
// upstream to end before it sends the caller what it holds and ends the
// attempt.
const doneGrace = time.Second

// renamePair is what relay replaces in a response: the target model's
// name by the public one the caller asked for.
func renamePair(c *call) (from, to []byte) {
	return []byte(`"model":"` + c.resolved.Target + `"`), []byte(`"model":"` + c.resolved.Public + `"`)
}

// eventFilter is relay's work on one event-stream line, shared by both
// front doors: the public model name, the usage accounting, and dropping
// the usage chunks the caller did not ask for (with the blank line that
// ends each).
type eventFilter struct {
	from, to            []byte // nil: no rename
	hideFinal, hideCont bool
	skipBlank           bool
}

func newEventFilter(c *call) eventFilter {
	f := eventFilter{hideFinal: c.hideUsage, hideCont: c.hideContinuous}
	if c.resolved.Target != c.resolved.Public {
		f.from, f.to = renamePair(c)
	}
	return f
}

// line returns the line to relay and what it adds to acct; drop: the line
// is not relayed. Either way the event is committed (acct.commit) once the
// line is written or dropped.
func (f *eventFilter) line(acct *streamAccount, line []byte) ([]byte, streamEvent, bool) {
	var ev streamEvent
	drop := false
	if bytes.HasPrefix(line, []byte("data: {")) {
		if f.from != nil {
			line = bytes.Replace(line, f.from, f.to, 1)
		}
		line, ev = acct.read(line, f.hideFinal, f.hideCont)
		drop = ev.drop
		f.skipBlank = drop
	} else if f.skipBlank && len(bytes.TrimSpace(line)) == 0 {
		drop, f.skipBlank = true, false
	}
	return line, ev, drop
}

// statusLabel is fmt.Sprint(code) without allocating for the usual codes.
func statusLabel(code int) string {
	switch code {
	case http.StatusOK:
		return "200"
	case http.StatusTooManyRequests:
		return "429"
	}
	return strconv.Itoa(code)
}

// rateLimitKeys are ratelimit.Decision.Headers' keys in canonical form.
var rateLimitKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
		"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens", "retry-after", "retry-after-ms"} {
		m[k] = http.CanonicalHeaderKey(k)
	}
	return m
}()

// headerSetter is h.Set for ratelimit.Decision.Headers without
// canonicalizing its known keys per request, and one array for the values.
func headerSetter(h http.Header) func(k, v string) {
	vals := make([]string, 0, len(rateLimitKeys))
	return func(k, v string) {
		ck, ok := rateLimitKeys[k]
		if !ok || len(vals) == cap(vals) {
			h.Set(k, v)
			return
		}
		vals = append(vals, v)
		h[ck] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
}

// relayReader is a pooled event-stream reader over an upstream body that
// remembers when the body reported its end, so the relay knows that no
// later read waits on the network.
type relayReader struct {
	br  *bufio.Reader // reads from the relayReader itself
	src io.Reader
	eof bool
}

func (rr *relayReader) Read(p []byte) (int, error) {
	n, err := rr.src.Read(p)
	rr.eof = rr.eof || err == io.EOF
	return n, err
}

// lineBuffered reports whether br holds a whole line: the next ReadSlice
// returns it without reading from the network.
func lineBuffered(br *bufio.Reader) bool {
	n := br.Buffered()
	if n == 0 {
		return false
	}
	b, _ := br.Peek(n)
	return bytes.IndexByte(b, '\n') >= 0
}

// refund gives back what admission charged (one request and the token
// estimate) for a request no cluster was even tried for (none serves the
// model, or its body could not be forwarded): a tenant is charged only for
// what it was served.
func (r *Router) refund(c *call) {
	if c.settled || !c.forwarded {
		return
	}
	c.settled = true
	if r.cfg.Limiter == nil || !c.rl.Allowed {
		return
	}
	r.cfg.Limiter.Refund(c.rl.Ticket)
}

// refundTokens gives back the token estimate of a request that clusters
// were tried for but none served; its request unit stays charged.
func (r *Router) refundTokens(c *call) {
	if c.settled || !c.forwarded {
		return
	}
	c.settled = true
	if r.cfg.Limiter == nil || !c.rl.Allowed {
		return
	}
	r.cfg.Limiter.Settle(c.rl.Ticket, 0) // exactly 0 used: the whole estimate back
}

// settle reconciles the token estimate charged at admission with the
// tokens served (0: unknown; the prompt estimate stands).
func (r *Router) settle(c *call, used int64) {
	if c.settled || !c.forwarded {
		return
	}
	c.settled = true
	if used <= 0 {
		used = c.promptTokens
	}
	c.charged = used
	if c.caller != nil {
		r.m.charge(c.chargeLabel).Add(float64(used))
	}
	if r.cfg.Limiter == nil || !c.rl.Allowed {
		return
	}
	r.cfg.Limiter.Settle(c.rl.Ticket, used)
}

// usageTokens reads usage.total_tokens from a response or event JSON
// without decoding it: this runs on the response path of every request.
func usageTokens(b []byte) int64 {
	u, _, _, ok := findUsage(b)
	if !ok {
		return 0
	}
	return u.total
}

// sendBody is a request body sent upstream as pieces: the caller's bytes
// around Tier-2's edits, so that a long prompt is never copied.
type sendBody struct {
	parts [5][]byte
	n     int
	whole []byte // the pieces joined, once (joined)
}

// joinLimit bounds the body joined into one buffer before it is sent: a
// longer one (a long prompt) is sent as its pieces, where the copy would
// cost more than the writes it saves.
const joinLimit = 64 << 10

// joined returns the body as one slice (the piece itself when there is
// one, a copy made once otherwise), or nil when it is longer than
// joinLimit.
func (s *sendBody) joined() []byte {
	switch {
	case s.n == 1:
		return s.parts[0]
	case s.whole != nil:
		return s.whole
	case s.n == 0 || s.size() > joinLimit:
		return nil
	}
	s.whole = make([]byte, 0, s.size())
	for _, p := range s.parts[:s.n] {
		s.whole = append(s.whole, p...)
	}
	return s.whole
}

func bodyOf(b []byte) sendBody {
	var s sendBody
	s.add(b)
	return s
}

func (s *sendBody) add(b []byte) {
	if len(b) > 0 {
		s.parts[s.n] = b
		s.n++
	}
}

func (s *sendBody) size() int64 {
	var n int64
	for _, p := range s.parts[:s.n] {
		n += int64(len(p))
	}
	return n
}

// bytes joins the pieces (tests).
func (s *sendBody) bytes() []byte {
	var out []byte
	for _, p := range s.parts[:s.n] {
		out = append(out, p...)
	}
	return out
}

// reader reads the pieces in order.
func (s *sendBody) reader() *partsReader {
	return &partsReader{parts: s.parts, n: s.n}
}

// partsReader is an io.ReadCloser and io.WriterTo over a sendBody.
type partsReader struct {
	parts [5][]byte
	i, n  int
}

func (r *partsReader) Read(p []byte) (int, error) {
	for r.i < r.n && len(r.parts[r.i]) == 0 {
		r.i++
	}
	if r.i == r.n {
		return 0, io.EOF
	}
	k := copy(p, r.parts[r.i])
	r.parts[r.i] = r.parts[r.i][k:]
	return k, nil
}

func (r *partsReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for ; r.i < r.n; r.i++ {
		k, err := w.Write(r.parts[r.i])
		total += int64(k)
		r.parts[r.i] = r.parts[r.i][k:]
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

func (r *partsReader) Close() error { return nil }

// rewriteBody returns body with its "model" replaced by model and, when
// askUsage, stream_options asking for usage in every chunk and at the end.
// hasOptions says the body has a stream_options object (request.Params).
// The common cases are pieces of the original around the edits (a body
// may be megabytes of prompt); anything unusual goes through a full
// decode.
func rewriteBody(body []byte, public, model string, askUsage, hasOptions bool) (sendBody, error) {
	var out sendBody
	// hasOptions is the last top-level "stream_options" (request.Validate
	// reads duplicated keys as upstream does): when it is an object the
	// caller's options are merged; otherwise the object appended last
	// below is the one upstream reads. Either way no scan of a long body.
	if askUsage && hasOptions {
		return rewriteBodySlow(body, model, askUsage)
	}
	// Appended last: with duplicated keys the last one wins, in Go and in
	// Python alike. The body is a JSON object (it was parsed), so its
	// last '}' closes it, after every member.
	end := len(body)
	if askUsage {
		if end = bytes.LastIndexByte(body, '}'); end < 0 {
			return out, errors.New("malformed JSON body: not an object")
		}
	}
	rest := body[:end]
	if model != public {
		q, _ := json.Marshal(public)
		from := append([]byte(`"model":`), q...)
		i := bytes.Index(rest, from)
		if i < 0 || bytes.Contains(body[i+len(from):], from) {
			return rewriteBodySlow(body, model, askUsage)
		}
		to, _ := json.Marshal(model)
		out.add(rest[:i])
		out.add(append([]byte(`"model":`), to...))
		rest = rest[i+len(from):]
	}
	out.add(rest)
	if askUsage {
		out.add([]byte(`,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`))
		out.add(body[end:])
	}
	return out, nil
}

// rewriteBodySlow is rewriteBody by a full decode and encode.
func rewriteBodySlow(body []byte, model string, askUsage bool) (sendBody, error) {
	b, err := rewriteBodyDecoded(body, model, askUsage)
	return bodyOf(b), err
}

func rewriteBodyDecoded(body []byte, model string, askUsage bool) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("malformed JSON body: %w", err)
	}
	q, _ := json.Marshal(model)
	m["model"] = q
	if askUsage {
		opts := map[string]json.RawMessage{}
		if raw, ok := m["stream_options"]; ok && string(raw) != "null" {
			if err := json.Unmarshal(raw, &opts); err != nil {
				return nil, fmt.Errorf(`"stream_options" must be an object: %w`, err)
			}
		}
		opts["include_usage"] = json.RawMessage("true")
		opts["continuous_usage_stats"] = json.RawMessage("true")
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

// watchdog ends an attempt that waits too long: for its response headers,
// then (streaming) between the events of its stream. One timer serves
// both, per call. Progress is recorded with touch, a clock read and an
// atomic store per network read; the timer is re-armed only when it fires
// early (Timer.Reset on every event cost more than the rest of the event's
// accounting).
type watchdog struct {
	base   time.Time
	limit  atomic.Int64 // the silence allowed now, ns
	last   atomic.Int64 // time.Since(base) at the last progress
	phase  atomic.Int32 // 0 stopped, phaseHeaders, phaseStream
	cancel atomic.Pointer[context.CancelCauseFunc]
	t      *time.Timer // set by the first arm, before the timer can fire
}

const (
	phaseHeaders = 1 + iota
	phaseStream
)

// arm starts watching an attempt's wait for response headers, d at most.
func (w *watchdog) arm(d time.Duration, cancel context.CancelCauseFunc) {
	if w.base.IsZero() {
		w.base = time.Now()
	}
	w.cancel.Store(&cancel)
	w.last.Store(int64(time.Since(w.base)))
	w.limit.Store(int64(d))
	w.phase.Store(phaseHeaders)
	if w.t == nil {
		w.t = time.AfterFunc(time.Duration(1<<62), w.fire) // armed below, once w.t is set
	}
	w.t.Reset(d)
}

// streaming switches to watching the stream: d of silence at most.
func (w *watchdog) streaming(d time.Duration) {
	w.limit.Store(int64(d))
	w.touch()
	w.phase.Store(phaseStream)
	w.t.Reset(d)
}

func (w *watchdog) touch() { w.last.Store(int64(time.Since(w.base))) }

func (w *watchdog) stop() {
	w.phase.Store(0)
	if w.t != nil {
		w.t.Stop()
	}
}

func (w *watchdog) fire() {
	phase := w.phase.Load()
	if phase == 0 {
		return
	}
	limit := time.Duration(w.limit.Load())
	if idle := time.Since(w.base) - time.Duration(w.last.Load()); idle < limit {
		w.t.Reset(limit - idle)
		return
	}
	cause := errHeaderTimeout
	if phase == phaseStream {
		cause = errStreamIdle
	}
	(*w.cancel.Load())(cause)
}
