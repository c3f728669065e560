package relayotel

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The signals Setup exports: the infix of their variables' names.
const (
	tracesSignal  = "traces"
	metricsSignal = "metrics"
)

// signalEnv is what the environment asks of one signal.
type signalEnv struct {
	name        string   // tracesSignal or metricsSignal
	exporters   []string // "otlp", "console"; none: the signal is off
	protocol    string   // the otlp exporter's: grpc, http/protobuf or http/json
	protocolVar string   // the variable that set protocol ("" for the default)
}

func (s signalEnv) on() bool { return len(s.exporters) > 0 }

func getenv(name string) string { return strings.TrimSpace(os.Getenv(name)) }

// readSignal reads OTEL_<SIGNAL>_EXPORTER and, for otlp, the endpoint and
// the protocol; an error names the variable it cannot honour.
func readSignal(name string) (signalEnv, error) {
	upper := strings.ToUpper(name)
	s := signalEnv{name: name}
	exporterVar := "OTEL_" + upper + "_EXPORTER"
	value := getenv(exporterVar)
	if value == "" {
		// The specification's default is otlp; here a signal is exported
		// only once an endpoint says where to, so that a relay without
		// OTEL_* variables opens no connection.
		if getenv("OTEL_EXPORTER_OTLP_"+upper+"_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
			return s, nil
		}
		value = "otlp"
	}
	if value == "none" {
		return s, nil
	}
	for _, e := range strings.Split(value, ",") {
		switch e = strings.TrimSpace(e); e {
		case "otlp", "console":
			if !slices.Contains(s.exporters, e) {
				s.exporters = append(s.exporters, e)
			}
		case "prometheus":
			if name == metricsSignal {
				return s, fmt.Errorf("outbox: opentelemetry: %s=%q: the relay serves Prometheus metrics on its admin listener's /metrics (--admin-addr); use otlp, console or none", exporterVar, value)
			}
			fallthrough
		default:
			return s, fmt.Errorf("outbox: opentelemetry: %s=%q is not supported: use otlp, console, both separated by a comma, or none", exporterVar, value)
		}
	}
	if !slices.Contains(s.exporters, "otlp") {
		return s, nil
	}
	if err := checkEndpoint(upper); err != nil {
		return s, err
	}
	return s, s.readProtocol(upper)
}

// checkEndpoint refuses an endpoint the exporter would misread: the
// specification wants a URL with an http or https scheme and a host, and
// the SDK takes "collector:4317" for a URL of scheme "collector" and
// exports to its default address instead.
func checkEndpoint(upper string) error {
	name := "OTEL_EXPORTER_OTLP_" + upper + "_ENDPOINT"
	value := getenv(name)
	if value == "" {
		name = "OTEL_EXPORTER_OTLP_ENDPOINT"
		value = getenv(name)
	}
	if value == "" {
		return nil // the SDK's default: localhost, port 4318 or 4317
	}
	if u, err := url.Parse(value); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// The URL may carry a credential: do not repeat it.
		return fmt.Errorf("outbox: opentelemetry: %s must be an http:// or https:// URL with a host", name)
	}
	return nil
}

func (s *signalEnv) readProtocol(upper string) error {
	s.protocolVar = "OTEL_EXPORTER_OTLP_" + upper + "_PROTOCOL"
	s.protocol = getenv(s.protocolVar)
	if s.protocol == "" {
		s.protocolVar = "OTEL_EXPORTER_OTLP_PROTOCOL"
		s.protocol = getenv(s.protocolVar)
	}
	switch s.protocol {
	case "":
		s.protocol, s.protocolVar = "http/protobuf", ""
	case "grpc", "http/protobuf", "http/json":
	default:
		return fmt.Errorf("outbox: opentelemetry: %s=%q is not supported: use grpc or http/protobuf", s.protocolVar, s.protocol)
	}
	return nil
}

// spanExporter makes the exporter name (of s.exporters). The OTLP
// exporters read their own variables (endpoint, headers, TLS, timeout,
// compression).
func spanExporter(ctx context.Context, s signalEnv, name string, console io.Writer) (sdktrace.SpanExporter, error) {
	var e sdktrace.SpanExporter
	var err error
	switch {
	case name == "console":
		e, err = stdouttrace.New(stdouttrace.WithWriter(console))
	case s.protocol == "grpc":
		e, err = otlptracegrpc.New(ctx)
	default:
		e, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: opentelemetry: %s exporter of traces: %w", name, err)
	}
	return e, nil
}

// metricExporter is spanExporter for metrics.
func metricExporter(ctx context.Context, s signalEnv, name string, console io.Writer) (sdkmetric.Exporter, error) {
	var e sdkmetric.Exporter
	var err error
	switch {
	case name == "console":
		e, err = stdoutmetric.New(stdoutmetric.WithWriter(console))
	case s.protocol == "grpc":
		e, err = otlpmetricgrpc.New(ctx)
	default:
		e, err = otlpmetrichttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: opentelemetry: %s exporter of metrics: %w", name, err)
	}
	return e, nil
}
