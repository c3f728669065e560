package awsbatch

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// Service says how a sink reads one service's answers to its batch
// requests.
type Service struct {
	// Prefix starts the sink's error messages ("outbox: sqs").
	Prefix string
	// Op names the batch call in errors ("SendMessageBatch").
	Op string
	// Refused is wrapped by every refusal of the service.
	Refused error
	// Permanent reports an error code that says a message, or its
	// destination, can never be accepted: the message is dead-lettered at
	// once. Every other code is retried, bounded by max attempts.
	Permanent func(code string) bool
}

// Failure is one entry the service refused in its answer.
type Failure struct {
	ID, Code, Message string
}

// Refusal is the service's refusal, with code and message, of a message
// for dest: permanent when the code says so, else retriable.
func (s Service) Refusal(dest, code, msg string) error {
	err := fmt.Errorf("%w: %s: %s: %s", s.Refused, dest, code, msg)
	if s.Permanent(code) {
		return sinks.Permanent(err)
	}
	return err
}

// RequestErr classifies the failure of a whole batch request: an API
// error by its code (as Refusal; answered with HTTP 502, 503 or 504, the
// service unavailable, sinks.Unavailable), anything else as TransportErr
// does.
func (s Service) RequestErr(dest string, err error) error {
	var api smithy.APIError
	if errors.As(err, &api) {
		refusal := s.Refusal(dest, api.ErrorCode(), api.ErrorMessage())
		if Unavailable(err) && !sinks.IsPermanent(refusal) {
			return sinks.Unavailable(refusal)
		}
		return refusal
	}
	return TransportErr(s.Prefix, err)
}

// Unavailable reports whether err is an answer of HTTP 502, 503 or 504:
// the service, or what stands in front of it, is down.
func Unavailable(err error) bool {
	var re *smithyhttp.ResponseError
	if !errors.As(err, &re) {
		return false
	}
	switch re.HTTPStatusCode() {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// Outcomes returns the error of each entry of req, in order, nil for an
// accepted one. err is the batch call's error: it fails every entry (see
// RequestErr). Otherwise ok holds the ids the service accepted and failed
// the entries it refused; an entry in neither failed too, as refused.
func (s Service) Outcomes(req []*Entry, err error, ok []string, failed []Failure) []error {
	errs := make([]error, len(req))
	if err != nil {
		err = s.RequestErr(req[0].Dest, err)
		for j := range errs {
			errs[j] = err
		}
		return errs
	}
	done := make(map[string]bool, len(ok))
	for _, id := range ok {
		done[id] = true
	}
	refused := make(map[string]Failure, len(failed))
	for _, f := range failed {
		refused[f.ID] = f
	}
	for j, e := range req {
		if f, ok := refused[e.ID()]; ok {
			errs[j] = s.Refusal(e.Dest, f.Code, f.Message)
		} else if !done[e.ID()] {
			errs[j] = fmt.Errorf("%w: %s to %s answered nothing for entry %s", s.Refused, s.Op, e.Dest, e.ID())
		}
	}
	return errs
}

// Attrs returns e's attributes keyed by name, each made by value (the
// service's own attribute type).
func Attrs[V any](e *Entry, value func(typ, v string) V) map[string]V {
	attrs := make(map[string]V, len(e.Attrs))
	for _, a := range e.Attrs {
		attrs[a.Name] = value(a.Type, a.Value)
	}
	return attrs
}

// Answer is Outcomes for a service's batch answer: ok are its accepted
// entries and failed its refused ones, each read by the accessors of the
// service's own types.
func Answer[OK, F any](s Service, req []*Entry, ok []OK, okID func(OK) *string, failed []F, failure func(F) (id, code, msg *string)) []error {
	ids := make([]string, len(ok))
	for i, e := range ok {
		ids[i] = deref(okID(e))
	}
	fs := make([]Failure, len(failed))
	for i, f := range failed {
		id, code, msg := failure(f)
		fs[i] = Failure{ID: deref(id), Code: deref(code), Message: deref(msg)}
	}
	return s.Outcomes(req, nil, ids, fs)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
