package relayotel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// DefaultServiceName is service.name when neither OTEL_SERVICE_NAME nor
// OTEL_RESOURCE_ATTRIBUTES names the service.
const DefaultServiceName = "outbox-relay"

// Option configures Setup.
type Option func(*setupConfig)

type setupConfig struct {
	version string
	log     *slog.Logger
}

// WithServiceVersion sets service.version (OTEL_RESOURCE_ATTRIBUTES can
// still override it).
func WithServiceVersion(v string) Option { return func(c *setupConfig) { c.version = v } }

// WithLogger receives the SDK's errors (a collector that cannot be
// reached, spans dropped), at warning level. Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *setupConfig) { c.log = l } }

// Setup installs an OpenTelemetry tracer provider that exports spans with
// OTLP over HTTP (protobuf), as the global provider, and the W3C Trace
// Context and Baggage propagators as the global propagator. It does so
// only when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// is set; otherwise, or when OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none, it installs nothing and returns enabled false
// and a shutdown that does nothing.
//
// The standard variables apply: OTEL_EXPORTER_OTLP_[TRACES_]HEADERS,
// _TIMEOUT, _COMPRESSION, _CERTIFICATE, _CLIENT_CERTIFICATE, _CLIENT_KEY,
// _INSECURE and _PROTOCOL (http/protobuf or http/json; grpc is not built
// in), OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (service.name
// defaults to "outbox-relay"), OTEL_TRACES_SAMPLER[_ARG] (default
// parentbased_always_on: a message is traced when its writer's trace was
// sampled) and OTEL_BSP_* for the batch span processor.
//
// Call shutdown before the process exits: it flushes buffered spans.
func Setup(ctx context.Context, opts ...Option) (shutdown func(context.Context) error, enabled bool, err error) {
	noop := func(context.Context) error { return nil }
	cfg := setupConfig{log: slog.Default()}
	for _, o := range opts {
		o(&cfg)
	}
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return noop, false, nil
	}
	switch exp := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exp {
	case "", "otlp":
	case "none":
		return noop, false, nil
	default:
		return noop, false, fmt.Errorf("outbox: tracing: OTEL_TRACES_EXPORTER=%q is not supported (use otlp or none)", exp)
	}
	endpointVar := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	endpoint := strings.TrimSpace(os.Getenv(endpointVar))
	if endpoint == "" {
		endpointVar = "OTEL_EXPORTER_OTLP_ENDPOINT"
		endpoint = strings.TrimSpace(os.Getenv(endpointVar))
	}
	if endpoint == "" {
		return noop, false, nil
	}
	if u, perr := url.Parse(endpoint); perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// The URL may carry a credential: do not repeat it.
		return noop, false, fmt.Errorf("outbox: tracing: %s must be an http:// or https:// URL with a host", endpointVar)
	}
	protoVar := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	protocol := strings.TrimSpace(os.Getenv(protoVar))
	if protocol == "" {
		protoVar = "OTEL_EXPORTER_OTLP_PROTOCOL"
		protocol = strings.TrimSpace(os.Getenv(protoVar))
	}
	switch protocol {
	case "", "http/protobuf", "http/json":
	default:
		return noop, false, fmt.Errorf("outbox: tracing: %s=%q is not supported: this build exports OTLP over HTTP (http/protobuf, port 4318 by default)", protoVar, protocol)
	}

	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return noop, false, fmt.Errorf("outbox: tracing: OTLP exporter: %w", err)
	}
	res, err := newResource(ctx, cfg.version)
	if err != nil {
		_ = exporter.Shutdown(ctx)
		return noop, false, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter),
		sdktrace.WithResource(res),
	)
	log := cfg.log
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: OpenTelemetry error", "error", err)
	}))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp.Shutdown, true, nil
}

// newResource describes the process: service.name "outbox-relay" and
// service.version unless the environment says otherwise, the SDK, the
// host.
func newResource(ctx context.Context, version string) (*resource.Resource, error) {
	attrs := []resource.Option{resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost()}
	detected, err := resource.New(ctx, attrs...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("outbox: tracing: resource: %w", err)
	}
	kv := []attribute.KeyValue{semconv.ServiceName(DefaultServiceName)}
	if version != "" {
		kv = append(kv, semconv.ServiceVersion(version))
	}
	// Schemaless, so that merging never fails on schema URLs; the
	// environment's values win.
	res, err := resource.Merge(resource.NewSchemaless(kv...), detected)
	if err != nil {
		return nil, fmt.Errorf("outbox: tracing: resource: %w", err)
	}
	return res, nil
}
