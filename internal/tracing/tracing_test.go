package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

func TestCheck(t *testing.T) {
	for _, c := range []Config{
		{Endpoint: "127.0.0.1:4317", SampleRatio: 1},
		{Endpoint: "ftp://x:1", SampleRatio: 1},
		{Endpoint: "http://x:4317", SampleRatio: 1.5},
		{Endpoint: "http://x:4317", SampleRatio: -0.1},
		{Endpoint: "http://x:4317", SampleRatio: 1, Protocol: "thrift"},
	} {
		if c.Check() == nil {
			t.Errorf("%+v accepted", c)
		}
		if _, err := Start(context.Background(), c); err == nil {
			t.Errorf("%+v started", c)
		}
	}
	p, err := Start(context.Background(), Config{})
	if p != nil || err != nil || p.Tracer("x") != nil || p.Shutdown(context.Background()) != nil {
		t.Errorf("off: %v %v", p, err)
	}
}

// TestHTTPExport: with http/protobuf, a span reaches the collector's
// /v1/traces as an OTLP ExportTraceServiceRequest, with its service name,
// continuing the traceparent Extract read; Inject writes the span's.
func TestHTTPExport(t *testing.T) {
	var mu sync.Mutex
	var got []*coltracepb.ExportTraceServiceRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		req := &coltracepb.ExportTraceServiceRequest{}
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(b, req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Write(out)
	}))
	defer srv.Close()
	p, err := Start(context.Background(), Config{Endpoint: srv.URL, Protocol: "http/protobuf", SampleRatio: 0, Service: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	in := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	ctx, span := p.Tracer("t").Start(Extract(context.Background(), in), "op")
	out := http.Header{"Traceparent": {"stale"}, "Tracestate": {"stale=1"}}
	Inject(ctx, out)
	span.End()
	sc := span.SpanContext()
	if want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + sc.SpanID().String() + "-01"; out.Get("Traceparent") != want || out.Get("Tracestate") != "" {
		t.Errorf("injected %v, want traceparent %s", out, want)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 {
		t.Fatalf("%d exports", len(got))
	}
	rs := got[0].GetResourceSpans()[0]
	s := rs.GetScopeSpans()[0].GetSpans()[0]
	if rs.GetResource().GetAttributes()[0].GetValue().GetStringValue() != "svc" || s.GetName() != "op" || string(s.GetParentSpanId()) != string([]byte{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}) {
		t.Errorf("exported %v", got[0])
	}
}
