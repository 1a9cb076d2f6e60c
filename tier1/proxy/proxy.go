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
	mux.HandleFunc("POST /v1/chat/completions", p.serveInference)
	mux.HandleFunc("POST /v1/completions", p.serveInference)
	mux.HandleFunc("GET /v1/models", p.serveModels)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", p.serveReady)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		request.NotFound("not_found", "no route for "+r.Method+" "+r.URL.Path).Write(w)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		request.CloseAfterChunked(w, r)
		mux.ServeHTTP(w, r)
	})
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
	body, raw, err := request.ReadSized(r.Body, r.ContentLength, p.MaxBodyBytes)
	if err != nil {
		p.Gateway.Reject("bad_request")
		request.BodyError(err).Write(w)
		return
	}
	// Admission by band first; the pod is picked when the request leaves
	// the queue.
	d, err := p.Gateway.Route(r.Context(), body, gateway.Meta{Header: r.Header, Bytes: int64(len(raw))})
	body.Release() // scheduled: only the model is read from here on
	if err != nil {
		if r.Context().Err() != nil {
			return // the caller went away while waiting
		}
		writeErr(w, err)
		return
	}
	defer d.Release()
	if d.Rewrite != "" {
		if raw, err = request.WithModel(raw, body.Model, d.Rewrite); err != nil {
			request.BadRequest("invalid_body", err.Error()).Write(w)
			return
		}
	}
	for i, ep := range d.Endpoints {
		last := i == len(d.Endpoints)-1
		done, retry := p.try(w, r, raw, d, i, last)
		if done {
			return
		}
		if !retry {
			break
		}
		p.Gateway.Fallback(d)
		_ = ep
	}
	request.Unavailable("upstream_unavailable", "every endpoint of model "+d.Target+" failed before responding").Write(w)
}

// try sends the request to d.Endpoints[i]. It reports done when a response
// (success or final failure) was written, and retry when the failure
// happened before the first response byte and another endpoint may be
// tried.
func (p *Proxy) try(w http.ResponseWriter, r *http.Request, raw []byte, d *gateway.Decision, i int, last bool) (done, retry bool) {
	ep := d.Endpoints[i]
	att := p.Gateway.Dispatch(d, ep)
	out, err := http.NewRequestWithContext(r.Context(), http.MethodPost, "http://"+ep.Address+r.URL.RequestURI(), bytes.NewReader(raw))
	if err != nil {
		att.Done(0, true)
		return false, !last
	}
	copyHeader(out.Header, r.Header)
	out.ContentLength = int64(len(raw))
	resp, err := p.Transport.RoundTrip(out)
	if err != nil {
		if r.Context().Err() != nil {
			att.Done(0, false) // the caller went away
			return true, false
		}
		att.Done(0, true)
		p.Logger.Warn("tier1: endpoint failed before responding", "endpoint", ep.Address, "pool", d.Pool, "error", err)
		return false, !last
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 && !last {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		att.Done(resp.StatusCode, true)
		p.Logger.Warn("tier1: endpoint answered 5xx; trying the next", "endpoint", ep.Address, "pool", d.Pool, "status", resp.StatusCode)
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
	h.Set(gateway.HeaderServed, ep.Address)
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
		p.Logger.Warn("tier1: stream failed after the first byte", "endpoint", ep.Address, "pool", d.Pool, "error", err)
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

func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		if hopHeaders[k] {
			continue
		}
		dst[k] = append(dst[k][:0:0], vs...)
	}
}

func writeErr(w http.ResponseWriter, err error) {
	var ae *request.APIError
	if errors.As(err, &ae) {
		ae.Write(w)
		return
	}
	request.Unavailable("internal", err.Error()).Write(w)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = jsonEncode(w, v)
}
