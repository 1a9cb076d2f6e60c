// Package proxy is Tier-1's standalone streaming reverse proxy: for
// clusters without an Envoy-based Gateway it receives OpenAI requests,
// asks the gateway to admit each by priority band (waiting while its pool
// is saturated, or answering 429 with Retry-After) and then for a primary
// endpoint and fallbacks, and forwards, retrying the fallbacks in order on
// a connect error, a 5xx or a 404 (a model or adapter that pod does not
// serve) before the first response byte. Server-sent events are flushed
// one by one.
package proxy

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/meridian-router/meridian/internal/tracing"
	"github.com/meridian-router/meridian/request"
	"github.com/meridian-router/meridian/tier1/gateway"
)

// Proxy forwards inference requests to the endpoints the gateway picks.
// Its zero fields take the defaults in their comments. It must not be
// copied after first use.
type Proxy struct {
	// Gateway decides where each request goes. Required.
	Gateway *gateway.Gateway
	// Transport carries requests to the pods. Nil means a pooled HTTP/1.1
	// transport tuned for many concurrent streams to few hosts.
	Transport http.RoundTripper
	// MaxBodyBytes limits request bodies. Zero means request.DefaultMaxBytes
	// (4 MiB).
	MaxBodyBytes int64
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Tracer, when set, traces every inference request (internal/tracing):
	// a server span continuing the caller's (Tier-2's) traceparent, a span
	// for admission and the pod choice, and one for each upstream attempt,
	// whose context goes to the pod as traceparent. Nil (the default): no
	// spans, and the caller's traceparent goes on to the pod unchanged.
	Tracer trace.Tracer
	// AccessLog, when set, gets one line per inference request at its end
	// (request id, model, pool, pod, status, duration). Nil: none.
	AccessLog *slog.Logger

	once sync.Once
	bufs sync.Pool
}

func (p *Proxy) init() {
	p.once.Do(func() {
		if p.Transport == nil {
			p.Transport = NewTransport()
		}
		if p.Logger == nil {
			p.Logger = slog.Default()
		}
		p.bufs.New = func() any { b := new([32 << 10]byte); return b }
	})
}

// NewTransport returns the transport the proxy uses by default: keep-alive
// connections, many per host (a pod serves many concurrent streams), no
// compression negotiation (bodies pass through untouched), and a connect
// timeout short enough to fail over quickly.
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // a long prefill is not a failure
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
}

// Handler returns the proxy's routes: the OpenAI inference endpoints,
// /v1/models, /healthz and /readyz.
func (p *Proxy) Handler() http.Handler {
	p.init()
	mux := http.NewServeMux()
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"} {
		mux.HandleFunc("POST "+path, p.serveInference)
	}
	mux.HandleFunc("GET /v1/models", p.serveModels)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", p.serveReady)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		request.NotFound("not_found", "no route for "+r.Method+" "+r.URL.Path).Write(w)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		request.CloseAfterChunked(w, r)
		if r.Method != http.MethodPost || request.KindOf(r.URL.Path) == 0 {
			request.UseID(r.Header, w.Header()) // serveInference keeps its id in its exchange
		}
		mux.ServeHTTP(w, r)
	})
}

// exchange is one inference request's state that outlives the handler's
// stack: its id and the served header's value, in one allocation.
type exchange struct {
	id     request.ID
	served [1]string
	start  time.Time
	status int
	pod    string
	span   trace.Span // nil: not traced
}

func (p *Proxy) serveReady(w http.ResponseWriter, _ *http.Request) {
	for _, v := range p.Gateway.Pools() {
		for _, ep := range v.Pool.Endpoints() {
			if ep.Ready() && ep.Metrics() != nil {
				io.WriteString(w, "ready\n")
				return
			}
		}
	}
	request.Unavailable("not_ready", "no pool has a scraped endpoint yet").Write(w)
}

func (p *Proxy) serveModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		OwnedBy string `json:"owned_by"`
		Created int64  `json:"created"`
	}
	var data []model
	for _, m := range p.Gateway.Models() {
		data = append(data, model{ID: m, Object: "model", OwnedBy: "meridian"})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (p *Proxy) serveInference(w http.ResponseWriter, r *http.Request) {
	x := &exchange{}
	x.id.Take(r.Header)
	w.Header()[request.HeaderID] = x.id.Values()
	if p.Tracer != nil || p.AccessLog != nil {
		x.start = time.Now()
		if p.Tracer != nil {
			r = p.traceRequest(x, r)
		}
		defer p.finish(x, r)
	}
	kind := request.KindOf(r.URL.Path)
	body, raw, err := request.ReadSizedAs(r.Body, r.ContentLength, p.MaxBodyBytes, kind)
	if err != nil {
		p.Gateway.Reject("bad_request")
		x.fail(w, request.BodyError(err))
		return
	}
	// Admission by band first; the pod is picked when the request leaves
	// the queue.
	var sp trace.Span
	if x.span != nil {
		_, sp = p.Tracer.Start(r.Context(), "tier1.pod_choice")
	}
	d, err := p.Gateway.Route(r.Context(), body, gateway.Meta{Header: r.Header, Bytes: int64(len(raw))})
	body.Release() // scheduled: only the model is read from here on
	if sp != nil {
		endPodChoice(sp, d, err)
	}
	if err != nil {
		if r.Context().Err() != nil {
			return // the caller went away while waiting
		}
		var ae *request.APIError
		if !errors.As(err, &ae) {
			ae = request.Unavailable("internal", err.Error())
		}
		x.fail(w, ae)
		return
	}
	defer d.Release()
	if d.Rewrite != "" {
		if raw, err = request.WithModel(raw, body.Model, d.Rewrite); err != nil {
			x.fail(w, request.BadRequest("invalid_body", err.Error()))
			return
		}
	}
	for i := range d.Endpoints {
		last := i == len(d.Endpoints)-1
		done, retry := p.try(w, r, raw, d, i, last, x)
		if done {
			return
		}
		if !retry {
			break
		}
		p.Gateway.Fallback(d)
	}
	x.fail(w, request.Unavailable("upstream_unavailable", "every endpoint of model "+d.Target+" failed before responding"))
}

// servedKey is gateway.HeaderServed in canonical form.
var servedKey = http.CanonicalHeaderKey(gateway.HeaderServed)

// fail answers e and records its status.
func (x *exchange) fail(w http.ResponseWriter, e *request.APIError) {
	x.status = e.Status
	e.Write(w)
}

// traceRequest starts the request's server span, continuing the caller's
// traceparent, and returns r with it in its context.
func (p *Proxy) traceRequest(x *exchange, r *http.Request) *http.Request {
	ctx, span := p.Tracer.Start(tracing.Extract(r.Context(), r.Header), "tier1 "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path),
			attribute.String("meridian.request_id", x.id.Values()[0])))
	x.span = span
	return r.WithContext(ctx)
}

// endPodChoice ends the pod choice's span with the decision or the error.
func endPodChoice(sp trace.Span, d *gateway.Decision, err error) {
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
	} else {
		sp.SetAttributes(attribute.String("gen_ai.request.model", d.Model), attribute.String("meridian.pool", d.Pool),
			attribute.Int("meridian.endpoints", len(d.Endpoints)))
		if len(d.Endpoints) > 0 {
			sp.SetAttributes(attribute.String("meridian.pod", d.Endpoints[0].Address))
		}
	}
	sp.End()
}

// finish ends a traced request's span and writes its access-log line.
func (p *Proxy) finish(x *exchange, r *http.Request) {
	if x.span != nil {
		x.span.SetAttributes(attribute.Int("http.response.status_code", x.status), attribute.String("meridian.pod", x.pod))
		if x.status >= 500 {
			x.span.SetStatus(codes.Error, http.StatusText(x.status))
		}
		x.span.End()
	}
	if p.AccessLog != nil {
		p.AccessLog.Info("request", "request_id", x.id.Values()[0], "path", r.URL.Path, "status", x.status, "pod", x.pod,
			"duration", time.Since(x.start))
	}
}

// try sends the request to d.Endpoints[i]. It reports done when a response
// (success or final failure) was written, and retry when the failure
// happened before the first response byte and another endpoint may be
// tried.
func (p *Proxy) try(w http.ResponseWriter, r *http.Request, raw []byte, d *gateway.Decision, i int, last bool, x *exchange) (done, retry bool) {
	ep := d.Endpoints[i]
	att := p.Gateway.Dispatch(d, ep)
	ctx := r.Context()
	var span trace.Span
	if x.span != nil {
		ctx, span = p.Tracer.Start(ctx, "tier1.upstream", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("meridian.pod", ep.Address), attribute.String("meridian.pool", d.Pool)))
		defer span.End()
	}
	// The URL is set field by field: a string of it would be one more
	// allocation per request, parsed again at once.
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, "", bytes.NewReader(raw))
	if err != nil {
		att.Done(0, true)
		return false, !last
	}
	out.URL.Scheme, out.URL.Host, out.URL.Path, out.URL.RawPath, out.URL.RawQuery = "http", ep.Address, r.URL.Path, r.URL.RawPath, r.URL.RawQuery
	copyHeader(out.Header, r.Header)
	out.Header[request.HeaderID] = x.id.Values()
	if span != nil {
		tracing.Inject(ctx, out.Header)
	}
	out.ContentLength = int64(len(raw))
	resp, err := p.Transport.RoundTrip(out)
	if err != nil {
		if r.Context().Err() != nil {
			att.Done(0, false) // the caller went away
			return true, false
		}
		att.Done(0, true)
		if span != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		p.Logger.Warn("tier1: endpoint failed before responding", "endpoint", ep.Address, "pool", d.Pool, "error", err, "request_id", x.id.Values()[0])
		return false, !last
	}
	defer resp.Body.Close()
	if span != nil {
		span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	}
	if resp.StatusCode >= 500 && !last {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		att.Done(resp.StatusCode, true)
		p.Logger.Warn("tier1: endpoint answered 5xx; trying the next", "endpoint", ep.Address, "pool", d.Pool, "status", resp.StatusCode, "request_id", x.id.Values()[0])
		return false, true
	}
	if resp.StatusCode == http.StatusNotFound && !last {
		// vLLM answers 404 for a model or LoRA adapter it does not serve
		// (one registered on some pods only, or not yet re-listed by
		// /v1/models): another pod of the pool may serve it. Not a failure
		// of the pod.
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		att.Done(resp.StatusCode, false)
		p.Logger.Info("tier1: endpoint does not serve the model; trying the next", "endpoint", ep.Address, "pool", d.Pool, "model", d.Model)
		return false, true
	}
	h := w.Header()
	copyHeader(h, resp.Header)
	x.served[0], x.pod, x.status = ep.Address, ep.Address, resp.StatusCode
	h[servedKey] = x.served[:1:1] // h.Set, without a slice
	w.WriteHeader(resp.StatusCode)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	err = p.stream(w, resp.Body, att, sse)
	switch {
	case err == nil:
		att.Done(resp.StatusCode, resp.StatusCode >= 500)
	case r.Context().Err() != nil:
		att.Done(resp.StatusCode, false)
	default:
		att.Done(0, true)
		p.Logger.Warn("tier1: stream failed after the first byte", "endpoint", ep.Address, "pool", d.Pool, "error", err, "request_id", x.id.Values()[0])
		if sse {
			// The status is sent: end the stream with an error event the
			// OpenAI SDKs surface, then stop.
			io.WriteString(w, `data: {"error":{"message":"the model server failed mid-stream","type":"server_error","param":null,"code":"upstream_failed"}}`+"\n\n")
			http.NewResponseController(w).Flush()
			return true, false
		}
		panic(http.ErrAbortHandler)
	}
	return true, false
}

// stream copies the response, flushing after every read for event
// streams, and reports the first byte.
func (p *Proxy) stream(w http.ResponseWriter, body io.Reader, att *gateway.Attempt, flush bool) error {
	bp := p.bufs.Get().(*[32 << 10]byte)
	defer p.bufs.Put(bp)
	buf := bp[:]
	rc := http.NewResponseController(w)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			att.FirstByte()
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if flush {
				if ferr := rc.Flush(); ferr != nil {
					return ferr
				}
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Hop-by-hop headers are not forwarded (RFC 9110 §7.6.1), nor Expect:
// the proxy has answered 100-continue itself and read the body, and a
// pod's interim 100 is no answer to relay.
var hopHeaders = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true, "Expect": true,
}

// copyHeader copies src's headers into dst but the hop-by-hop ones and
// x-request-id, which the proxy sets itself both ways.
func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		if hopHeaders[k] || k == request.HeaderID {
			continue
		}
		dst[k] = append(dst[k][:0:0], vs...)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = jsonEncode(w, v)
}
