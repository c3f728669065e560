package relayotel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
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
	version   string
	log       *slog.Logger
	producers []sdkmetric.Producer
	console   io.Writer
}

// WithServiceVersion sets service.version (OTEL_RESOURCE_ATTRIBUTES can
// still override it).
func WithServiceVersion(v string) Option { return func(c *setupConfig) { c.version = v } }

// WithLogger receives the SDK's errors (a collector that cannot be
// reached, spans dropped), at warning level. Default: slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *setupConfig) { c.log = l } }

// WithMetricProducer gives the metrics Setup exports: every export reads
// p. The relay passes the Prometheus registry its /metrics endpoint
// serves, through the OpenTelemetry Prometheus bridge
// (go.opentelemetry.io/contrib/bridges/prometheus), so that both exporters
// show the same metrics. Without a producer Setup exports no metrics and
// reads no metrics variable.
func WithMetricProducer(p sdkmetric.Producer) Option {
	return func(c *setupConfig) { c.producers = append(c.producers, p) }
}

// WithConsoleWriter is where the console exporters write
// (OTEL_TRACES_EXPORTER=console, OTEL_METRICS_EXPORTER=console). Default:
// os.Stderr rather than the specification's standard output, which a
// relay may use for messages (the stdout sink).
func WithConsoleWriter(w io.Writer) Option { return func(c *setupConfig) { c.console = w } }

// Signals says what Setup installed.
type Signals struct {
	// Traces: the global tracer provider exports spans, so Hooks made by
	// New without a TracerProvider record them.
	Traces bool
	// Metrics: a meter provider exports what the producers given with
	// WithMetricProducer hold, every OTEL_METRIC_EXPORT_INTERVAL.
	Metrics bool
}

// Setup configures OpenTelemetry from the standard OTEL_* environment
// variables: an exporter of spans, installed as the global tracer
// provider with the W3C Trace Context and Baggage propagators as the
// global propagator, and an exporter of the metrics of WithMetricProducer.
//
// A signal is exported when its variable names exporters
// (OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER: otlp, console, or both
// separated by a comma), or, when that variable is unset, when an OTLP
// endpoint for it is set (OTEL_EXPORTER_OTLP_ENDPOINT, or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / _METRICS_ENDPOINT): then it is
// otlp. Unlike the specification, whose default exporter is otlp, a
// process without any of these variables exports nothing and opens no
// connection. OTEL_SDK_DISABLED=true or an exporter variable set to none
// turns a signal off.
//
// The otlp exporter speaks the protocol of
// OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]PROTOCOL: http/protobuf (the
// default, port 4318) or grpc (port 4317); http/json is exported as
// http/protobuf. The SDK reads the rest: the exporters'
// OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]HEADERS, _TIMEOUT, _COMPRESSION,
// _CERTIFICATE, _CLIENT_CERTIFICATE, _CLIENT_KEY and _INSECURE;
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (service.name defaults
// to "outbox-relay"); OTEL_TRACES_SAMPLER[_ARG] (default
// parentbased_always_on: a message is traced when its writer's trace was
// sampled); OTEL_BSP_* for the batch span processor;
// OTEL_METRIC_EXPORT_INTERVAL (default 60000 ms) and
// OTEL_METRIC_EXPORT_TIMEOUT. A value Setup cannot honour is an error
// naming the variable.
//
// Setup installs no global meter provider: the metrics exported are the
// producers' and nothing else. Call shutdown before the process exits: it
// flushes buffered spans and exports the metrics a last time.
func Setup(ctx context.Context, opts ...Option) (shutdown func(context.Context) error, enabled Signals, err error) {
	noop := func(context.Context) error { return nil }
	cfg := setupConfig{log: slog.Default(), console: os.Stderr}
	for _, o := range opts {
		o(&cfg)
	}
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return noop, Signals{}, nil
	}
	traces, err := readSignal(tracesSignal)
	if err != nil {
		return noop, Signals{}, err
	}
	var metrics signalEnv
	if len(cfg.producers) > 0 {
		if metrics, err = readSignal(metricsSignal); err != nil {
			return noop, Signals{}, err
		}
	}
	if !traces.on() && !metrics.on() {
		return noop, Signals{}, nil
	}
	for _, s := range []signalEnv{traces, metrics} {
		if s.on() && s.protocol == "http/json" {
			cfg.log.Warn("opentelemetry: exporting "+s.name+" as http/protobuf: the Go SDK has no JSON encoding", "variable", s.protocolVar)
		}
	}
	res, err := newResource(ctx, cfg.version)
	if err != nil {
		return noop, Signals{}, err
	}

	var tp *sdktrace.TracerProvider
	var mp *sdkmetric.MeterProvider
	if traces.on() {
		if tp, err = newTracerProvider(ctx, traces, res, cfg.console); err != nil {
			return noop, Signals{}, err
		}
	}
	if metrics.on() {
		if mp, err = newMeterProvider(ctx, metrics, res, cfg); err != nil {
			if tp != nil {
				_ = tp.Shutdown(ctx)
			}
			return noop, Signals{}, err
		}
	}

	log := cfg.log
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry: error", "error", err)
	}))
	if tp != nil {
		otel.SetTracerProvider(tp)
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	}
	shutdown = func(ctx context.Context) error {
		var errs []error
		if tp != nil {
			errs = append(errs, tp.Shutdown(ctx))
		}
		if mp != nil {
			errs = append(errs, mp.Shutdown(ctx))
		}
		return errors.Join(errs...)
	}
	return shutdown, Signals{Traces: tp != nil, Metrics: mp != nil}, nil
}

// newTracerProvider batches spans to each exporter s names.
func newTracerProvider(ctx context.Context, s signalEnv, res *resource.Resource, console io.Writer) (*sdktrace.TracerProvider, error) {
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	var made []sdktrace.SpanExporter
	for _, name := range s.exporters {
		e, err := spanExporter(ctx, s, name, console)
		if err != nil {
			for _, m := range made {
				_ = m.Shutdown(ctx)
			}
			return nil, err
		}
		made = append(made, e)
		opts = append(opts, sdktrace.WithBatcher(e))
	}
	return sdktrace.NewTracerProvider(opts...), nil
}

// newMeterProvider reads the producers periodically into each exporter s
// names. It has no instrument of its own.
func newMeterProvider(ctx context.Context, s signalEnv, res *resource.Resource, cfg setupConfig) (*sdkmetric.MeterProvider, error) {
	var readerOpts []sdkmetric.PeriodicReaderOption
	for _, p := range cfg.producers {
		readerOpts = append(readerOpts, sdkmetric.WithProducer(p))
	}
	opts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	var made []sdkmetric.Reader
	for _, name := range s.exporters {
		e, err := metricExporter(ctx, s, name, cfg.console)
		if err != nil {
			for _, m := range made {
				_ = m.Shutdown(ctx)
			}
			return nil, err
		}
		r := sdkmetric.NewPeriodicReader(e, readerOpts...)
		made = append(made, r)
		opts = append(opts, sdkmetric.WithReader(r))
	}
	return sdkmetric.NewMeterProvider(opts...), nil
}

// newResource describes the process: service.name "outbox-relay" and
// service.version unless the environment says otherwise, the SDK, the
// host.
func newResource(ctx context.Context, version string) (*resource.Resource, error) {
	attrs := []resource.Option{resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost()}
	detected, err := resource.New(ctx, attrs...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("outbox: opentelemetry: resource: %w", err)
	}
	kv := []attribute.KeyValue{semconv.ServiceName(DefaultServiceName)}
	if version != "" {
		kv = append(kv, semconv.ServiceVersion(version))
	}
	// Schemaless, so that merging never fails on schema URLs; the
	// environment's values win.
	res, err := resource.Merge(resource.NewSchemaless(kv...), detected)
	if err != nil {
		return nil, fmt.Errorf("outbox: opentelemetry: resource: %w", err)
	}
	return res, nil
}
