package platform_test

import (
	"context"
	"encoding/hex"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3/option"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/internal/tracing"
	"github.com/meridian-router/meridian/platform"
	"github.com/meridian-router/meridian/platform/platformtest"
)

// otlpCollector is an OTLP/gRPC trace receiver: the TraceService of the
// OpenTelemetry protocol, keeping every span it is sent with its
// resource's service.name.
type otlpCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []collected
}

type collected struct {
	service string
	span    *tracepb.Span
}

func (c *otlpCollector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, collected{service, s})
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// trace returns the spans of traceID, by name.
func (c *otlpCollector) trace(traceID []byte) map[string]collected {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]collected{}
	for _, s := range c.spans {
		if string(s.span.GetTraceId()) == string(traceID) {
			out[s.span.GetName()] = s
		}
	}
	return out
}

func startCollector(t *testing.T) (*otlpCollector, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &otlpCollector{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, c)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return c, "http://" + ln.Addr().String()
}

// TestTraceAcrossTiers follows one request, sent with a caller's
// traceparent, through a real OTLP receiver: Tier-2's spans (the request,
// admission, rate limit, cluster choice, upstream), Tier-1's (the request,
// pod choice, upstream) and the simulated pod's share the caller's trace
// id, each hop's server span is the child of the previous hop's upstream
// span, and both tiers' request spans name the request's id.
func TestTraceAcrossTiers(t *testing.T) {
	col, endpoint := startCollector(t)
	p := platformtest.Start(t, func(c *platform.Config) {
		c.Tracing = tracing.Config{Endpoint: endpoint, SampleRatio: 0, BatchTimeout: 50 * time.Millisecond}
	})
	// The ratio is 0: the request is traced only because its caller's
	// traceparent is sampled (parent-based).
	traceID, _ := hex.DecodeString("4bf92f3577b34da6a3ce929d0e0e4736")
	callerSpan, _ := hex.DecodeString("00f067aa0ba902b7")
	c := platformtest.Client(p, "us-east-1", platformtest.Token(t, p, "team-a"))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var raw *http.Response
	if _, err := c.Chat.Completions.New(ctx, platformtest.Ask("fast"), option.WithResponseInto(&raw),
		option.WithHeader("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")); err != nil {
		t.Fatal(err)
	}
	id := raw.Header.Get("X-Request-Id")
	names := []string{"tier2 /v1/chat/completions", "tier2.admission", "tier2.rate_limit", "tier2.cluster_choice", "tier2.upstream",
		"tier1 /v1/chat/completions", "tier1.pod_choice", "tier1.upstream", "llm_request"}
	var spans map[string]collected
	testkit.Eventually(t, "every span of the request at the collector", func() bool {
		spans = col.trace(traceID)
		for _, n := range names {
			if _, ok := spans[n]; !ok {
				return false
			}
		}
		return true
	})
	parent := map[string]string{
		"tier2.admission": "tier2 /v1/chat/completions", "tier2.rate_limit": "tier2 /v1/chat/completions",
		"tier2.cluster_choice": "tier2 /v1/chat/completions", "tier2.upstream": "tier2 /v1/chat/completions",
		"tier1 /v1/chat/completions": "tier2.upstream", "tier1.pod_choice": "tier1 /v1/chat/completions",
		"tier1.upstream": "tier1 /v1/chat/completions", "llm_request": "tier1.upstream",
	}
	for child, want := range parent {
		if got := spans[child].span.GetParentSpanId(); string(got) != string(spans[want].span.GetSpanId()) {
			t.Errorf("%s: parent %x, want %s's %x", child, got, want, spans[want].span.GetSpanId())
		}
	}
	if got := spans["tier2 /v1/chat/completions"].span.GetParentSpanId(); string(got) != string(callerSpan) {
		t.Errorf("Tier-2's request span: parent %x, want the caller's span %x", got, callerSpan)
	}
	for name, service := range map[string]string{"tier2 /v1/chat/completions": "meridian-tier2", "tier1 /v1/chat/completions": "meridian-tier1", "llm_request": "meridian-sim"} {
		s := spans[name]
		if s.service != service {
			t.Errorf("%s from service %q, want %q", name, s.service, service)
		}
		found := false
		for _, kv := range s.span.GetAttributes() {
			found = found || kv.GetKey() == "meridian.request_id" && kv.GetValue().GetStringValue() == id
		}
		if !found {
			t.Errorf("%s does not name the request id %q: %v", name, id, s.span.GetAttributes())
		}
	}
}
