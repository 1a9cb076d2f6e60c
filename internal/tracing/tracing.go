// Package tracing sets up OpenTelemetry tracing for Meridian's processes:
// an OTLP exporter (gRPC or HTTP) behind a batching tracer provider,
// sampled by ratio and parent-based (a caller's sampled traceparent is
// always followed, an unsampled one never), and W3C trace context
// (traceparent, tracestate) read from and written into HTTP headers.
//
// It decides nothing about which spans exist: Tier-2, Tier-1 and the
// simulator start their own. Tracing is off unless an endpoint is given;
// off, there is no tracer at all (nil), so that the request paths skip
// every tracing step and allocate nothing for it.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config is where spans go and how many are kept. The zero value is off.
type Config struct {
	// Endpoint is the OTLP collector: a URL whose scheme says how to reach
	// it — http://host:4317 (gRPC, plaintext), https://host:4317 (gRPC
	// over TLS); with Protocol "http/protobuf", http://host:4318 or
	// https://… (spans are posted to /v1/traces). Empty: tracing is off.
	Endpoint string
	// Protocol is "grpc" (the default) or "http/protobuf".
	Protocol string
	// SampleRatio is the fraction of new traces (requests without a
	// traceparent) recorded, 0 to 1 (the flags' default is 1). A request
	// whose caller sent a traceparent follows the caller's sampled flag
	// (parent-based), whatever the ratio.
	SampleRatio float64
	// Service is the service.name resource attribute ("meridian-tier2").
	Service string
	// Attributes are added to the resource (region, cluster, instance).
	Attributes map[string]string
	// BatchTimeout is how long finished spans wait to be exported in a
	// batch. Zero means the SDK's 5 s.
	BatchTimeout time.Duration
}

// Enabled reports whether c turns tracing on.
func (c Config) Enabled() bool { return c.Endpoint != "" }

// Check returns an error naming what is wrong in c, for flags.
func (c Config) Check() error {
	if !c.Enabled() {
		return nil
	}
	if c.SampleRatio < 0 || c.SampleRatio > 1 {
		return fmt.Errorf("tracing: sample ratio %v: want 0 to 1", c.SampleRatio)
	}
	switch c.Protocol {
	case "", "grpc", "http/protobuf":
	default:
		return fmt.Errorf("tracing: OTLP protocol %q: want grpc or http/protobuf", c.Protocol)
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("tracing: OTLP endpoint %q: want http://HOST:PORT or https://HOST:PORT", c.Endpoint)
	}
	return nil
}

// Provider is a started tracer provider; Shutdown exports what is left.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// Start starts exporting spans as c says. With tracing off it returns a
// nil *Provider, whose Tracer is nil and whose Shutdown does nothing.
// Connecting to the collector is not waited for: spans that cannot be
// exported are dropped, and requests never wait on the collector.
func Start(ctx context.Context, c Config) (*Provider, error) {
	if !c.Enabled() {
		return nil, nil
	}
	if err := c.Check(); err != nil {
		return nil, err
	}
	u, _ := url.Parse(c.Endpoint)
	var exp sdktrace.SpanExporter
	var err error
	switch c.Protocol {
	case "", "grpc":
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(u.Host), otlptracegrpc.WithTimeout(10 * time.Second)}
		if u.Scheme == "http" {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	default:
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithTimeout(10 * time.Second)}
		if u.Path != "" && u.Path != "/" {
			opts = append(opts, otlptracehttp.WithURLPath(u.Path))
		}
		if u.Scheme == "http" {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", c.Service)}
	for k, v := range c.Attributes {
		attrs = append(attrs, attribute.String(k, v))
	}
	var bopts []sdktrace.BatchSpanProcessorOption
	if c.BatchTimeout > 0 {
		bopts = append(bopts, sdktrace.WithBatchTimeout(c.BatchTimeout))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, bopts...),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
	)
	return &Provider{tp: tp}, nil
}

// Tracer is the named tracer of p, or nil when p is nil (tracing off).
func (p *Provider) Tracer(name string) trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tp.Tracer(name)
}

// Shutdown exports the spans not yet exported, within ctx.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	if err := p.tp.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// propagator reads and writes W3C traceparent and tracestate.
var propagator = propagation.TraceContext{}

// Extract returns ctx with the remote span context of h's traceparent
// and tracestate, when they are valid (otherwise ctx).
func Extract(ctx context.Context, h http.Header) context.Context {
	return propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// Inject writes the span context of ctx into h as traceparent and
// tracestate, replacing any there; with no valid span context in ctx it
// removes them, so that a hop never carries a caller's trace context
// past a span of its own that was not recorded.
func Inject(ctx context.Context, h http.Header) {
	h.Del("Traceparent")
	h.Del("Tracestate")
	propagator.Inject(ctx, propagation.HeaderCarrier(h))
}
