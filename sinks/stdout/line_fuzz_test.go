package stdout_test

import (
	"bytes"
	"reflect"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/stdout"
)

// FuzzLineRoundTrip: for any message the relay can hand over (strings come
// from Postgres text and jsonb, so they are valid UTF-8), the sink writes
// exactly one line, and ParseLine gives back the same id, topic, key,
// headers and payload. A header value or key with a newline, U+2028 or a
// quote must not break the line.
func FuzzLineRoundTrip(f *testing.F) {
	f.Add("orders", "k1", "type", "OrderPlaced", []byte(`{"a":1}`))
	f.Add("t\u2028", "", "x-note", "line1\r\nline2", []byte("plain text\n"))
	f.Add("t", "\"quoted\" \\ key", "<h>", "&\u2029\x00", []byte{0xff, 0x00})
	f.Add("t", "ü-✓", "", "", []byte(""))
	f.Fuzz(func(t *testing.T, topic, key, hk, hv string, payload []byte) {
		for _, s := range []string{topic, key, hk, hv} {
			if !utf8.ValidString(s) {
				return // Postgres never hands the relay invalid UTF-8
			}
		}
		headers := map[string]string{}
		if hk != "" {
			headers[hk] = hv
		}
		m := sinks.Message{ID: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", Seq: 42, Topic: topic, Key: key,
			Payload: payload, Headers: headers, CreatedAt: time.Unix(1700000000, 123456789).UTC(), Attempt: 1}
		var buf bytes.Buffer
		s, err := stdout.New(stdout.Config{Output: &buf}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(t.Context(), []sinks.Message{m}); err != nil {
			t.Fatal(err)
		}
		out := buf.Bytes()
		if bytes.Count(out, []byte("\n")) != 1 || out[len(out)-1] != '\n' {
			t.Fatalf("not exactly one line: %q", out)
		}
		l, p, err := stdout.ParseLine(out)
		if err != nil {
			t.Fatalf("ParseLine(%q): %v", out, err)
		}
		if l.ID != m.ID || l.Seq != m.Seq || l.Topic != topic || !l.CreatedAt.Equal(m.CreatedAt) {
			t.Fatalf("line %q decodes to %+v", out, l)
		}
		switch {
		case key == "" && l.Key != nil:
			t.Fatalf("empty key written as %q", *l.Key)
		case key != "" && (l.Key == nil || *l.Key != key):
			t.Fatalf("key %q came back as %v", key, l.Key)
		}
		if !reflect.DeepEqual(headers, l.Headers) {
			t.Fatalf("headers %q came back as %q", headers, l.Headers)
		}
		if !bytes.Equal(payload, p) {
			t.Fatalf("payload %q came back as %q", payload, p)
		}
	})
}
