// Package stdout is a sink that writes each message as one JSON line to an
// io.Writer (os.Stdout by default), for demos, debugging and piping into jq.
//
// A line looks like
//
//	{"id":"…","seq":42,"topic":"orders","key":"order-7","headers":{"content-type":"application/json"},"payload":{"total":10},"payload_encoding":"json","created_at":"2025-01-02T03:04:05.123456Z"}
//
// The payload is embedded as a JSON value when that round-trips byte for
// byte (see encodePayload); otherwise it is a base64 string and
// payload_encoding is "base64". A message counts as delivered only once its
// whole line was written to the underlying writer.
//
// This package does not rotate files, add colour or pretty-print: redirect
// and post-process the output instead.
package stdout

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// Config configures the stdout sink. The URL form has no options.
type Config struct {
	// Output receives the JSON lines. Default: os.Stdout. It cannot be set
	// from a URL or a config file; Go callers and tests set it.
	Output io.Writer `yaml:"-"`
}

// ParseURL accepts exactly "stdout", "stdout:" or "stdout://": the sink has
// no options, and anything else (a host, path, user, query parameter or
// fragment) is rejected so that a typo is not silently ignored.
func ParseURL(raw string) (Config, error) {
	if raw == "stdout" {
		return Config{}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error repeats the raw URL; stdout URLs carry no secrets but
		// a mistyped one might, so report only the cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return Config{}, fmt.Errorf("outbox: stdout: invalid sink URL: %w", err)
	}
	if u.Scheme != "stdout" {
		return Config{}, fmt.Errorf("outbox: stdout: sink URL scheme is %q, want \"stdout\"", u.Scheme)
	}
	for name := range u.Query() {
		return Config{}, fmt.Errorf("outbox: stdout: unknown URL parameter %q (the stdout sink has no options)", name)
	}
	switch {
	case u.User != nil:
		return Config{}, errors.New("outbox: stdout: sink URL must not contain a user or password")
	case u.Host != "":
		return Config{}, fmt.Errorf("outbox: stdout: sink URL must not have a host (got %q); use \"stdout://\"", u.Host)
	case u.Opaque != "" || u.Path != "":
		return Config{}, errors.New("outbox: stdout: sink URL must not have a path; use \"stdout://\"")
	case u.Fragment != "" || u.RawQuery != "" || u.ForceQuery:
		return Config{}, errors.New("outbox: stdout: sink URL must not have a query or fragment; use \"stdout://\"")
	}
	return Config{}, nil
}

// Validate reports configuration errors. Every Config is valid today; the
// method exists so that all sinks are wired the same way.
func (c Config) Validate() error { return nil }

// Redacted returns the sink URL for logs. There are no secrets to hide.
func (c Config) Redacted() string { return "stdout://" }

// Sink writes JSON lines. It is safe for concurrent use: Sends are
// serialized so lines never interleave.
type Sink struct {
	out    io.Writer
	logger *slog.Logger

	// lock is a one-slot semaphore rather than a sync.Mutex so that a Send
	// queued behind a slow writer, and Close, can give up when ctx ends.
	// closed and midLine are guarded by it.
	lock    chan struct{}
	closed  bool
	midLine bool // the last write stopped inside a line
	buf     bytes.Buffer
}

var _ sinks.Sink = (*Sink)(nil)

// flushAt is how much encoded output Send buffers before writing it out:
// large enough that a typical batch is one write call, small enough that a
// batch of big payloads does not double the relay's memory.
const flushAt = 64 << 10

// New returns a sink writing to cfg.Output (os.Stdout when nil).
func New(cfg Config, logger *slog.Logger) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Output == nil {
		cfg.Output = os.Stdout
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Sink{out: cfg.Output, logger: logger, lock: make(chan struct{}, 1)}, nil
}

func (s *Sink) acquire(ctx context.Context) error {
	select {
	case s.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Sink) release() { <-s.lock }

// Send writes one line per message and returns once they are all handed to
// the writer. When a write fails, the messages whose lines were fully
// written are delivered and the rest of the batch fails with a retriable
// error: a broken pipe or a full disk may clear up, and the relay retries.
func (s *Sink) Send(ctx context.Context, msgs []sinks.Message) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("outbox: stdout: send: %w", err)
	}
	if err := s.acquire(ctx); err != nil {
		return fmt.Errorf("outbox: stdout: send: %w", err)
	}
	defer s.release()
	if s.closed {
		return fmt.Errorf("outbox: stdout: send: %w", sinks.ErrClosed)
	}
	if len(msgs) == 0 {
		return nil
	}

	be := sinks.NewBatchError(len(msgs))
	s.buf.Reset()
	if s.midLine {
		// A failed write left a partial line behind; end it so that the
		// next line parses. Consumers see one malformed line, not two.
		s.buf.WriteByte('\n')
	}
	var ends []int // ends[j] = offset in buf just past the line of msgs[start+j]
	start := 0     // index of the first message in buf
	flush := func(upto int) error {
		n, err := s.out.Write(s.buf.Bytes())
		if err == nil && n < s.buf.Len() {
			err = io.ErrShortWrite
		}
		if err != nil {
			// Lines that made it completely are delivered; the rest of
			// the batch, this chunk included, is not.
			done := start
			for j, end := range ends {
				if end <= n {
					done = start + j + 1
				}
			}
			if n > 0 { // n == 0 leaves the output where it was
				s.midLine = s.buf.Bytes()[n-1] != '\n'
			}
			werr := fmt.Errorf("outbox: stdout: write: %w", err)
			for i := done; i < len(msgs); i++ {
				be.Errs[i] = werr
			}
			s.logger.Warn("stdout sink write failed", "delivered", done, "failed", len(msgs)-done, "err", err)
			return werr
		}
		s.midLine = false
		s.buf.Reset()
		ends = ends[:0]
		start = upto
		return nil
	}
	for i, m := range msgs {
		encodeLine(&s.buf, m)
		ends = append(ends, s.buf.Len())
		if s.buf.Len() >= flushAt || i == len(msgs)-1 {
			if flush(i+1) != nil {
				return be.Err()
			}
		}
	}
	return nil
}

// Close marks the sink closed after in-flight Sends finish. It does not
// close the writer: os.Stdout belongs to the process, and a caller-supplied
// writer to the caller.
func (s *Sink) Close(ctx context.Context) error {
	if err := s.acquire(ctx); err != nil {
		return fmt.Errorf("outbox: stdout: close: %w", err)
	}
	s.closed = true
	s.release()
	return nil
}

// line is the JSON shape of one message, minus the payload, which is
// written by hand (see encodeLine).
type line struct {
	ID      string            `json:"id"`
	Seq     int64             `json:"seq"`
	Topic   string            `json:"topic"`
	Key     *string           `json:"key"`
	Headers map[string]string `json:"headers"`
}

// encodeLine appends m as one JSON line to buf.
func encodeLine(buf *bytes.Buffer, m sinks.Message) {
	l := line{ID: m.ID, Seq: m.Seq, Topic: m.Topic, Headers: m.Headers}
	if m.Key != "" {
		l.Key = &m.Key
	}
	if l.Headers == nil {
		l.Headers = map[string]string{}
	}
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false) // keep "<" and "&" readable; this is not HTML
	if err := enc.Encode(l); err != nil {
		// A struct of strings and a string map cannot fail to encode.
		panic("outbox: stdout: encoding line: " + err.Error())
	}
	// Encode ended the object with "}\n"; reopen it to append the rest.
	buf.Truncate(buf.Len() - 2)
	raw, encoding := encodePayload(m.Payload)
	buf.WriteString(`,"payload":`)
	if encoding == "json" {
		buf.Write(raw)
	} else {
		buf.WriteByte('"')
		buf.WriteString(base64.StdEncoding.EncodeToString(m.Payload))
		buf.WriteByte('"')
	}
	buf.WriteString(`,"payload_encoding":"`)
	buf.WriteString(encoding)
	buf.WriteString(`","created_at":"`)
	buf.WriteString(m.CreatedAt.UTC().Format(time.RFC3339Nano))
	buf.WriteString("\"}\n")
}

// encodePayload decides how the payload is embedded. It is embedded as a
// JSON value, verbatim, only when a JSON parser hands back exactly the same
// bytes: valid JSON, valid UTF-8, no line breaks (they would split the
// line) and no leading or trailing whitespace (parsers drop it). Going
// through encoding/json would compact the value and change the bytes, so
// the payload is copied as is. Everything else (binary, pretty-printed
// JSON, text) is base64, which is exact for any bytes.
func encodePayload(p []byte) ([]byte, string) {
	if len(p) > 0 && utf8.Valid(p) && json.Valid(p) &&
		bytes.IndexAny(p, "\r\n") < 0 && len(bytes.TrimSpace(p)) == len(p) {
		return p, "json"
	}
	return nil, "base64"
}

// Line is the decoded form of one output line, for consumers written in Go
// (and this package's tests).
type Line struct {
	ID              string            `json:"id"`
	Seq             int64             `json:"seq"`
	Topic           string            `json:"topic"`
	Key             *string           `json:"key"`
	Headers         map[string]string `json:"headers"`
	Payload         json.RawMessage   `json:"payload"`
	PayloadEncoding string            `json:"payload_encoding"`
	CreatedAt       time.Time         `json:"created_at"`
}

// ParseLine decodes one output line and returns the payload bytes exactly
// as they were sent.
func ParseLine(b []byte) (Line, []byte, error) {
	var l Line
	if err := json.Unmarshal(b, &l); err != nil {
		return Line{}, nil, fmt.Errorf("outbox: stdout: parse line: %w", err)
	}
	switch l.PayloadEncoding {
	case "json":
		return l, []byte(l.Payload), nil
	case "base64":
		var s string
		if err := json.Unmarshal(l.Payload, &s); err != nil {
			return Line{}, nil, fmt.Errorf("outbox: stdout: parse line: base64 payload is not a string: %w", err)
		}
		p, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return Line{}, nil, fmt.Errorf("outbox: stdout: parse line: %w", err)
		}
		return l, p, nil
	default:
		return Line{}, nil, fmt.Errorf("outbox: stdout: parse line: unknown payload_encoding %q", l.PayloadEncoding)
	}
}
