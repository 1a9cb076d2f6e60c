// Package extproc is Tier-1's endpoint picker for Envoy-based gateways
// (Envoy Gateway, kgateway, Istio): an envoy.service.ext_proc.v3
// ExternalProcessor that speaks the Gateway API Inference Extension's
// endpoint-picker protocol, so that it drops in where GIE's picker runs.
//
// For each HTTP request Envoy opens one ext_proc stream. The Server reads
// the request headers and buffers the body to its end, parses it once,
// asks the gateway for a primary endpoint and fallbacks, and answers with
// the header x-gateway-destination-endpoint (ip:port,ip:port,... primary
// first) and the same value as dynamic metadata envoy.lb →
// x-gateway-destination-endpoint, clearing the route cache. In
// FULL_DUPLEX_STREAMED mode it sends the body back in chunks of at most
// 62,000 bytes, since Envoy then forwards only what the processor returns.
// Requests it cannot route get an immediate response in OpenAI's error
// shape: 400 (bad body), 404 (unknown model), 413 (body too large), 429,
// 503 (no endpoint, or none in the proxy's subset hint).
//
// It then follows the response: the first response body chunk is the
// first token (TTFT feeds the latency model; the response headers when
// the body is not streamed to the picker), the served endpoint is read back from
// envoy.lb → x-gateway-destination-endpoint-served (or the response header
// of that name) so a fallback is accounted to the pod that served, and the
// end of the response body, trailers or stream ends the request.
//
// It does not move request bytes to pods (Envoy does), retry (Envoy walks
// the fallback list per its retry policy) or shed load on its own: the
// gateway decides, and this package only carries the decision. That
// includes admission by priority band: a request whose pool is saturated
// waits in the gateway's queue before the destination is chosen (the
// stream simply answers later), and a shed one gets an immediate 429
// with Retry-After.
package extproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meridian-router/meridian/request"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/gateway"
)

// Names of the protocol (GIE's defaults).
const (
	// MetadataNamespace holds the destination in the dynamic metadata
	// Meridian returns, and the served endpoint in what Envoy sends back.
	MetadataNamespace = "envoy.lb"
	// SubsetNamespace holds the proxy's subset hint.
	SubsetNamespace = "envoy.lb.subset_hint"
	// MaxChunk is the largest body chunk sent back to Envoy.
	MaxChunk = 62000
	// ServiceName is the ext_proc service's name in gRPC health checks.
	ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// Server is the ext_proc endpoint picker. Its zero fields take the
// defaults in their comments; Gateway is required. It must not be copied
// after first use.
type Server struct {
	// Gateway decides where each request goes. Required.
	Gateway *gateway.Gateway
	// MaxBodyBytes limits request bodies; a longer one is answered 413.
	// Zero means request.DefaultMaxBytes (4 MiB).
	MaxBodyBytes int64
	// BodyMode is the request and response body mode assumed when Envoy
	// does not say (Envoy sends its processing mode in protocol_config
	// since 1.33). Zero (NONE) means FULL_DUPLEX_STREAMED, what GIE's
	// gateways configure. It must match the filter's processing_mode: a picker that
	// waits for a body Envoy will not send without a response stalls the
	// request until Envoy's message timeout.
	BodyMode filterv3.ProcessingMode_BodySendMode
	// Registerer receives the picker's metrics (open streams, immediate
	// responses by status); nil means none. Requests, TTFT and rejections
	// are the gateway's metrics.
	Registerer prometheus.Registerer
	// Logger; nil means slog.Default().
	Logger *slog.Logger

	once      sync.Once
	bufs      sync.Pool // *[]byte body buffers
	prescans  sync.Pool // *request.Prescan
	active    atomic.Int64
	health    *health.Server
	streams   prometheus.Gauge
	immediate *prometheus.CounterVec
}

func (s *Server) init() {
	s.once.Do(func() {
		if s.Logger == nil {
			s.Logger = slog.Default()
		}
		if s.BodyMode == filterv3.ProcessingMode_NONE {
			s.BodyMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		s.bufs.New = func() any { b := make([]byte, 0, 64<<10); return &b }
		s.prescans.New = func() any { return new(request.Prescan) }
		s.streams = prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_tier1_extproc_streams",
			Help: "ext_proc streams open (one per HTTP request Envoy is processing)."})
		s.immediate = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier1_extproc_immediate_responses_total",
			Help: "Requests the ext_proc picker answered itself, by HTTP status."}, []string{"code"})
		if s.Registerer != nil {
			s.Registerer.MustRegister(s.streams, s.immediate)
		}
		s.health = health.NewServer()
		s.health.SetServingStatus("liveness", healthpb.HealthCheckResponse_SERVING)
		s.health.SetServingStatus("readiness", healthpb.HealthCheckResponse_NOT_SERVING)
		s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
		s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	})
}

// Active is the number of ext_proc streams open now.
func (s *Server) Active() int64 { return s.active.Load() }

// Register adds the ext_proc service and the gRPC health service
// (services "", "liveness", "readiness" and ServiceName) to g. To serve
// health on its own port as GIE does (9003), register only the health
// service there with RegisterHealth.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	s.init()
	extprocv3.RegisterExternalProcessorServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
}

// RegisterHealth adds only the gRPC health service to g.
func (s *Server) RegisterHealth(g grpc.ServiceRegistrar) {
	s.init()
	healthpb.RegisterHealthServer(g, s.health)
}

// Ready reports whether some pool has a ready endpoint with metrics: what
// "readiness" and the ext_proc service's health say.
func (s *Server) Ready() bool {
	for _, v := range s.Gateway.Pools() {
		for _, ep := range v.Pool.Endpoints() {
			if ep.Ready() && ep.Metrics() != nil {
				return true
			}
		}
	}
	return false
}

// WatchReadiness updates the readiness health status every interval (zero
// means 1 s) until ctx ends, then reports every service NOT_SERVING so that
// Envoy stops sending new streams while the open ones drain.
func (s *Server) WatchReadiness(ctx context.Context, interval time.Duration) {
	s.init()
	if interval <= 0 {
		interval = time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if s.Ready() {
			st = healthpb.HealthCheckResponse_SERVING
		}
		s.health.SetServingStatus("readiness", st)
		s.health.SetServingStatus(ServiceName, st)
		select {
		case <-ctx.Done():
			s.health.Shutdown()
			return
		case <-t.C:
		}
	}
}

// Serve runs a gRPC server with the ext_proc and health services on lis
// until ctx ends, then reports NOT_SERVING and drains open streams for at
// most drain (zero means 30 s) before closing them. opts come after
// Meridian's defaults (ServerOptions) and win over them.
func (s *Server) Serve(ctx context.Context, lis net.Listener, drain time.Duration, opts ...grpc.ServerOption) error {
	if s.Gateway == nil {
		return errors.New("extproc: Server.Gateway is nil")
	}
	s.init()
	if drain <= 0 {
		drain = 30 * time.Second
	}
	g := grpc.NewServer(append(ServerOptions(), opts...)...)
	s.Register(g)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.WatchReadiness(rctx, 0)
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("extproc: serving on %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	s.health.Shutdown()
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	timer := time.NewTimer(drain)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		g.Stop()
		<-stopped
	}
	return nil
}

// ServerOptions are the gRPC server options Serve uses: HTTP/2 flow-control
// windows large enough that a whole 4 MiB body streams in without waiting
// for window updates (gRPC's default 64 KiB window costs a round trip per
// 64 KiB until its estimator catches up), a message limit above Envoy's
// largest body chunk, and gRPC's buffers from BufferPool (codec).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(4 << 20),
		grpc.InitialConnWindowSize(16 << 20),
		grpc.MaxRecvMsgSize(16 << 20),
		experimental.BufferPool(BufferPool()),
		grpc.ForceServerCodecV2(codec{}),
	}
}

// Process handles one HTTP request's ext_proc stream.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	s.init()
	s.active.Add(1)
	s.streams.Inc()
	defer func() { s.active.Add(-1); s.streams.Dec() }()
	f := &flow{s: s, stream: stream, reqMode: s.BodyMode, respMode: s.BodyMode}
	defer f.finish()
	for {
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || stream.Context().Err() != nil {
				return nil
			}
			return fmt.Errorf("extproc: receiving: %w", err)
		}
		if err := f.handle(req); err != nil {
			if errors.Is(err, errClosed) {
				return nil
			}
			return err
		}
	}
}

// errClosed ends a stream after an immediate response.
var errClosed = errors.New("extproc: immediate response sent")

// flow is one HTTP request's state across its ext_proc messages. It is
// owned by the stream's goroutine.
type flow struct {
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer

	reqMode, respMode filterv3.ProcessingMode_BodySendMode
	sawConfig         bool

	header http.Header
	subset []string
	body   *[]byte // pooled; nil until the first chunk
	// pre decodes the body's long strings as its chunks arrive (pooled;
	// nil until a body comes in more than one chunk).
	pre     *request.Prescan
	decided bool // the destination was sent

	d    *gateway.Decision
	att  *gateway.Attempt
	code int
	done bool
}

func (f *flow) handle(req *extprocv3.ProcessingRequest) error {
	if pc := req.GetProtocolConfig(); pc != nil && !f.sawConfig {
		f.sawConfig = true
		f.reqMode, f.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
	}
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return f.requestHeaders(req, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return f.requestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if f.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && !f.decided {
			// The body ended without end_of_stream: the trailers end it.
			if err := f.route(false); err != nil {
				return err
			}
		}
		return f.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return f.responseHeaders(req, r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return f.responseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		f.end(false)
		return f.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return nil
}

func (f *flow) requestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	f.header = toHeader(h.GetHeaders())
	f.subset = subsetHint(req.GetMetadataContext())
	switch {
	case h.GetEndOfStream():
		// No body (GET /v1/models and the like): route by header, or to
		// any ready endpoint as GIE does.
		return f.routeHeaderOnly(true)
	case f.reqMode == filterv3.ProcessingMode_NONE || f.reqMode == filterv3.ProcessingMode_STREAMED:
		// Envoy waits for this answer before it sends (or without
		// sending) the body: only headers can route (BBR's
		// X-Gateway-Model-Name).
		return f.routeHeaderOnly(false)
	case f.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return nil // answered with the destination once the body is in
	default: // BUFFERED, BUFFERED_PARTIAL: Envoy waits, then sends the body
		return f.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{}}})
	}
}

func (f *flow) requestBody(b *extprocv3.HttpBody) error {
	if f.decided {
		// STREAMED or NONE mode: the destination went with the headers.
		return f.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{}}})
	}
	if f.body == nil {
		f.body = f.s.bufs.Get().(*[]byte)
		*f.body = (*f.body)[:0]
	}
	limit := f.s.MaxBodyBytes
	if limit <= 0 {
		limit = request.DefaultMaxBytes
	}
	if int64(len(*f.body)+len(b.GetBody())) > limit {
		f.s.Gateway.Reject("body_too_large")
		return f.immediate(&request.APIError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Code: "body_too_large", Message: fmt.Sprintf("request body too large: more than %d bytes", limit)})
	}
	*f.body = append(*f.body, b.GetBody()...)
	if f.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// A body in chunks (a long prompt) is decoded as it arrives, so
		// that what is left after its last chunk is that chunk's share.
		if f.pre == nil && !b.GetEndOfStream() {
			f.pre = f.s.prescans.Get().(*request.Prescan)
			f.pre.Reset()
		}
		if f.pre != nil {
			f.pre.Feed(*f.body)
		}
		if !b.GetEndOfStream() {
			return nil
		}
	}
	// BUFFERED modes send the whole (or, partial, the buffered) body in
	// one message and wait for this answer.
	return f.route(true)
}

// route parses the buffered body, decides and sends the destination (and,
// streaming, the body back); eos says whether the body's last chunk ends
// the request (no trailers follow).
func (f *flow) route(eos bool) error {
	var raw []byte
	if f.body != nil {
		raw = *f.body
	}
	// The endpoint (its :path) says where an embeddings or responses
	// body's prompt is.
	body, err := request.ParseScannedAs(raw, f.s.MaxBodyBytes, f.pre, request.KindOf(f.header.Get(":path")))
	if err != nil {
		f.s.Gateway.Reject("bad_request")
		return f.immediate(request.BodyError(err))
	}
	d, err := f.s.Gateway.Route(f.stream.Context(), body, gateway.Meta{Header: f.header, Subset: f.subset, Bytes: int64(len(raw))})
	body.Release() // scheduled: only the model is read from here on
	if err != nil {
		if f.stream.Context().Err() != nil {
			return errClosed // Envoy gave up on the request while it waited
		}
		return f.immediate(apiError(err))
	}
	f.dispatch(d)
	if d.Rewrite != "" && f.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// Streamed: Envoy forwards the body we send back, so the model
		// rewrite is a body edit. (Buffered mode forwards Envoy's copy.)
		if raw, err = request.WithModel(raw, body.Model, d.Rewrite); err != nil {
			return f.immediate(request.BadRequest("invalid_body", err.Error()))
		}
	}
	dest, md := destination(d.Endpoints)
	common := &extprocv3.CommonResponse{HeaderMutation: dest, ClearRouteCache: true}
	if f.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return f.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: common}}})
	}
	if err := f.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
		return err
	}
	return f.sendChunks(raw, eos, func(c *extprocv3.BodyResponse) *extprocv3.ProcessingResponse {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: c}}
	})
}

// routeHeaderOnly answers the request headers when no body will be seen:
// by X-Gateway-Model-Name if set, else (eos, a bodyless request) to any
// ready endpoint.
func (f *flow) routeHeaderOnly(eos bool) error {
	var eps []*tier1.Endpoint
	if model := f.header.Get(gateway.HeaderModelName); model != "" {
		d, err := f.s.Gateway.Route(f.stream.Context(), &request.Body{Model: model}, gateway.Meta{Header: f.header, Subset: f.subset})
		if err != nil {
			if f.stream.Context().Err() != nil {
				return errClosed
			}
			return f.immediate(apiError(err))
		}
		f.dispatch(d)
		eps = d.Endpoints
	} else if eos {
		ep := f.anyEndpoint()
		if ep == nil {
			return f.immediate(request.Unavailable("no_endpoints", "no ready endpoint"))
		}
		eps = []*tier1.Endpoint{ep}
	} else {
		f.s.Gateway.Reject("bad_request")
		return f.immediate(request.BadRequest("missing_model", "the ext_proc filter sends no request body "+
			"(processing mode "+f.reqMode.String()+"): set the X-Gateway-Model-Name header or use FULL_DUPLEX_STREAMED"))
	}
	dest, md := destination(eps)
	f.decided = true
	return f.send(&extprocv3.ProcessingResponse{DynamicMetadata: md, Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: dest, ClearRouteCache: true}}}})
}

func (f *flow) anyEndpoint() *tier1.Endpoint {
	var ready []*tier1.Endpoint
	for _, v := range f.s.Gateway.Pools() {
		for _, ep := range v.Pool.Endpoints() {
			if ep.Ready() && ep.Metrics() != nil && (f.subset == nil || slices.Contains(f.subset, ep.Address)) {
				ready = append(ready, ep)
			}
		}
	}
	if len(ready) == 0 {
		return nil
	}
	return ready[rand.IntN(len(ready))]
}

func (f *flow) dispatch(d *gateway.Decision) {
	f.d = d
	f.decided = true
	f.att = f.s.Gateway.Dispatch(d, d.Endpoints[0])
}

func (f *flow) responseHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	hdr := h.GetHeaders()
	f.code, _ = strconv.Atoi(headerValue(hdr, ":status"))
	if f.att != nil {
		served := servedEndpoint(req.GetMetadataContext())
		if served == "" {
			served = headerValue(hdr, gateway.HeaderServed)
		}
		if served != "" && served != f.d.Endpoints[0].Address {
			// Envoy fell back: the primary failed before responding.
			for _, ep := range f.d.Endpoints[1:] {
				if ep.Address == served {
					f.att.Done(0, true)
					f.s.Gateway.Fallback(f.d)
					f.att = f.s.Gateway.Dispatch(f.d, ep)
					break
				}
			}
		}
		if h.GetEndOfStream() || !f.bodySeen() {
			f.att.FirstByte()
		}
	}
	if h.GetEndOfStream() {
		f.end(false)
	}
	return f.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{}}})
}

func (f *flow) responseBody(b *extprocv3.HttpBody) error {
	if f.att != nil && (len(b.GetBody()) > 0 || b.GetEndOfStream()) {
		f.att.FirstByte() // once; see bodySeen
	}
	if b.GetEndOfStream() {
		f.end(false)
	}
	if f.respMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return f.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
			ResponseBody: &extprocv3.BodyResponse{}}})
	}
	// Streamed: Envoy forwards only what comes back.
	return f.sendChunks(b.GetBody(), b.GetEndOfStream(), func(c *extprocv3.BodyResponse) *extprocv3.ProcessingResponse {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: c}}
	})
}

// bodySeen says whether the response body comes through the picker as
// it streams, so that its first chunk, not the headers, is the first
// token. vLLM answers a stream's headers as soon as the request is
// queued, before prefill, and sends the first event with the first
// token: timed at the headers, every pod's latency model would learn a
// TTFT of a few milliseconds whatever its speed (the simulated pods do
// the same, TestFirstTokenAtFirstBodyChunk). In the buffered modes the
// body arrives whole at the end, so the headers are the better time.
func (f *flow) bodySeen() bool {
	return f.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED || f.respMode == filterv3.ProcessingMode_STREAMED
}

// sendChunks sends data back as streamed body responses of at most
// MaxChunk bytes, the last carrying eos. Empty data still sends one
// (possibly end-of-stream) message.
func (f *flow) sendChunks(data []byte, eos bool, wrap func(*extprocv3.BodyResponse) *extprocv3.ProcessingResponse) error {
	for first := true; first || len(data) > 0; first = false {
		n := min(len(data), MaxChunk)
		last := n == len(data)
		c := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
				Body: data[:n], EndOfStream: last && eos}}}}}
		// Send marshals before it returns, so data may be reused after.
		if err := f.send(wrap(c)); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// end reports the request's outcome once and releases its admission.
// cancelled means the caller (or Envoy) went away, which does not count
// against the pod.
func (f *flow) end(cancelled bool) {
	if f.att == nil || f.done {
		return
	}
	f.done = true
	defer f.d.Release()
	if cancelled {
		f.att.Done(0, false)
		return
	}
	f.att.Done(f.code, f.code >= 500)
}

// finish runs when the stream ends, however it ends.
func (f *flow) finish() {
	// A stream that ends before the response finished: the caller went
	// away, or Envoy was configured not to send the response phases.
	f.end(f.stream.Context().Err() != nil || f.code == 0)
	if f.body != nil {
		if cap(*f.body) <= 1<<20 {
			f.s.bufs.Put(f.body)
		}
		f.body = nil
	}
	if f.pre != nil {
		if f.pre.Size() <= 1<<20 {
			f.s.prescans.Put(f.pre)
		}
		f.pre = nil
	}
}

func (f *flow) send(r *extprocv3.ProcessingResponse) error {
	if err := f.stream.Send(r); err != nil {
		return fmt.Errorf("extproc: sending: %w", err)
	}
	return nil
}

// immediate answers the request with an error and ends the stream.
func (f *flow) immediate(e *request.APIError) error {
	f.s.immediate.WithLabelValues(strconv.Itoa(e.Status)).Inc()
	body, _ := json.Marshal(e.Body())
	set := []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}}}
	if e.RetryAfter > 0 {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "retry-after", RawValue: []byte(strconv.Itoa(e.RetryAfter))}})
	}
	err := f.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.Status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    body,
			Details: "meridian_" + e.Code,
		}}})
	if err != nil {
		return err
	}
	return errClosed
}

// destination builds the header mutation and dynamic metadata naming eps,
// primary first. Header and metadata carry the same value, as the
// protocol requires.
func destination(eps []*tier1.Endpoint) (*extprocv3.HeaderMutation, *structpb.Struct) {
	var b strings.Builder
	for i, ep := range eps {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(ep.Address)
	}
	v := b.String()
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
		Header: &corev3.HeaderValue{Key: gateway.HeaderDestination, RawValue: []byte(v)},
	}}}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			gateway.HeaderDestination: structpb.NewStringValue(v),
		}}),
	}}
	return hm, md
}

// toHeader converts Envoy's header map (pseudo-headers included).
func toHeader(m *corev3.HeaderMap) http.Header {
	h := make(http.Header, len(m.GetHeaders()))
	for _, kv := range m.GetHeaders() {
		h.Add(kv.GetKey(), valueOf(kv))
	}
	return h
}

func valueOf(kv *corev3.HeaderValue) string {
	if len(kv.GetRawValue()) > 0 {
		return string(kv.GetRawValue())
	}
	return kv.GetValue()
}

func headerValue(m *corev3.HeaderMap, key string) string {
	for _, kv := range m.GetHeaders() {
		if strings.EqualFold(kv.GetKey(), key) {
			return valueOf(kv)
		}
	}
	return ""
}

// subsetHint reads envoy.lb.subset_hint → x-gateway-destination-endpoint-subset:
// nil when absent (no restriction), empty non-nil when present but empty.
// A list of strings is the protocol's form; a comma-separated string is
// accepted too.
func subsetHint(md *corev3.Metadata) []string {
	ns := md.GetFilterMetadata()[SubsetNamespace]
	v, ok := ns.GetFields()[gateway.HeaderSubset]
	if !ok {
		return nil
	}
	out := []string{}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if s := strings.TrimSpace(e.GetStringValue()); s != "" {
				out = append(out, s)
			}
		}
	case *structpb.Value_StringValue:
		for _, s := range strings.Split(k.StringValue, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// servedEndpoint reads envoy.lb → x-gateway-destination-endpoint-served.
func servedEndpoint(md *corev3.Metadata) string {
	return md.GetFilterMetadata()[MetadataNamespace].GetFields()[gateway.HeaderServed].GetStringValue()
}

func apiError(err error) *request.APIError {
	var ae *request.APIError
	if errors.As(err, &ae) {
		return ae
	}
	return request.Unavailable("internal", err.Error())
}
