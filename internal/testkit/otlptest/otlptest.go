// Package otlptest is an OTLP receiver for tests: the collector's trace
// and metrics services, over gRPC and over HTTP (protobuf), on loopback,
// keeping every export request it is sent. It is built on the collector's
// own protobuf types (go.opentelemetry.io/proto/otlp), so what it decodes
// is what a real collector would receive.
package otlptest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	colmetricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Receiver answers OTLP exports over gRPC (GRPCEndpoint) and HTTP
// (HTTPEndpoint) until the test ends.
type Receiver struct {
	// GRPCEndpoint is the gRPC receiver's URL (http://127.0.0.1:port),
	// for OTEL_EXPORTER_OTLP_ENDPOINT with OTEL_EXPORTER_OTLP_PROTOCOL=grpc.
	GRPCEndpoint string
	// HTTPEndpoint is the HTTP receiver's base URL: exports to a path
	// ending in "metrics" are metrics, any other path traces.
	HTTPEndpoint string

	mu      sync.Mutex
	exports []Export
	changed chan struct{} // closed and replaced at every export
}

// Export is one export request the receiver accepted.
type Export struct {
	Transport string // "grpc" or "http"
	Path      string // the HTTP path, or the gRPC method
	// Header holds the request's HTTP headers or gRPC metadata, keys in
	// lower case, the first value of each.
	Header  map[string]string
	Traces  *coltracepb.ExportTraceServiceRequest     // set for a trace export
	Metrics *colmetricspb.ExportMetricsServiceRequest // set for a metrics export
}

// Start starts both receivers; they stop when the test ends.
func Start(tb testing.TB) *Receiver {
	tb.Helper()
	r := &Receiver{changed: make(chan struct{})}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("otlptest: listen: %v", err)
	}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, traceService{r: r})
	colmetricspb.RegisterMetricsServiceServer(srv, metricsService{r: r})
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	tb.Cleanup(func() { srv.Stop(); <-served })
	r.GRPCEndpoint = "http://" + lis.Addr().String()

	hs := httptest.NewServer(http.HandlerFunc(r.serveHTTP))
	tb.Cleanup(hs.Close)
	r.HTTPEndpoint = hs.URL
	return r
}

func (r *Receiver) add(e Export) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exports = append(r.exports, e)
	close(r.changed)
	r.changed = make(chan struct{})
}

// Exports returns the export requests accepted so far, in order.
func (r *Receiver) Exports() []Export {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Export(nil), r.exports...)
}

// Reset forgets the exports accepted so far.
func (r *Receiver) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exports = nil
}

// Await returns once cond holds, checking it after every export, and
// fails the test with cond's explanation if it does not hold within
// timeout.
func (r *Receiver) Await(tb testing.TB, timeout time.Duration, cond func() (bool, string)) {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		changed := r.changed // taken before cond runs: no export is missed
		r.mu.Unlock()
		ok, why := cond()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			tb.Fatalf("otlptest: not within %s: %s", timeout, why)
		}
	}
}

// Span is a span the receiver was sent, with its resource's attributes.
type Span struct {
	Resource map[string]string
	Scope    string
	*tracepb.Span
}

// Spans returns every span received so far.
func (r *Receiver) Spans() []Span {
	var out []Span
	for _, e := range r.Exports() {
		for _, rs := range e.Traces.GetResourceSpans() {
			res := attrs(rs.GetResource().GetAttributes())
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					out = append(out, Span{Resource: res, Scope: ss.GetScope().GetName(), Span: s})
				}
			}
		}
	}
	return out
}

// Metric is one metric of one export, with its resource's attributes.
type Metric struct {
	Resource map[string]string
	Scope    string
	*metricspb.Metric
}

// Metrics returns every metric named name received so far, in the order
// of their exports ("" for all).
func (r *Receiver) Metrics(name string) []Metric {
	var out []Metric
	for _, e := range r.Exports() {
		for _, rm := range e.Metrics.GetResourceMetrics() {
			res := attrs(rm.GetResource().GetAttributes())
			for _, sm := range rm.GetScopeMetrics() {
				for _, m := range sm.GetMetrics() {
					if name == "" || m.GetName() == name {
						out = append(out, Metric{Resource: res, Scope: sm.GetScope().GetName(), Metric: m})
					}
				}
			}
		}
	}
	return out
}

// Value returns the value of m's number data point whose attributes
// include want (a sum's or a gauge's), and whether there is one.
func (m Metric) Value(want map[string]string) (float64, bool) {
	var points []*metricspb.NumberDataPoint
	switch d := m.GetData().(type) {
	case *metricspb.Metric_Sum:
		points = d.Sum.GetDataPoints()
	case *metricspb.Metric_Gauge:
		points = d.Gauge.GetDataPoints()
	}
	for _, p := range points {
		if has(attrs(p.GetAttributes()), want) {
			switch v := p.GetValue().(type) {
			case *metricspb.NumberDataPoint_AsDouble:
				return v.AsDouble, true
			case *metricspb.NumberDataPoint_AsInt:
				return float64(v.AsInt), true
			}
		}
	}
	return 0, false
}

func has(got, want map[string]string) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// Attrs flattens OTLP attributes to their string form.
func Attrs(kvs []*commonpb.KeyValue) map[string]string { return attrs(kvs) }

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.GetKey()] = v.GetStringValue()
		case *commonpb.AnyValue_IntValue:
			out[kv.GetKey()] = fmt.Sprint(v.GetIntValue())
		case *commonpb.AnyValue_BoolValue:
			out[kv.GetKey()] = fmt.Sprint(v.GetBoolValue())
		case *commonpb.AnyValue_DoubleValue:
			out[kv.GetKey()] = fmt.Sprint(v.GetDoubleValue())
		default:
			out[kv.GetKey()] = v.String()
		}
	}
	return out
}

type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s traceService) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.r.add(Export{Transport: "grpc", Path: method(ctx), Header: grpcHeader(ctx), Traces: req})
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

type metricsService struct {
	colmetricspb.UnimplementedMetricsServiceServer
	r *Receiver
}

func (s metricsService) Export(ctx context.Context, req *colmetricspb.ExportMetricsServiceRequest) (*colmetricspb.ExportMetricsServiceResponse, error) {
	s.r.add(Export{Transport: "grpc", Path: method(ctx), Header: grpcHeader(ctx), Metrics: req})
	return &colmetricspb.ExportMetricsServiceResponse{}, nil
}

func method(ctx context.Context) string {
	m, _ := grpc.Method(ctx)
	return m
}

func grpcHeader(ctx context.Context) map[string]string {
	md, _ := metadata.FromIncomingContext(ctx)
	out := make(map[string]string, len(md))
	for k, vs := range md {
		if len(vs) > 0 {
			out[strings.ToLower(k)] = vs[0]
		}
	}
	return out
}

// serveHTTP decodes an OTLP/HTTP protobuf export, as a collector does.
func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil || req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "otlptest: want a POST of application/x-protobuf", http.StatusBadRequest)
		return
	}
	header := make(map[string]string, len(req.Header))
	for k, vs := range req.Header {
		header[strings.ToLower(k)] = vs[0]
	}
	e := Export{Transport: "http", Path: req.URL.Path, Header: header}
	var resp proto.Message
	if strings.HasSuffix(req.URL.Path, "metrics") {
		e.Metrics, resp = &colmetricspb.ExportMetricsServiceRequest{}, &colmetricspb.ExportMetricsServiceResponse{}
		err = proto.Unmarshal(body, e.Metrics)
	} else {
		e.Traces, resp = &coltracepb.ExportTraceServiceRequest{}, &coltracepb.ExportTraceServiceResponse{}
		err = proto.Unmarshal(body, e.Traces)
	}
	if err != nil {
		http.Error(w, "otlptest: "+err.Error(), http.StatusBadRequest)
		return
	}
	r.add(e)
	out, err := proto.Marshal(resp)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}
