package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// poison is one message that must be dead-lettered (or, when reason is
// empty, delivered), followed on its key by a good message that must be
// delivered: the key moves on.
type poison struct {
	key     string
	payload []byte
	headers map[string]string
	sqlOnly bool   // written through enqueue() by a plain-SQL writer
	reason  string // substring the dead letter's last_error must contain
}

// enqueue writes one message the way a plain-SQL writer would.
func enqueue(ctx context.Context, pool *pgxpool.Pool, schema, topic, key string, payload []byte, headers string) error {
	_, err := pool.Exec(ctx, `SELECT `+migrations.Ident(schema)+`.enqueue($1, $2, $3::bytea, $4::jsonb)`, topic, key, payload, headers)
	return err
}

// writePoisons commits, in one interleaved stream: 400 normal messages over
// 20 keys, and for every poison the poison then a good message of its key.
// It returns the payloads that must arrive.
func writePoisons(t *testing.T, pool *pgxpool.Pool, schema string, ps []poison) []string {
	t.Helper()
	ctx := context.Background()
	keys := keyNames("k", 20)
	var want []string
	for i, p := range ps {
		want = append(want, commit(t, pool, schema, messages("orders", keys, i*40, 40, nil))...)
		if p.sqlOnly {
			h, err := json.Marshal(p.headers)
			require.NoError(t, err)
			require.NoError(t, enqueue(ctx, pool, schema, "orders", p.key, p.payload, string(h)))
		} else {
			commit(t, pool, schema, []outbox.Message{{Topic: "orders", Key: p.key, Payload: p.payload, Headers: p.headers}})
		}
		if p.reason == "" {
			want = append(want, string(p.payload))
		}
		want = append(want, commit(t, pool, schema, []outbox.Message{{Topic: "orders", Key: p.key, Payload: []byte(payloadOf("orders", p.key, 1))}})...)
	}
	want = append(want, commit(t, pool, schema, messages("orders", keys, len(ps)*40, 400-len(ps)*40, nil))...)
	return want
}

// checkPoisons asserts that exactly the poisons with a reason are dead
// letters, permanent, with that reason, and logs what an operator reads.
func checkPoisons(t *testing.T, pool *pgxpool.Pool, schema string, ps []poison) {
	t.Helper()
	dls := deadLetters(t, pool, schema)
	byKey := map[string]operator.DeadLetter{}
	for _, d := range dls {
		require.NotNil(t, d.Key)
		byKey[*d.Key] = d
	}
	n := 0
	for _, p := range ps {
		d, ok := byKey[p.key]
		if p.reason == "" {
			require.False(t, ok, "%s was dead-lettered: %v", p.key, d.LastError)
			continue
		}
		n++
		require.True(t, ok, "poison %s was not dead-lettered", p.key)
		require.Equal(t, relay.ReasonPermanent, d.Reason, p.key)
		require.Equal(t, 1, d.Attempts, "%s: a permanent error skips the retries", p.key)
		require.Contains(t, *d.LastError, p.reason, p.key)
		require.True(t, bytes.Equal(p.payload, d.Payload), "%s: the dead letter keeps the payload", p.key)
		t.Logf("dead letter %-10s reason=%s attempts=%d last_error=%q", p.key, d.Reason, d.Attempts, *d.LastError)
	}
	require.Len(t, dls, n, "only the poisons are dead letters")
}

// TestPlainSQLHeadersCannotBeInvalidUTF8: headers are jsonb, so a plain-SQL
// writer cannot store invalid UTF-8 or NUL in them: the database refuses
// the insert, in the writer's transaction.
func TestPlainSQLHeadersCannotBeInvalidUTF8(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	for name, tc := range map[string]struct {
		headers string
		code    string
	}{
		"invalid UTF-8": {string([]byte{'{', '"', 'a', '"', ':', '"', 0xff, 0xfe, '"', '}'}), "22021"}, // character_not_in_repertoire
		"NUL escape":    {`{"a":"x\u0000y"}`, "22P05"},                                                 // untranslatable_character
		"number value":  {`{"a":1}`, "23514"},                                                          // check_violation
		"nested object": {`{"a":{"b":"c"}}`, "23514"},
	} {
		err := enqueue(ctx, pool, schema, "orders", "k", []byte("x"), tc.headers)
		var pe *pgconn.PgError
		require.True(t, errors.As(err, &pe), "%s: insert must fail, got %v", name, err)
		require.Equal(t, tc.code, pe.Code, "%s: %s", name, pe.Message)
		t.Logf("%s: %s (SQLSTATE %s)", name, pe.Message, pe.Code)
	}
	require.Zero(t, count(t, pool, schema, "messages"))
}

// TestPoisonHTTP: messages the webhook sink can never deliver are
// dead-lettered at once with a reason a person understands, while every
// other key, and the poisoned keys' later messages, flow. A header value
// with CR/LF must never become an extra HTTP header.
func TestPoisonHTTP(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 10<<20/16) // 10 MiB
	ps := []poison{
		{key: "p400", payload: []byte("poison-400"), reason: "400 Bad Request: invalid order: field total is required"},
		{key: "pcrlf", payload: []byte("poison-crlf"), sqlOnly: true, headers: map[string]string{"x-note": "line1\r\nInjected: yes"},
			reason: `header "x-note" has a value with control characters`},
		{key: "plf", payload: []byte("poison-lf"), headers: map[string]string{"x-note": "a\nInjected: yes"},
			reason: `header "x-note" has a value with control characters`},
		{key: "pname", payload: []byte("poison-name"), sqlOnly: true, headers: map[string]string{"bad name": "v"},
			reason: `header name "bad name" is not a valid HTTP token`},
		{key: "preserved", payload: []byte("poison-reserved"), headers: map[string]string{"Content-Length": "1"},
			reason: `header "Content-Length" is set by the sink or by HTTP itself`},
		{key: "ptab", payload: []byte("tab-is-fine"), headers: map[string]string{"x-note": "a\tb"}}, // delivered
		{key: "pbig", payload: big}, // 10 MiB: delivered
	}
	rc := newReceiver(t, func(r *http.Request, body []byte) (int, string) {
		if string(body) == "poison-400" {
			return http.StatusBadRequest, "invalid order: field total is required"
		}
		return http.StatusNoContent, ""
	})
	want := writePoisons(t, pool, schema, ps)
	start := time.Now()
	p := startRelay(t, pgtest.URL(), schema, "--sink", rc.url(), "--exit-when-empty")
	require.Equal(t, 0, p.wait(60*time.Second), p.logs.tail(20))
	took := time.Since(start)

	got := rc.deliveries()
	checkAllDelivered(t, want, got)
	checkKeyOrder(t, got)
	checkPoisons(t, pool, schema, ps)
	for _, d := range got {
		require.Empty(t, d.Header.Get("Injected"), "a header value injected a header")
		if d.Key == "ptab" && d.Payload == "tab-is-fine" {
			require.Equal(t, "a\tb", d.Header.Get("X-Note"))
		}
	}
	require.Equal(t, 0, strings.Count(p.logs.String(), `"level":"ERROR"`), "no ERROR logs for poison messages")
	t.Logf("HTTP: %d messages delivered (10 MiB payload included) and %d poisons dead-lettered in %s",
		len(want), len(deadLetters(t, pool, schema)), took.Round(time.Millisecond))
}

// TestPoisonKafka: a 10 MiB payload is refused by the sink before any round
// trip (above max_message_bytes, default 1 MiB); a 600 KB one passes that
// check but the broker's message.max.bytes (300 kB here) refuses it with
// MESSAGE_TOO_LARGE. Both are dead-lettered at once, the rest flows, and
// a header value with CR/LF is delivered as is (Kafka headers are bytes).
func TestPoisonKafka(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	k := newKafkaRig(t, []string{"orders"}, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "300000"}))
	ps := []poison{
		{key: "pbig", payload: bytes.Repeat([]byte("x"), 10<<20), reason: "max_message_bytes"},
		{key: "pbroker", payload: bytes.Repeat([]byte("y"), 600_000), reason: "Message Size Too Large"},
		{key: "pcrlf", payload: []byte("crlf-is-fine"), sqlOnly: true, headers: map[string]string{"x-note": "line1\r\nInjected: yes"}},
	}
	want := writePoisons(t, pool, schema, ps)
	start := time.Now()
	p := startRelay(t, pgtest.URL(), schema, "--sink", "kafka://"+k.broker(), "--exit-when-empty")
	require.Equal(t, 0, p.wait(60*time.Second), p.logs.tail(20))
	took := time.Since(start)

	eventually(t, 20*time.Second, 20*time.Millisecond, func() (bool, string) {
		return distinct(k.deliveries()) >= len(want), "consumer still reading"
	})
	got := k.deliveries()
	checkAllDelivered(t, want, got)
	checkKeyOrder(t, got)
	checkPoisons(t, pool, schema, ps)
	for _, d := range got {
		if d.Key == "pcrlf" && d.Payload == "crlf-is-fine" {
			require.Equal(t, []string{"line1\r\nInjected: yes"}, d.Header["x-note"])
		}
	}
	t.Logf("Kafka: %d messages delivered and %d poisons dead-lettered in %s", len(want), len(deadLetters(t, pool, schema)), took.Round(time.Millisecond))
}
