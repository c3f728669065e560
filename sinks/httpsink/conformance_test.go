package httpsink

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinkconf"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// poisonHeader marks a message the conformance receiver rejects with 400,
// which the sink must report as permanent.
const poisonHeader = "x-conformance-poison"

// TestConformance runs the shared sink suite against a real net/http
// server on loopback. Each Env gets its own server, so Envs are isolated
// and Restart can close the server (dropping every connection) and start
// a new one on the same address.
func TestConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{
			Poison:    true,
			Transient: true,
			Restart:   true,
			Outage:    true,
			Why:       map[string]string{"Partitions": "HTTP webhooks have no partitions; order per key comes from sequential requests"},
		},
		Setup: func(t *testing.T) *sinktest.Env {
			rc := newReceiver(t)
			rc.setRespond(func(w http.ResponseWriter, r *http.Request, _ []byte) int {
				if r.Header.Get(poisonHeader) != "" {
					http.Error(w, "rejected: malformed event", http.StatusBadRequest)
					return http.StatusBadRequest
				}
				w.WriteHeader(http.StatusNoContent)
				return http.StatusNoContent
			})
			s := newSink(t, Config{URL: rc.URL("/hook"), Secrets: []sinkconf.Secret{secretA}})
			return &sinktest.Env{
				Sink:  s,
				Topic: func(suffix string) string { return "conformance." + suffix },
				Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
					reqs, err := rc.read(ctx, n)
					if err != nil {
						return nil, err
					}
					out := make([]sinktest.Delivered, len(reqs))
					for i, r := range reqs {
						if err := verifySignature(secretA, r.Header, r.Body, timeNow(), signatureTolerance); err != nil {
							t.Errorf("request %d: signature does not verify: %v", i, err)
						}
						topic, _ := url.PathUnescape(r.Header.Get(HeaderTopic))
						key, _ := url.PathUnescape(r.Header.Get(HeaderKey))
						headers := make(map[string]string, len(r.Header))
						for name, vals := range r.Header {
							// HTTP header names are case-insensitive and
							// net/http canonicalizes them; applications
							// (and the suite) write them in lower case.
							headers[strings.ToLower(name)] = vals[0]
						}
						seq, _ := strconv.ParseInt(r.Header.Get(HeaderSeq), 10, 64)
						out[i] = sinktest.Delivered{
							ID:        r.Header.Get(HeaderWebhookID),
							Seq:       seq,
							Topic:     topic,
							Key:       key,
							Payload:   r.Body,
							Headers:   headers,
							Partition: -1,
						}
					}
					return out, nil
				},
				Poison: func(topic string) sinks.Message {
					m := sinktest.Msg(topic, "", 0, []byte("poison"))
					m.Headers = map[string]string{poisonHeader: "1"}
					return m
				},
				BreakTransient: func() func() {
					rc.setBroken(true)
					return func() { rc.setBroken(false) }
				},
				Restart: rc.restart,
				Down:    func() error { rc.stop(); return nil },
				Up:      rc.start,
			}
		},
	})
}
