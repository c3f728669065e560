package httpsink_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/httpsink"
)

// FuzzHeadersNoInjection sends one message with one fuzzed application
// header to a real receiver. Either the sink refuses the message with a
// permanent error (and sends nothing), or the receiver gets exactly the
// sink's own headers plus that one header, with its value intact except
// for the leading and trailing spaces and tabs that HTTP itself strips
// (RFC 9110 §5.5). No value may add a header line or a request.
func FuzzHeadersNoInjection(f *testing.F) {
	var mu sync.Mutex
	var got []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	f.Cleanup(srv.Close)
	s, err := httpsink.New(httpsink.Config{URL: srv.URL + "/hook"}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = s.Close(context.Background()) })
	own := map[string]bool{}
	for _, h := range []string{"Content-Type", "Content-Length", "User-Agent", httpsink.HeaderWebhookID, httpsink.HeaderWebhookTimestamp,
		httpsink.HeaderIdempotencyKey, httpsink.HeaderTopic, httpsink.HeaderKey, httpsink.HeaderSeq} {
		own[http.CanonicalHeaderKey(h)] = true
	}

	for _, s := range [][2]string{
		{"type", "OrderPlaced"}, {"x-note", "line1\r\nInjected: yes"}, {"x-note", "a\nb"}, {"x-note", "a\rb"},
		{"x-note", " padded\t"}, {"x-note", "tab\tinside"}, {"x-note", "ü-✓"}, {"x-note", "\x7f"}, {"x-note", "\x00"},
		{"bad name", "v"}, {"bad:name", "v"}, {"Host", "evil.example"}, {"Content-Length", "0"}, {"transfer-encoding", "chunked"},
		{"webhook-id", "forged"}, {"content-type", "application/json"}, {"X-\xff", "v"}, {"x", "\xff\xfe"},
		{"x", "a\r\n\r\nGET / HTTP/1.1"}, {"", "empty"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, name, value string) {
		mu.Lock()
		before := len(got)
		mu.Unlock()
		m := sinks.Message{ID: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", Seq: 1, Topic: "orders", Key: "k",
			Payload: []byte("x"), Headers: map[string]string{name: value}, Attempt: 1}
		err := s.Send(context.Background(), []sinks.Message{m})
		mu.Lock()
		reqs := got[before:]
		mu.Unlock()
		if err != nil {
			if err = sinks.Outcome(err, 0, 1); !sinks.IsPermanent(err) {
				t.Fatalf("header %q=%q: a refused header must fail permanently (retrying cannot help), got %v", name, value, err)
			}
			if len(reqs) != 0 {
				t.Fatalf("header %q=%q: refused, yet %d requests reached the receiver", name, value, len(reqs))
			}
			return
		}
		if len(reqs) != 1 {
			t.Fatalf("header %q=%q: delivered with %d requests", name, value, len(reqs))
		}
		h := reqs[0]
		want := strings.Trim(value, " \t")
		if vs := h.Values(name); len(vs) != 1 || vs[0] != want {
			t.Fatalf("header %q=%q arrived as %q", name, value, vs)
		}
		for k := range h {
			if !own[k] && k != http.CanonicalHeaderKey(name) && k != "Webhook-Signature" && k != "Accept-Encoding" {
				t.Fatalf("header %q=%q: the receiver got an extra header %q=%q", name, value, k, h[k])
			}
		}
	})
}
