package extproc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/tier1/extproc"
	"github.com/meridian-router/meridian/tier1/gateway"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func chat(model, text string, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{"model": model, "stream": stream, "max_tokens": 4,
		"messages": []map[string]string{{"role": "user", "content": text}}})
	return b
}

// errorBody decodes an immediate response's OpenAI-shaped error.
func errorBody(t *testing.T, ir *extprocv3.ImmediateResponse) (typ, code, msg string) {
	t.Helper()
	var e testkit.OpenAIError
	if err := json.Unmarshal(ir.GetBody(), &e); err != nil {
		t.Fatalf("immediate response body is not OpenAI's error JSON: %v: %s", err, ir.GetBody())
	}
	ct := ""
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "content-type" {
			ct = string(h.GetHeader().GetRawValue())
		}
	}
	if ct != "application/json" {
		t.Fatalf("immediate response content-type %q", ct)
	}
	return e.Error.Type, e.Error.Code, e.Error.Message
}

func TestRouting(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := newPlatform(t, &extproc.Server{MaxBodyBytes: 64 << 10, Registerer: reg}, 50)
	cases := []struct {
		name     string
		path     string
		header   map[string]string
		body     []byte
		status   int // immediate response status; 0 routes
		pool     string
		contains string
	}{
		{name: "base model", body: chat("chat-model", "hello", false), pool: "chat", contains: `"chat-model"`},
		{name: "streaming", body: chat("chat-model", "hello", true), pool: "chat", contains: "data: [DONE]"},
		{name: "completion", path: "/v1/completions", body: []byte(`{"model":"chat-model","prompt":"once upon","max_tokens":3}`), pool: "chat", contains: `"text_completion"`},
		{name: "adapter via BBR", body: chat("adapter-a", "triage this claim", false), pool: "lora", contains: `"adapter-a"`},
		{name: "BBR headers", header: map[string]string{"X-Gateway-Model-Name": "adapter-b", "X-Gateway-Base-Model-Name": "base-8b"}, body: chat("adapter-b", "hi", false), pool: "lora", contains: `"adapter-b"`},
		{name: "unknown model", body: chat("gpt-9", "hi", false), status: 404, contains: "no matching model: set the model in the request body or the x-gateway-model-name header"},
		{name: "malformed body", body: []byte(`{"model": "chat-model", "messages": [`), status: 400, contains: "malformed"},
		{name: "missing model", body: []byte(`{"messages": []}`), status: 400, contains: "model"},
		{name: "too large", body: chat("chat-model", strings.Repeat("x", 70<<10), false), status: 413, contains: "too large"},
	}
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED} {
		for _, tc := range cases {
			t.Run(mode.String()+"/"+tc.name, func(t *testing.T) {
				pk := p.request(t, t.Context(), call{mode: mode, path: tc.path, header: tc.header, body: tc.body})
				if tc.status != 0 {
					if pk.immediate == nil {
						t.Fatalf("routed to %q; want an immediate %d", pk.dest, tc.status)
					}
					if got := int(pk.immediate.GetStatus().GetCode()); got != tc.status {
						t.Fatalf("immediate status %d, want %d", got, tc.status)
					}
					_, _, msg := errorBody(t, pk.immediate)
					if !strings.Contains(msg, tc.contains) {
						t.Fatalf("message %q does not contain %q", msg, tc.contains)
					}
					return
				}
				if pk.immediate != nil {
					t.Fatalf("immediate %d: %s", pk.immediate.GetStatus().GetCode(), pk.immediate.GetBody())
				}
				if pk.dest == "" || pk.dest != pk.meta || !pk.clear {
					t.Fatalf("destination header %q, metadata %q, clear route cache %v: want equal, non-empty, true", pk.dest, pk.meta, pk.clear)
				}
				eps := strings.Split(pk.dest, ",")
				for _, ep := range eps {
					if !p.inPool(tc.pool, ep) {
						t.Fatalf("destination %q lists %s, not a %s pod", pk.dest, ep, tc.pool)
					}
				}
				if len(eps) < 2 {
					t.Fatalf("destination %q has no fallbacks", pk.dest)
				}
				code, out := p.respond(t, pk, tc.path, tc.body, pk.primary(), "")
				if code != 200 || !strings.Contains(string(out), tc.contains) {
					t.Fatalf("pod answered %d: %s", code, out)
				}
				if n := p.inFlight(); n != 0 {
					t.Fatalf("in flight after the response: %d", n)
				}
			})
		}
	}
	// Two modes: each immediate status was answered twice.
	for code, want := range map[string]float64{"400": 4, "404": 2, "413": 2, "503": 0} {
		if got := counter(t, reg, "meridian_tier1_extproc_immediate_responses_total", code); got != want {
			t.Errorf("immediate responses %s: %v, want %v", code, got, want)
		}
	}
}

// counter reads one counter, by its code label, from a registry.
func counter(t *testing.T, reg *prometheus.Registry, name, code string) float64 {
	t.Helper()
	return testkit.Metric(t, reg, name, map[string]string{"code": code})
}

func TestLargeBodyChunked(t *testing.T) {
	p := newPlatform(t, nil, 200)
	body := chat("chat-model", strings.Repeat("A long document to summarise. ", 10<<10), false) // ≈ 300 KB
	if len(body) < 300<<10 {
		t.Fatalf("body is %d bytes", len(body))
	}
	pk := p.request(t, t.Context(), call{body: body, chunk: 16 << 10})
	if pk.immediate != nil {
		t.Fatalf("immediate %d: %s", pk.immediate.GetStatus().GetCode(), pk.immediate.GetBody())
	}
	if string(pk.body) != string(body) {
		t.Fatalf("body sent back differs: %d bytes, want %d", len(pk.body), len(body))
	}
	for i, n := range pk.chunks {
		if n > extproc.MaxChunk {
			t.Fatalf("chunk %d is %d bytes, over %d", i, n, extproc.MaxChunk)
		}
	}
	if want := (len(body) + extproc.MaxChunk - 1) / extproc.MaxChunk; len(pk.chunks) != want {
		t.Fatalf("%d chunks, want %d", len(pk.chunks), want)
	}
	if code, out := p.respond(t, pk, "", body, pk.primary(), ""); code != 200 {
		t.Fatalf("pod answered %d: %s", code, out)
	}
}

func TestSubsetHint(t *testing.T) {
	p := newPlatform(t, nil, 50)
	only := p.pods["chat"][2].Addr()
	cases := []struct {
		name   string
		subset []string
		status int
		want   []string // the destination, exactly
	}{
		{"one pod", []string{only}, 0, []string{only}},
		{"one pod and a stranger", []string{"10.9.9.9:8000", only}, 0, []string{only}},
		{"two pods", []string{p.pods["chat"][0].Addr(), only}, 0, nil},
		{"empty", []string{}, 503, nil},
		{"no pod of the pool", []string{"10.9.9.9:8000"}, 503, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pk := p.request(t, t.Context(), call{body: chat("chat-model", "hi", false), subset: tc.subset, hasHint: true})
			if tc.status != 0 {
				if pk.immediate == nil || int(pk.immediate.GetStatus().GetCode()) != tc.status {
					t.Fatalf("got %v / %q; want immediate %d", pk.immediate, pk.dest, tc.status)
				}
				errorBody(t, pk.immediate)
				return
			}
			if pk.immediate != nil {
				t.Fatalf("immediate %d: %s", pk.immediate.GetStatus().GetCode(), pk.immediate.GetBody())
			}
			for _, ep := range strings.Split(pk.dest, ",") {
				found := false
				for _, s := range tc.subset {
					found = found || s == ep
				}
				if !found {
					t.Fatalf("destination %q lists %s outside the subset %v", pk.dest, ep, tc.subset)
				}
			}
			if tc.want != nil && pk.dest != strings.Join(tc.want, ",") {
				t.Fatalf("destination %q, want %q", pk.dest, strings.Join(tc.want, ","))
			}
			p.respond(t, pk, "", nil, pk.primary(), "")
		})
	}
}

func TestBodylessRequest(t *testing.T) {
	p := newPlatform(t, nil, 50)
	pk := p.request(t, t.Context(), call{path: "/v1/models"})
	if pk.immediate != nil || pk.dest == "" || pk.dest != pk.meta {
		t.Fatalf("GET without a body: immediate %v, destination %q, metadata %q", pk.immediate, pk.dest, pk.meta)
	}
	if p.endpoint(pk.dest) == nil {
		t.Fatalf("destination %q is not an endpoint", pk.dest)
	}
}

// TestServedFallback: when Envoy reports that a fallback served, the
// request is accounted to that endpoint and the primary is released.
func TestServedFallback(t *testing.T) {
	p := newPlatform(t, nil, 50)
	for _, via := range []string{"metadata", "header"} {
		t.Run(via, func(t *testing.T) {
			pk := p.request(t, t.Context(), call{body: chat("chat-model", "hello", false)})
			eps := strings.Split(pk.dest, ",")
			if len(eps) < 2 {
				t.Fatalf("destination %q has no fallback", pk.dest)
			}
			primary, fallback := p.endpoint(eps[0]), p.endpoint(eps[1])
			if primary.InFlight() != 1 || fallback.InFlight() != 0 {
				t.Fatalf("after the decision: primary %d, fallback %d in flight; want 1, 0", primary.InFlight(), fallback.InFlight())
			}
			rh := responseHeaders(200)
			if via == "metadata" {
				md, _ := structpb.NewStruct(map[string]any{gateway.HeaderServed: eps[1]})
				rh.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{extproc.MetadataNamespace: md}}
			} else {
				hs := rh.GetResponseHeaders().GetHeaders()
				hs.Headers = append(hs.Headers, &corev3.HeaderValue{Key: gateway.HeaderServed, RawValue: []byte(eps[1])})
			}
			p.sendT(t, pk.stream, rh)
			p.recvT(t, pk.stream)
			if primary.InFlight() != 0 || fallback.InFlight() != 1 {
				t.Fatalf("after the fallback served: primary %d, fallback %d in flight; want 0, 1", primary.InFlight(), fallback.InFlight())
			}
			p.sendT(t, pk.stream, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}})
			p.recvT(t, pk.stream)
			if n := p.inFlight(); n != 0 {
				t.Fatalf("in flight after the response: %d", n)
			}
		})
	}
}

// TestHeaderRouting: with request_body_mode NONE (or STREAMED) Envoy waits
// for the headers' answer, so only BBR's X-Gateway-Model-Name routes.
func TestHeaderRouting(t *testing.T) {
	p := newPlatform(t, nil, 50)
	for _, mode := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_NONE, filterv3.ProcessingMode_STREAMED} {
		t.Run(mode.String(), func(t *testing.T) {
			st, err := p.client.Process(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			h := headersOnly()
			h.ProtocolConfig.RequestBodyMode = mode
			hs := h.GetRequestHeaders().GetHeaders()
			hs.Headers = append(hs.Headers, &corev3.HeaderValue{Key: "x-gateway-model-name", RawValue: []byte("adapter-a")})
			p.sendT(t, st, h)
			pk := &picked{}
			pk.read(t, p.recvT(t, st))
			if pk.immediate != nil || !p.inPool("lora", pk.primary()) {
				t.Fatalf("immediate %v, destination %q; want a lora pod", pk.immediate, pk.dest)
			}
			st.CloseSend()
			testkit.Eventually(t, "the request released", func() bool { return p.inFlight() == 0 })

			// Without the header there is nothing to route by.
			st, err = p.client.Process(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			h = headersOnly()
			h.ProtocolConfig.RequestBodyMode = mode
			p.sendT(t, st, h)
			pk = &picked{}
			pk.read(t, p.recvT(t, st))
			if pk.immediate == nil || pk.immediate.GetStatus().GetCode() != 400 {
				t.Fatalf("no model header: immediate %v, destination %q; want 400", pk.immediate, pk.dest)
			}
		})
	}
}

// TestCancellation cancels streams at each stage; nothing leaks (goleak in
// TestMain) and the in-flight counts return to zero.
func TestCancellation(t *testing.T) {
	p := newPlatform(t, nil, 50)
	body := chat("chat-model", strings.Repeat("cancel me ", 20<<10), false)
	stages := []string{"mid-body", "after the decision", "after the response headers"}
	for _, stage := range stages {
		t.Run(stage, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			switch stage {
			case "mid-body":
				st, err := p.client.Process(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := st.Send(headersOnly()); err != nil {
					t.Fatal(err)
				}
				if err := st.Send(bodyChunk(body[:100<<10], false)); err != nil {
					t.Fatal(err)
				}
				cancel()
			case "after the decision":
				pk := p.request(t, ctx, call{body: body})
				if pk.immediate != nil {
					t.Fatalf("immediate: %s", pk.immediate.GetBody())
				}
				if p.inFlight() != 1 {
					t.Fatalf("in flight after the decision: %d, want 1", p.inFlight())
				}
				cancel()
			case "after the response headers":
				pk := p.request(t, ctx, call{body: body})
				p.sendT(t, pk.stream, responseHeaders(200))
				p.recvT(t, pk.stream)
				cancel()
			}
			testkit.Eventually(t, "every stream closed and nothing in flight", func() bool {
				return p.srv.Active() == 0 && p.inFlight() == 0
			})
		})
	}
	// The picker still works after the cancellations.
	pk := p.request(t, t.Context(), call{body: chat("chat-model", "still there?", false)})
	if code, out := p.respond(t, pk, "", nil, pk.primary(), ""); code != 200 {
		t.Fatalf("after cancellations: %d %s", code, out)
	}
}

func TestHealth(t *testing.T) {
	p := newPlatform(t, nil, 50)
	hc := grpc_health_v1.NewHealthClient(p.conn)
	for _, svc := range []string{"", "liveness", "readiness", extproc.ServiceName} {
		testkit.Eventually(t, fmt.Sprintf("health %q serving", svc), func() bool {
			r, err := hc.Check(t.Context(), &grpc_health_v1.HealthCheckRequest{Service: svc})
			return err == nil && r.GetStatus() == grpc_health_v1.HealthCheckResponse_SERVING
		})
	}
	if _, err := hc.Check(t.Context(), &grpc_health_v1.HealthCheckRequest{Service: "nope"}); err == nil {
		t.Fatal("health of an unknown service: no error")
	}
}

// TestConcurrentStreams runs many streams at once, a third of them
// cancelled at random points, under the race detector: every stream ends
// and the in-flight accounting returns to zero.
func TestConcurrentStreams(t *testing.T) {
	p := newPlatform(t, nil, 200)
	const n = 48
	errs := make(chan string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			st, err := p.client.Process(ctx)
			if err != nil {
				errs <- err.Error()
				return
			}
			body := chat("chat-model", fmt.Sprintf("%s question %d", strings.Repeat("shared context ", 200), i), i%2 == 0)
			if err := st.Send(headersOnly()); err != nil {
				errs <- err.Error()
				return
			}
			if i%3 == 1 {
				st.Send(bodyChunk(body[:len(body)/2], false))
				cancel() // mid-body
				return
			}
			if err := st.Send(bodyChunk(body, true)); err != nil {
				errs <- err.Error()
				return
			}
			var dest string
			for dest == "" {
				r, err := st.Recv()
				if err != nil {
					errs <- err.Error()
					return
				}
				for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
					dest = string(h.GetHeader().GetRawValue())
				}
			}
			if i%3 == 2 {
				cancel() // after the decision, before the response
				return
			}
			for { // the body coming back
				r, err := st.Recv()
				if err != nil {
					errs <- err.Error()
					return
				}
				if r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
					break
				}
			}
			st.Send(responseHeaders(200))
			st.Recv()
			st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}})
			st.Recv()
			st.CloseSend()
			if _, err := st.Recv(); err != io.EOF {
				errs <- fmt.Sprintf("stream %d end: %v", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	testkit.Eventually(t, "every stream closed and nothing in flight", func() bool {
		return p.srv.Active() == 0 && p.inFlight() == 0
	})
}

// TestModeWithoutProtocolConfig: an Envoy that does not send its
// processing mode gets the one the Server is configured for.
func TestModeWithoutProtocolConfig(t *testing.T) {
	p := newPlatform(t, &extproc.Server{BodyMode: filterv3.ProcessingMode_BUFFERED}, 50)
	st, err := p.client.Process(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	h := headersOnly()
	h.ProtocolConfig = nil
	p.sendT(t, st, h)
	// BUFFERED: the headers are answered at once, before any body.
	if r := p.recvT(t, st); r.GetRequestHeaders() == nil || r.GetRequestHeaders().GetResponse().GetHeaderMutation() != nil {
		t.Fatalf("want an empty request headers response, got %v", r)
	}
	p.sendT(t, st, bodyChunk(chat("chat-model", "hi", false), true))
	pk := &picked{}
	pk.read(t, p.recvT(t, st))
	if pk.immediate != nil || !p.inPool("chat", pk.primary()) || pk.dest != pk.meta {
		t.Fatalf("immediate %v, destination %q, metadata %q", pk.immediate, pk.dest, pk.meta)
	}
	// The response body is acknowledged, not echoed, in BUFFERED mode.
	p.sendT(t, st, responseHeaders(200))
	p.recvT(t, st)
	p.sendT(t, st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}})
	if r := p.recvT(t, st); r.GetResponseBody() == nil || r.GetResponseBody().GetResponse().GetBodyMutation() != nil {
		t.Fatalf("want a plain response body response, got %v", r)
	}
	if n := p.inFlight(); n != 0 {
		t.Fatalf("in flight after the response: %d", n)
	}
}

// TestUnexpectedSequences sends messages Envoy would not send in that
// order; the picker answers or ends the stream, never panics, and leaves
// nothing in flight.
func TestUnexpectedSequences(t *testing.T) {
	p := newPlatform(t, nil, 50)
	body := chat("chat-model", "hi", false)
	respBody := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}}
	trailers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
		RequestTrailers: &extprocv3.HttpTrailers{}}}
	cases := map[string][]*extprocv3.ProcessingRequest{
		"body without headers":           {bodyChunk(body, true)},
		"response before request":        {responseHeaders(200), respBody},
		"empty message":                  {{}},
		"trailers end an unended body":   {headersOnly(), bodyChunk(body, false), trailers},
		"trailers without body":          {headersOnly(), trailers},
		"headers twice":                  {headersOnly(), headersOnly(), bodyChunk(body, true)},
		"response body before headers":   {headersOnly(), bodyChunk(body, true), respBody},
		"body after the end of the body": {headersOnly(), bodyChunk(body, true), bodyChunk(body, true)},
	}
	for name, msgs := range cases {
		t.Run(name, func(t *testing.T) {
			st, err := p.client.Process(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				if err := st.Send(m); err != nil {
					break // the picker ended the stream
				}
			}
			st.CloseSend()
			for {
				if _, err := st.Recv(); err != nil {
					break
				}
			}
			testkit.Eventually(t, "the stream closed and nothing in flight", func() bool {
				return p.srv.Active() == 0 && p.inFlight() == 0
			})
		})
	}
}

// TestFirstTokenAtFirstBodyChunk: with the response body streamed to the
// picker, the TTFT it reports is timed at the first body chunk, not at
// the response headers, which vLLM sends for a stream before prefill.
// The gateway's clock is a fake one, advanced between the headers and the
// first event; in a buffered response mode the headers stay the time.
func TestFirstTokenAtFirstBodyChunk(t *testing.T) {
	for _, tc := range []struct {
		mode filterv3.ProcessingMode_BodySendMode
		want float64 // seconds
	}{
		{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, 0.4},
		{filterv3.ProcessingMode_BUFFERED, 0},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			clock := testkit.NewClock(time.Now())
			reg := prometheus.NewRegistry()
			p := newPlatform(t, nil, 1000, func(c *gateway.Config) { c.Now, c.Registerer = clock.Now, reg })
			pk := p.request(t, t.Context(), call{mode: tc.mode, body: chat("chat-model", "hello", true)})
			if pk.immediate != nil {
				t.Fatalf("immediate %d", pk.immediate.GetStatus().GetCode())
			}
			hs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")},
				{Key: "content-type", RawValue: []byte("text/event-stream")}}}
			p.sendT(t, pk.stream, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
				ResponseHeaders: &extprocv3.HttpHeaders{Headers: hs}}})
			p.recvT(t, pk.stream)
			clock.Advance(400 * time.Millisecond) // prefill
			for _, chunk := range []string{"data: {\"choices\":[]}\n\n", "data: [DONE]\n\n"} {
				p.sendT(t, pk.stream, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
					ResponseBody: &extprocv3.HttpBody{Body: []byte(chunk), EndOfStream: strings.Contains(chunk, "DONE")}}})
				p.recvT(t, pk.stream)
			}
			pk.stream.CloseSend()
			if _, err := pk.stream.Recv(); err != io.EOF {
				t.Fatalf("stream end: %v", err)
			}
			count, sum := ttftObserved(t, reg)
			if count != 1 || math.Abs(sum-tc.want) > 1e-9 {
				t.Errorf("TTFT observed %d times, sum %.3f s; want once, %.3f s", count, sum, tc.want)
			}
		})
	}
}

// ttftObserved reads meridian_tier1_ttft_seconds from reg: how many
// observations, and their sum.
func ttftObserved(t *testing.T, reg *prometheus.Registry) (uint64, float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "meridian_tier1_ttft_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return n, sum
}

// A body in chunks is decoded as they arrive (request.Prescan), and is
// judged as the same body in one piece: a bad escape or a control
// character in a long prompt, cut across chunks, is a 400 with the same
// message.
func TestChunkedBodyJudgedWhole(t *testing.T) {
	p := newPlatform(t, nil, 200)
	long := strings.Repeat(`Clause 14.2 applies.\n`, 200)
	for _, body := range []string{
		`{"model":"chat-model","messages":[{"role":"user","content":"` + long + `\q` + long + `"}]}`,
		"{\"model\":\"chat-model\",\"messages\":[{\"role\":\"user\",\"content\":\"" + long + "\x01" + long + "\"}]}",
		`{"model":"chat-model","messages":[{"role":"user","content":"` + long + `"}]`,
	} {
		whole := p.request(t, t.Context(), call{body: []byte(body)})
		chunked := p.request(t, t.Context(), call{body: []byte(body), chunk: 97})
		if whole.immediate == nil || chunked.immediate == nil {
			t.Fatalf("a malformed body was routed (whole %v, chunked %v)", whole.immediate, chunked.immediate)
		}
		if w, c := whole.immediate.GetStatus().GetCode(), chunked.immediate.GetStatus().GetCode(); w != 400 || c != w {
			t.Fatalf("status whole %d, chunked %d; want 400 both", w, c)
		}
		if w, c := string(whole.immediate.GetBody()), string(chunked.immediate.GetBody()); w != c {
			t.Fatalf("chunked answered %s, whole %s", c, w)
		}
	}
}
