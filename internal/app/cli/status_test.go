package cli_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// Issue 20, bug 9: with a registered relay whose heartbeat is 'infinity'
// and lane rows deleted, status failed (cannot scan Infinity) and, before
// that, said nothing about lanes nobody works.
func TestStatusShowsLanesNobodyWorks(t *testing.T) {
	pool, schema := pgtest.Schema(t)
	t.Setenv("DATABASE_URL", pgtest.URL())
	t.Setenv("OUTBOX_SCHEMA", schema)
	ctx := context.Background()
	s := migrations.Ident(schema)
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.relays (id, hostname, pid, version, heartbeat_at, backend_pid)
		VALUES ('stuck', 'h', 1, 'v', 'infinity', 1)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DELETE FROM `+s+`.lanes WHERE lane < 6`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+s+`.messages (topic, payload, created_at) VALUES ('t', 'x', 'infinity')`)
	require.NoError(t, err)

	code, out, stderr := run(t, "status")
	require.Equal(t, 0, code, stderr)
	t.Log(out)
	require.Contains(t, out, "LANES OF ROUTE")
	require.Contains(t, out, "lanes held by no live relay: 256")
	require.Contains(t, out, `WARNING: route "": 256 lanes worked by no live relay (6 lane rows missing)`)
	code, out, stderr = run(t, "status", "--json")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `"missing": 6`)
}

// Issue 18: a key held behind a dead letter (on-dead-letter hold) shows in
// status and dlq list, with the messages waiting behind it; purging the
// dead letter says it released the key.
func TestStatusAndDLQListShowHeldKeys(t *testing.T) {
	pool, schema := pgtest.Schema(t)
	t.Setenv("DATABASE_URL", pgtest.URL())
	t.Setenv("OUTBOX_SCHEMA", schema)
	ctx := context.Background()
	s := migrations.Ident(schema)
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.messages (id, topic, key, payload, available_at, attempts, held_since, held_route) VALUES
    (3, 'orders', 'agg', '3', 'infinity', 1, now() - interval '10 minutes', 'events'),
    (4, 'orders', 'agg', '4', NULL, 0, NULL, NULL),
    (5, 'orders', 'agg', '5', NULL, 0, NULL, NULL);
INSERT INTO `+s+`.dead_letters (id, message_id, topic, key, payload, headers, created_at, attempts, reason, last_error)
SELECT id, message_id, topic, key, payload, headers, created_at, 1, 'permanent', 'HTTP 422' FROM `+s+`.messages WHERE id = 3;
INSERT INTO `+s+`.dead_letters (id, message_id, topic, key, payload, headers, created_at, attempts, reason, last_error)
VALUES (9, gen_random_uuid(), 'orders', 'other', 'x', '{}', now(), 1, 'permanent', 'HTTP 422')`)
	require.NoError(t, err)

	code, out, stderr := run(t, "status")
	require.Equal(t, 0, code, stderr)
	t.Log(out)
	require.Contains(t, out, "pending 2 (retrying 0)")
	// Held for ten minutes and the seconds the status command took to
	// start (3.6 s on a loaded machine).
	require.Regexp(t, `HELD KEY\s+ROUTE\s+DEAD LETTER\s+HELD FOR\s+BEHIND\nagg\s+"events"\s+3\s+10m\d+s\s+2\n`, out)
	code, out, stderr = run(t, "dlq", "list")
	require.Equal(t, 0, code, stderr)
	t.Log(out)
	require.Regexp(t, `(?m)^3\s.*\syes, 2 behind\s+HTTP 422$`, out)
	require.Regexp(t, `(?m)^9\s.*\s-\s+HTTP 422$`, out)
	code, out, stderr = run(t, "status", "--json")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `"held": [`)
	require.Contains(t, out, `"dead_letter_id": 3`)

	code, out, stderr = run(t, "dlq", "purge", "--all")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "purged 2 dead letters; 1 held keys released")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.messages`).Scan(&left))
	require.Equal(t, 2, left, "4 and 5 are left to deliver")
}

// Issue 34: status says why messages retry (the last error per topic and
// route, with a count, first and last seen and an example message id), in
// text and in JSON.
func TestStatusShowsWhyMessagesRetry(t *testing.T) {
	pool, schema := pgtest.Schema(t)
	t.Setenv("DATABASE_URL", pgtest.URL())
	t.Setenv("OUTBOX_SCHEMA", schema)
	ctx := context.Background()
	s := migrations.Ident(schema)
	_, err := pool.Exec(ctx, `INSERT INTO `+s+`.messages (id, message_id, topic, key, payload, available_at, attempts, last_error, first_failed_at) VALUES
    (1, '00000000-0000-4000-8000-000000000001', 'orders', 'a', 'x', now() + interval '1 minute', 3,
     'amqp: publish: Exception (404) Reason: "NOT_FOUND - no exchange ''orders'' in vhost ''/''"', now() - interval '10 minutes'),
    (2, '00000000-0000-4000-8000-000000000002', 'orders', 'b', 'x', now() + interval '1 minute', 1,
     'amqp: publish: Exception (404) Reason: "NOT_FOUND - no exchange ''orders'' in vhost ''/''"', now() - interval '2 minutes')`)
	require.NoError(t, err)

	code, out, stderr := run(t, "status")
	require.Equal(t, 0, code, stderr)
	t.Log(out)
	require.Contains(t, out, "pending 2 (retrying 2)")
	// Ten and two minutes, and the seconds the command took to start.
	require.Regexp(t, `RETRYING TOPIC\s+ROUTE\s+COUNT\s+FIRST SEEN\s+LAST SEEN\s+EXAMPLE MESSAGE ID\s+LAST ERROR\n`+
		`orders\s+""\s+2\s+10m\d+s ago\s+2m\d+s ago\s+00000000-0000-4000-8000-000000000001\s+amqp: publish: .*NOT_FOUND - no exchange 'orders'`, out)

	code, out, stderr = run(t, "status", "--json")
	require.Equal(t, 0, code, stderr)
	var st struct {
		RetryErrors []struct {
			Topic, Route, Error string
			Count               int64
			Example             string `json:"example_message_id"`
		} `json:"retry_errors"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.Len(t, st.RetryErrors, 1, out)
	e := st.RetryErrors[0]
	require.Equal(t, "orders", e.Topic)
	require.Equal(t, int64(2), e.Count)
	require.Contains(t, e.Error, "NOT_FOUND - no exchange")
	require.Equal(t, "00000000-0000-4000-8000-000000000001", e.Example)
}

// Issue 34: with no relay registered (after a clean stop), status says
// that no relay runs instead of counting 256 unworked lanes as an alarm.
func TestStatusWithNoRelay(t *testing.T) {
	_, schema := pgtest.Schema(t)
	t.Setenv("DATABASE_URL", pgtest.URL())
	t.Setenv("OUTBOX_SCHEMA", schema)
	code, out, stderr := run(t, "status")
	require.Equal(t, 0, code, stderr)
	t.Log(out)
	require.Contains(t, out, "no relay running: messages wait until one starts")
	require.NotContains(t, out, "UNWORKED")
	require.NotContains(t, out, "lanes held by no live relay")
}

// Issue 37: status shows, per relay, whether its route delivers or finds
// its destination down (what the relay's heartbeat records: since when,
// the probes, the cause), in text and JSON.
func TestStatusShowsDestinationDown(t *testing.T) {
	pool, schema := pgtest.Schema(t)
	t.Setenv("DATABASE_URL", pgtest.URL())
	t.Setenv("OUTBOX_SCHEMA", schema)
	s := migrations.Ident(schema)
	_, err := pool.Exec(context.Background(), `INSERT INTO `+s+`.relays (id, hostname, pid, version, route, backend_pid, down_since, down_cause, down_probes) VALUES
    ('r-orders', 'h', 1, 'v', 'orders', 1, NULL, NULL, 0),
    ('r-billing', 'h', 2, 'v', 'billing', 2, now() - interval '5 minutes',
     'not sent: Post "https://billing.example/hook": dial tcp 10.0.0.7:443: connect: connection refused', 42)`)
	require.NoError(t, err)

	code, out, stderr := run(t, "status")
	require.Equal(t, 0, code, stderr)
	t.Log(out)
	require.Regexp(t, `(?m)^r-orders\s+orders\s.*\sdelivering$`, out)
	require.Regexp(t, `(?m)^r-billing\s+billing\s.*\sdown for 5m\d+s$`, out)
	require.Regexp(t, `WARNING: route "billing", relay r-billing: destination down since \S+ \(5m\d+s ago, 42 probes\): `+
		`not sent: Post "https://billing.example/hook": dial tcp 10.0.0.7:443: connect: connection refused\n`, out)
	require.NotContains(t, out, `route "orders", relay`)

	code, out, stderr = run(t, "status", "--json")
	require.Equal(t, 0, code, stderr)
	var st struct {
		Relays []struct {
			ID, State, DownCause string
			DownSince            *string `json:"down_since"`
			DownProbes           int     `json:"down_probes"`
		} `json:"relays"`
		Routes []struct {
			Route, State string
			RelaysDown   int `json:"relays_down"`
		} `json:"route_health"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Len(t, st.Relays, 2)
	require.Equal(t, "r-billing", st.Relays[0].ID)
	require.Equal(t, "destination_down", st.Relays[0].State)
	require.NotNil(t, st.Relays[0].DownSince)
	require.Equal(t, 42, st.Relays[0].DownProbes)
	require.Equal(t, "delivering", st.Relays[1].State)
	require.Nil(t, st.Relays[1].DownSince)
	require.Len(t, st.Routes, 2)
	require.Equal(t, "billing", st.Routes[0].Route)
	require.Equal(t, "destination_down", st.Routes[0].State)
	require.Equal(t, 1, st.Routes[0].RelaysDown)
	require.Equal(t, "delivering", st.Routes[1].State)
}

// Issue 37: status shows a relay whose route waits for its rate limit,
// and one whose messages fail, with since when and why (what their
// heartbeats record), in text and JSON; a route in both is rate limited.
func TestStatusShowsRateLimitedAndDegraded(t *testing.T) {
	pool, schema := pgtest.Schema(t)
	t.Setenv("DATABASE_URL", pgtest.URL())
	t.Setenv("OUTBOX_SCHEMA", schema)
	s := migrations.Ident(schema)
	_, err := pool.Exec(context.Background(), `INSERT INTO `+s+`.relays (id, hostname, pid, version, route, backend_pid,
    limited_since, limited_cause, failing_since, last_error) VALUES
    ('r-mail', 'h', 1, 'v', 'mail', 1, now() - interval '2 minutes', 'rate limit 50/s (burst 50)', NULL, NULL),
    ('r-orders', 'h', 2, 'v', 'orders', 2, NULL, NULL, now() - interval '3 minutes', 'http: 500 Internal Server Error: key k7'),
    ('r-orders-2', 'h', 3, 'v', 'orders', 3, now() - interval '1 minute', 'http: 429 (retry after 1s)', now() - interval '1 minute', 'http: 429 (retry after 1s)')`)
	require.NoError(t, err)

	code, out, stderr := run(t, "status")
	require.Equal(t, 0, code, stderr)
	t.Log(out)
	require.Regexp(t, `(?m)^r-mail\s+mail\s.*\srate limited for 2m\d+s$`, out)
	require.Regexp(t, `(?m)^r-orders\s+orders\s.*\sdegraded for 3m\d+s$`, out)
	require.Regexp(t, `(?m)^r-orders-2\s+orders\s.*\srate limited for 1m\d+s$`, out)
	require.Regexp(t, `NOTE: route "mail", relay r-mail: rate limited since \S+ \(2m\d+s ago\): rate limit 50/s \(burst 50\)\n`, out)
	require.Regexp(t, `NOTE: route "orders", relay r-orders: degraded \(messages fail and count attempts\) since \S+ \(3m\d+s ago\): `+
		`http: 500 Internal Server Error: key k7\n`, out)
	require.NotContains(t, out, "destination down")

	code, out, stderr = run(t, "status", "--json")
	require.Equal(t, 0, code, stderr)
	var st struct {
		Relays []struct {
			ID, State    string
			LimitedSince *string `json:"limited_since"`
			FailingSince *string `json:"failing_since"`
			LimitCause   string  `json:"limit_cause"`
			LastError    string  `json:"last_error"`
		} `json:"relays"`
		Routes []struct {
			Route, State  string
			FailingSince  *string `json:"failing_since"`
			LastError     string  `json:"last_error"`
			RelaysLimited int     `json:"relays_rate_limited"`
			RelaysFailing int     `json:"relays_degraded"`
		} `json:"route_health"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Len(t, st.Relays, 3)
	require.Equal(t, "rate_limited", st.Relays[0].State)
	require.Equal(t, "rate limit 50/s (burst 50)", st.Relays[0].LimitCause)
	require.NotNil(t, st.Relays[0].LimitedSince)
	require.Nil(t, st.Relays[0].FailingSince)
	require.Equal(t, "degraded", st.Relays[1].State)
	require.Equal(t, "http: 500 Internal Server Error: key k7", st.Relays[1].LastError)
	require.NotNil(t, st.Relays[1].FailingSince)
	require.Len(t, st.Routes, 2)
	require.Equal(t, "mail", st.Routes[0].Route)
	require.Equal(t, "rate_limited", st.Routes[0].State)
	orders := st.Routes[1]
	require.Equal(t, "rate_limited", orders.State, "the worst of its relays")
	require.Equal(t, 1, orders.RelaysLimited)
	require.Equal(t, 2, orders.RelaysFailing)
	require.Equal(t, "http: 500 Internal Server Error: key k7", orders.LastError, "the earliest failing relay's")
}
