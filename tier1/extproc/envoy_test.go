package extproc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/simtest"
	"github.com/meridian-router/meridian/tier1"
	"github.com/meridian-router/meridian/tier1/extproc"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/scrape"
)

var quiet = slog.New(slog.DiscardHandler)

// platform is an ext_proc picker on loopback gRPC in front of live
// simulated pods, and the Envoy side that talks to both.
type platform struct {
	gw     *gateway.Gateway
	srv    *extproc.Server
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient
	http   *http.Client
	pods   map[string][]*sim.LivePod // by pool label
}

const gatewayYAML = testkit.ChatGateway + `    weights: {queue: 2, kvCache: 2, prefix: 3}
  - name: lora
    modelName: base-8b
    modelSelector: {matchLabels: {pool: lora}}
    loraAdapters: [adapter-a, adapter-b]
  bbr: {enabled: true}
`

func startPods(tb testing.TB, profile, model string, adapters []string, k int, scale float64) []*sim.LivePod {
	tb.Helper()
	return simtest.StartPods(tb, sim.PodSpec{
		Pod:              sim.PodConfig{Name: model, Profile: simtest.Profile(tb, profile), Model: model, Adapters: adapters},
		TimeScale:        scale,
		DefaultMaxTokens: 8,
	}, k)
}

func snapshot(tb testing.TB, pods map[string][]*sim.LivePod) *config.Snapshot {
	tb.Helper()
	return testkit.Snapshot(tb, 1, gatewayYAML+testkit.StaticEndpoints(testkit.PodEndpoints(pods)...))
}

// newPlatform starts the pods, a gateway (edited by the with functions,
// if any) and srv in front of it.
func newPlatform(tb testing.TB, srv *extproc.Server, scale float64, with ...func(*gateway.Config)) *platform {
	tb.Helper()
	p := &platform{pods: map[string][]*sim.LivePod{}}
	p.pods["chat"] = startPods(tb, "h100", "chat-model", nil, 3, scale)
	p.pods["lora"] = startPods(tb, "a10g", "base-8b", []string{"adapter-a", "adapter-b"}, 2, scale)
	cfg := gateway.Config{
		Cluster: "c1",
		Logger:  quiet,
		Scrape:  scrape.Config{Interval: 20 * time.Millisecond},
		Options: tier1.Options{MaxMetricsAge: time.Second},
	}
	for _, f := range with {
		f(&cfg)
	}
	gw, err := gateway.New(cfg, snapshot(tb, p.pods))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gw.Start(ctx, nil)
	p.gw = gw
	if srv == nil {
		srv = &extproc.Server{}
	}
	srv.Gateway, srv.Logger = gw, quiet
	p.srv = srv
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis, time.Second) }()
	// Envoy's HTTP/2 windows for its gRPC clients default to 256 MiB per
	// stream and connection: the picker's answers never wait on them.
	// Its buffers come from the picker's pool (extproc.Codec).
	p.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(256<<20), grpc.WithInitialConnWindowSize(256<<20),
		experimental.WithBufferPool(extproc.BufferPool()), grpc.WithDefaultCallOptions(grpc.ForceCodecV2(extproc.Codec)))
	if err != nil {
		tb.Fatal(err)
	}
	p.client = extprocv3.NewExternalProcessorClient(p.conn)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	p.http = &http.Client{Transport: tr}
	tb.Cleanup(func() {
		p.conn.Close()
		cancel()
		if err := <-served; err != nil {
			tb.Error(err)
		}
		tr.CloseIdleConnections()
	})
	testkit.Eventually(tb, "every endpoint scraped", func() bool {
		for _, v := range gw.Pools() {
			for _, ep := range v.Pool.Endpoints() {
				if ep.Metrics() == nil {
					return false
				}
			}
		}
		return true
	})
	return p
}

// inFlight sums the gateway's in-flight counts over every endpoint.
func (p *platform) inFlight() (n int64) {
	for _, v := range p.gw.Pools() {
		for _, ep := range v.Pool.Endpoints() {
			n += ep.InFlight()
		}
	}
	return n
}

func (p *platform) endpoint(addr string) *tier1.Endpoint {
	for _, v := range p.gw.Pools() {
		for _, ep := range v.Pool.Endpoints() {
			if ep.Address == addr {
				return ep
			}
		}
	}
	return nil
}

func (p *platform) inPool(pool, addr string) bool {
	for _, lp := range p.pods[pool] {
		if lp.Addr() == addr {
			return true
		}
	}
	return false
}

// call is one HTTP request as Envoy's ext_proc filter presents it.
type call struct {
	mode   filterv3.ProcessingMode_BodySendMode // zero: FULL_DUPLEX_STREAMED
	path   string                               // zero: /v1/chat/completions
	header map[string]string
	body   []byte
	chunk  int // Envoy's body chunk size; zero: 16 KiB
	// pace is the time between body chunks: the caller's upload arriving
	// at network speed rather than all at once. Zero: none.
	pace    time.Duration
	subset  []string
	hasHint bool // send the subset hint (possibly empty)
}

// picked is what the picker answered to the request phase.
type picked struct {
	stream    extprocv3.ExternalProcessor_ProcessClient
	mode      filterv3.ProcessingMode_BodySendMode
	immediate *extprocv3.ImmediateResponse
	dest      string // x-gateway-destination-endpoint header
	meta      string // envoy.lb dynamic metadata
	clear     bool   // ClearRouteCache
	body      []byte // the body as sent back (streamed mode)
	chunks    []int  // sizes of the chunks sent back
	// decided is from sending the body's last chunk to receiving the
	// destination, and tail to receiving the body's last chunk back
	// (streamed mode): the picker's share of the critical path once the
	// body is in. Envoy starts the upstream request at the destination
	// and streams the body to it as the chunks come back.
	decided, tail time.Duration
}

func (c call) mode0() filterv3.ProcessingMode_BodySendMode {
	if c.mode == 0 {
		return filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	return c.mode
}

// request plays Envoy's request phase on a new stream.
func (p *platform) request(tb testing.TB, ctx context.Context, c call) *picked {
	tb.Helper()
	st, err := p.client.Process(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	pk := &picked{stream: st, mode: c.mode0()}
	path := c.path
	if path == "" {
		path = "/v1/chat/completions"
	}
	hs := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(path)},
		{Key: "content-type", RawValue: []byte("application/json")}}
	for k, v := range c.header {
		hs = append(hs, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
	}
	first := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: c.body == nil}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: pk.mode, ResponseBodyMode: pk.mode},
	}
	if c.hasHint {
		vals := make([]any, len(c.subset))
		for i, s := range c.subset {
			vals[i] = s
		}
		hint, err := structpb.NewStruct(map[string]any{gateway.HeaderSubset: vals})
		if err != nil {
			tb.Fatal(err)
		}
		first.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.SubsetNamespace: hint}}
	}
	p.sendT(tb, st, first)
	if c.body == nil {
		pk.read(tb, p.recvT(tb, st))
		return pk
	}
	if pk.mode == filterv3.ProcessingMode_BUFFERED {
		r := p.recvT(tb, st)
		if r.GetImmediateResponse() != nil {
			pk.immediate = r.GetImmediateResponse()
			return pk
		}
		if r.GetRequestHeaders() == nil {
			tb.Fatalf("buffered: want a request headers response first, got %v", r)
		}
		p.sendT(tb, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: c.body, EndOfStream: true}}})
		pk.read(tb, p.recvT(tb, st))
		return pk
	}
	chunk := c.chunk
	if chunk == 0 {
		chunk = 16 << 10
	}
	var last time.Time
	for data := c.body; ; {
		n := min(chunk, len(data))
		p.sendT(tb, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: data[:n], EndOfStream: n == len(data)}}})
		data = data[n:]
		if len(data) == 0 {
			last = time.Now()
			break
		}
		if c.pace > 0 {
			time.Sleep(c.pace)
		}
	}
	r := p.recvT(tb, st)
	pk.decided = time.Since(last)
	pk.read(tb, r)
	if pk.immediate != nil {
		return pk
	}
	pk.body = make([]byte, 0, len(c.body))
	for {
		r := p.recvT(tb, st)
		sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			tb.Fatalf("streamed: want request body chunks, got %v", r)
		}
		pk.body = append(pk.body, sr.GetBody()...)
		pk.chunks = append(pk.chunks, len(sr.GetBody()))
		if sr.GetEndOfStream() {
			pk.tail = time.Since(last)
			return pk
		}
	}
}

// read takes the destination from a headers or body response.
func (pk *picked) read(tb testing.TB, r *extprocv3.ProcessingResponse) {
	tb.Helper()
	if ir := r.GetImmediateResponse(); ir != nil {
		pk.immediate = ir
		return
	}
	var common *extprocv3.CommonResponse
	switch {
	case r.GetRequestHeaders() != nil:
		common = r.GetRequestHeaders().GetResponse()
	case r.GetRequestBody() != nil:
		common = r.GetRequestBody().GetResponse()
	default:
		tb.Fatalf("want the destination, got %v", r)
	}
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == gateway.HeaderDestination {
			pk.dest = string(h.GetHeader().GetRawValue())
		}
	}
	pk.clear = common.GetClearRouteCache()
	pk.meta = r.GetDynamicMetadata().GetFields()[extproc.MetadataNamespace].GetStructValue().GetFields()[gateway.HeaderDestination].GetStringValue()
}

func (pk *picked) primary() string { return strings.Split(pk.dest, ",")[0] }

// respond sends the request to addr (as Envoy would, with the body the
// picker returned) and plays the response phase through the picker. It
// returns the status and the response body as Envoy would forward it.
func (p *platform) respond(tb testing.TB, pk *picked, path string, reqBody []byte, addr, served string) (int, []byte) {
	tb.Helper()
	if pk.mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		reqBody = pk.body
	}
	if path == "" {
		path = "/v1/chat/completions"
	}
	resp, err := p.http.Post("http://"+addr+path, "application/json", bytes.NewReader(reqBody))
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	hs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(fmt.Sprint(resp.StatusCode))},
		{Key: "content-type", RawValue: []byte(resp.Header.Get("Content-Type"))}}}
	msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hs}}}
	if served != "" {
		md, _ := structpb.NewStruct(map[string]any{gateway.HeaderServed: served})
		msg.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.MetadataNamespace: md}}
	}
	p.sendT(tb, pk.stream, msg)
	if r := p.recvT(tb, pk.stream); r.GetResponseHeaders() == nil {
		tb.Fatalf("want a response headers response, got %v", r)
	}
	var out []byte
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		eos := errors.Is(rerr, io.EOF)
		if n > 0 || eos {
			p.sendT(tb, pk.stream, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: bytes.Clone(buf[:n]), EndOfStream: eos}}})
			if pk.mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
				for got := 0; got < n || (eos && got == 0 && n == 0); {
					r := p.recvT(tb, pk.stream)
					sr := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
					if sr == nil {
						tb.Fatalf("want streamed response body, got %v", r)
					}
					out = append(out, sr.GetBody()...)
					got += len(sr.GetBody())
					if sr.GetEndOfStream() {
						break
					}
				}
			} else {
				if r := p.recvT(tb, pk.stream); r.GetResponseBody() == nil {
					tb.Fatalf("want a response body response, got %v", r)
				}
				out = append(out, buf[:n]...)
			}
		}
		if eos {
			break
		}
		if rerr != nil {
			tb.Fatal(rerr)
		}
	}
	pk.stream.CloseSend()
	if _, err := pk.stream.Recv(); !errors.Is(err, io.EOF) {
		tb.Fatalf("stream after the response: %v, want EOF", err)
	}
	return resp.StatusCode, out
}

func (p *platform) sendT(tb testing.TB, st extprocv3.ExternalProcessor_ProcessClient, r *extprocv3.ProcessingRequest) {
	tb.Helper()
	if err := st.Send(r); err != nil {
		tb.Fatalf("send: %v", err)
	}
}

func (p *platform) recvT(tb testing.TB, st extprocv3.ExternalProcessor_ProcessClient) *extprocv3.ProcessingResponse {
	tb.Helper()
	r, err := st.Recv()
	if err != nil {
		tb.Fatalf("recv: %v", err)
	}
	return r
}

func headersOnly() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}}}}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
	}
}

func bodyChunk(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

func responseHeaders(code int) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(fmt.Sprint(code))}}}}}}
}
