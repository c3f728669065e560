package stdout_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
	"github.com/outbox-relay/outbox-relay/sinks/stdout"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The stdout sink's backend is the writer itself: the harness gives each
// Env an io.Pipe, reads the other end line by line the way a consumer
// piping the relay's output would, and parses every line.
func TestConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{
			Transient: true,
			Why: map[string]string{
				"Partitions": "a byte stream has no partitions",
				"Poison":     "every message can be written as a JSON line (any payload bytes fit in base64), so there is nothing the writer can refuse",
				"Restart":    "the sink holds no connection: each Send writes to the same io.Writer, so there is nothing to drop or reconnect",
				"Outage":     "the destination is a local io.Writer: there is no remote destination that can be down as a whole",
			},
		},
		Setup: setup,
	})
}

// breakable is an io.Writer that fails every write while broken, like a
// consumer that went away (EPIPE) and came back.
type breakable struct {
	w      io.Writer
	broken atomic.Bool
}

func (b *breakable) Write(p []byte) (int, error) {
	if b.broken.Load() {
		return 0, errors.New("broken pipe (sinktest BreakTransient)")
	}
	return b.w.Write(p)
}

func setup(t *testing.T) *sinktest.Env {
	pr, pw := io.Pipe()
	out := &breakable{w: pw}
	s, err := stdout.New(stdout.Config{Output: out}, nil)
	require.NoError(t, err)

	lines := make(chan sinktest.Delivered, 4096)
	readErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(lines)
		r := bufio.NewReader(pr)
		for {
			b, err := r.ReadBytes('\n')
			if err != nil {
				if !errors.Is(err, io.EOF) || len(b) > 0 {
					readErr <- err
				}
				return
			}
			l, payload, err := stdout.ParseLine(b)
			if err != nil {
				readErr <- err
				_, _ = io.Copy(io.Discard, pr) // keep the writer unblocked
				return
			}
			d := sinktest.Delivered{ID: l.ID, Seq: l.Seq, Topic: l.Topic, Payload: payload, Headers: l.Headers, Partition: -1}
			if l.Key != nil {
				d.Key = *l.Key
			}
			lines <- d
		}
	})
	t.Cleanup(func() {
		require.NoError(t, s.Close(context.Background()))
		require.NoError(t, pw.Close())
		wg.Wait()
	})
	return &sinktest.Env{
		Sink:  s,
		Topic: func(suffix string) string { return "sinktest." + suffix },
		Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
			var out []sinktest.Delivered
			for len(out) < n {
				select {
				case d, ok := <-lines:
					if !ok {
						select {
						case err := <-readErr:
							return out, err
						default:
							return out, io.ErrUnexpectedEOF
						}
					}
					out = append(out, d)
				case <-ctx.Done():
					return out, ctx.Err()
				}
			}
			return out, nil
		},
		BreakTransient: func() func() {
			out.broken.Store(true)
			return func() { out.broken.Store(false) }
		},
	}
}

func fixed(id string, seq int64, key string, payload []byte) sinks.Message {
	return sinks.Message{
		ID: id, Seq: seq, Topic: "orders", Key: key, Payload: payload,
		CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 123456000, time.FixedZone("X", 3600)),
		Attempt:   1,
	}
}

// TestLineFormat pins the output format, which people pipe into jq.
func TestLineFormat(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	s, err := stdout.New(stdout.Config{Output: &buf}, nil)
	require.NoError(t, err)

	m1 := fixed("id-1", 7, "order-7", []byte(`{"total": 10, "note": "<&>"}`))
	m1.Headers = map[string]string{"z": "1", "content-type": "application/json", "x-u": "Grüße <&>"}
	m2 := fixed("id-2", 8, "", []byte{0, 0xff, 'a'})
	m3 := fixed("id-3", 9, "k", []byte("{\n}"))
	require.NoError(t, s.Send(t.Context(), []sinks.Message{m1, m2, m3}))

	want := `{"id":"id-1","seq":7,"topic":"orders","key":"order-7","headers":{"content-type":"application/json","x-u":"Grüße <&>","z":"1"},"payload":{"total": 10, "note": "<&>"},"payload_encoding":"json","created_at":"2025-01-02T02:04:05.123456Z"}
{"id":"id-2","seq":8,"topic":"orders","key":null,"headers":{},"payload":"AP9h","payload_encoding":"base64","created_at":"2025-01-02T02:04:05.123456Z"}
{"id":"id-3","seq":9,"topic":"orders","key":"k","headers":{},"payload":"ewp9","payload_encoding":"base64","created_at":"2025-01-02T02:04:05.123456Z"}
`
	require.Equal(t, want, buf.String())
}

// limited accepts limit bytes in total and then fails, like a disk filling
// up in the middle of a write.
type limited struct {
	buf   bytes.Buffer
	limit int
}

func (l *limited) Write(p []byte) (int, error) {
	room := l.limit - l.buf.Len()
	if room >= len(p) {
		return l.buf.Write(p)
	}
	n, _ := l.buf.Write(p[:max(room, 0)])
	return n, errors.New("no space left on device")
}

// TestPartialWrite checks that only fully written lines count as delivered,
// that the rest of the batch fails retriably, and that the retry starts on
// a fresh line.
func TestPartialWrite(t *testing.T) {
	t.Parallel()
	var probe bytes.Buffer
	p, err := stdout.New(stdout.Config{Output: &probe}, nil)
	require.NoError(t, err)
	msgs := []sinks.Message{
		fixed("a", 1, "k1", []byte(`1`)),
		fixed("b", 2, "k1", []byte(`2`)),
		fixed("c", 3, "k2", []byte(`3`)),
	}
	require.NoError(t, p.Send(t.Context(), msgs[:1]))
	firstLine := probe.Len()

	w := &limited{limit: firstLine + 10}
	s, err := stdout.New(stdout.Config{Output: w}, nil)
	require.NoError(t, err)
	err = s.Send(t.Context(), msgs)
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.Len(t, be.Errs, 3)
	require.NoError(t, be.Errs[0], "the first line was written completely")
	for _, e := range be.Errs[1:] {
		require.ErrorContains(t, e, "no space left on device")
		require.False(t, sinks.IsPermanent(e), "a write error must be retriable")
	}

	w.limit = 1 << 20
	require.NoError(t, s.Send(t.Context(), msgs[1:]))
	lines := strings.Split(strings.TrimSuffix(w.buf.String(), "\n"), "\n")
	require.Len(t, lines, 4, "line a, the partial line, then b and c")
	var got []string
	for i, l := range lines {
		parsed, _, err := stdout.ParseLine([]byte(l))
		if i == 1 {
			require.Error(t, err, "the partial line")
			continue
		}
		require.NoError(t, err, "line %d", i)
		got = append(got, parsed.ID)
	}
	require.Equal(t, []string{"a", "b", "c"}, got)
}

// TestCloseLeavesWriterOpen: os.Stdout belongs to the process.
func TestCloseLeavesWriterOpen(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	s, err := stdout.New(stdout.Config{Output: pw}, nil)
	require.NoError(t, err)
	require.NoError(t, s.Close(t.Context()))
	done := make(chan error, 1)
	go func() { _, err := pw.Write([]byte("x")); done <- err }()
	buf := make([]byte, 1)
	_, err = pr.Read(buf)
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.NoError(t, pw.Close())
}

// TestSendWaitsForSlowWriterOrContext: a Send queued behind another that is
// stuck in a blocked writer gives up when its context ends.
func TestSendQueuedBehindBlockedWriterHonoursContext(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe() // nobody reads yet: the first Send blocks in Write
	s, err := stdout.New(stdout.Config{Output: pw}, nil)
	require.NoError(t, err)
	first := make(chan error, 1)
	go func() { first <- s.Send(context.Background(), []sinks.Message{fixed("a", 1, "k", []byte("1"))}) }()

	// Wait until the first Send is inside Write: the pipe has a reader
	// waiting only once we read, so read one byte to see it arrive.
	one := make([]byte, 1)
	_, err = pr.Read(one)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err = s.Send(ctx, []sinks.Message{fixed("b", 2, "k2", []byte("2"))})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, sinks.IsPermanent(err))

	go func() { _, _ = io.Copy(io.Discard, pr) }()
	require.NoError(t, <-first)
	require.NoError(t, s.Close(t.Context()))
	require.NoError(t, pw.Close())
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"stdout", "stdout:", "stdout://", "STDOUT://"} {
		_, err := stdout.ParseURL(ok)
		require.NoError(t, err, ok)
	}
	for raw, want := range map[string]string{
		"":                    `scheme is ""`,
		"kafka://localhost":   `scheme is "kafka"`,
		"stdout://host":       "must not have a host",
		"stdout:///x":         "must not have a path",
		"stdout:x":            "must not have a path",
		"stdout://?pretty=1":  `unknown URL parameter "pretty"`,
		"stdout://?":          "must not have a query",
		"stdout://#frag":      "fragment",
		"stdout://u:secret@":  "user or password",
		"stdout://%zz":        "invalid sink URL",
		"stdout://a b":        "invalid sink URL",
		"stdout://user:pw@h/": "user or password",
	} {
		_, err := stdout.ParseURL(raw)
		require.ErrorContains(t, err, want, raw)
		require.True(t, strings.HasPrefix(err.Error(), "outbox: stdout:"), err.Error())
		require.NotContains(t, err.Error(), "secret", "errors must not echo credentials")
	}
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"stdout", "stdout://", "stdout://x?y=z#w", "stdout://u:p@h", "%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		cfg, err := stdout.ParseURL(raw)
		if err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "outbox: stdout:"), err.Error())
			return
		}
		require.NoError(t, cfg.Validate())
	})
}

// FuzzPayloadRoundTrip: whatever the payload, the line parses back to the
// same bytes, and the line is a single line.
func FuzzPayloadRoundTrip(f *testing.F) {
	for _, s := range []string{"", "{}", " {}", "{\n}", "\"x\"", "\xff", "null", "1e400", "{\"a\":\"\u2028\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		var buf bytes.Buffer
		s, err := stdout.New(stdout.Config{Output: &buf}, nil)
		require.NoError(t, err)
		require.NoError(t, s.Send(t.Context(), []sinks.Message{fixed("id", 1, "k", payload)}))
		require.Equal(t, 1, bytes.Count(buf.Bytes(), []byte("\n")))
		_, got, err := stdout.ParseLine(buf.Bytes())
		require.NoError(t, err)
		require.True(t, bytes.Equal(payload, got), "payload %q came back as %q", payload, got)
	})
}
