package faults

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/amqptest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// A destination that is reachable but can accept nothing (its exchange or
// stream missing, the credentials refused) is down, like one that refuses
// connections: its messages count no attempt and are never dead-lettered
// for it, and they go out as soon as it can accept them again.

// downWithoutAttempts waits until the relay has found the route's
// destination down and probed it a few times, longer than --max-attempts
// 3 with 1 s retries would take to dead-letter every message, and checks
// that no message counted an attempt.
func downWithoutAttempts(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	eventually(t, 60*time.Second, 50*time.Millisecond, func() (bool, string) {
		var probes int
		require.NoError(t, pool.QueryRow(context.Background(),
			"SELECT coalesce(max(down_probes), 0) FROM "+migrations.Ident(schema)+".relays").Scan(&probes))
		return probes >= 3, fmt.Sprintf("%d probes found the destination down", probes)
	})
	var attempts, pending int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT coalesce(max(attempts), 0), count(*) FROM "+migrations.Ident(schema)+".messages").Scan(&attempts, &pending))
	require.Zero(t, attempts, "a destination that can accept nothing cost attempts")
	require.Equal(t, 10, pending)
	require.Empty(t, deadLetters(t, pool, schema))
}

// downFlags: few attempts, quick retries, and a heartbeat a second, which
// records the route's probes in the relays table.
var downFlags = append([]string{"--lease-ttl", "3s", "--heartbeat", "1s"}, stallFlags...)

// deliveredAfter waits, up to bound, until the outbox is empty once the
// destination can accept the messages again (what names that moment),
// logs how long it took, and checks that nothing was dead-lettered.
func deliveredAfter(t *testing.T, pool *pgxpool.Pool, schema string, bound time.Duration, what string) {
	t.Helper()
	since := time.Now()
	eventually(t, bound, 20*time.Millisecond, func() (bool, string) {
		left := count(t, pool, schema, "messages")
		return left == 0, fmt.Sprintf("%d pending", left)
	})
	t.Logf("all delivered %s after %s", time.Since(since).Round(time.Millisecond), what)
	require.Empty(t, deadLetters(t, pool, schema))
}

// TestMissingExchangeIsDown: the AMQP sink's exchange does not exist.
func TestMissingExchangeIsDown(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	name := testkit.RandName("faults-noexchange-")
	commit(t, pool, schema, messages("orders", keyNames("k", 5), 0, 10, nil))
	startRelay(t, pgtest.URL(), schema, append(downFlags,
		"--sink", testkit.AMQPURL()+"?"+url.Values{"exchange": {name}}.Encode())...)
	downWithoutAttempts(t, pool, schema)

	conn, err := amqp.Dial(testkit.AMQPURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(name, "topic", false, true, false, false, nil))
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "#", name, false, nil))
	deliveredAfter(t, pool, schema, 30*time.Second, "the exchange was created")
}

// TestMissingStreamIsDown: no JetStream stream covers the NATS sink's
// subject (the stream not created yet).
func TestMissingStreamIsDown(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	subject := testkit.RandName("faults.nostream.")
	commit(t, pool, schema, messages("orders", keyNames("k", 5), 0, 10, nil))
	startRelay(t, pgtest.URL(), schema, append(downFlags,
		"--sink", testkit.NATSURL()+"?"+url.Values{"subject": {subject}}.Encode())...)
	downWithoutAttempts(t, pool, schema)

	nc, err := nats.Connect(testkit.NATSURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	name := strings.NewReplacer(".", "_", "-", "_").Replace(subject)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	deliveredAfter(t, pool, schema, 30*time.Second, "the stream was created")
}

// TestRefusedCredentialsAreDown: the broker starts refusing the AMQP
// sink's user while the relay runs (its password rotated, the sink's
// connection closed), on a throwaway RabbitMQ node.
func TestRefusedCredentialsAreDown(t *testing.T) {
	t.Parallel()
	broker := amqptest.Server(t)
	ctx := context.Background()
	for _, args := range [][]string{
		{"add_user", "relay", "first"},
		{"set_permissions", "-p", "/", "relay", ".*", ".*", ".*"},
	} {
		_, err := broker.Ctl(ctx, args...)
		require.NoError(t, err)
	}
	conn, err := amqp.Dial(broker.URL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	// Durable, not exclusive: close_all_connections below closes this
	// connection too.
	require.NoError(t, ch.ExchangeDeclare("orders", "topic", true, false, false, false, nil))
	_, err = ch.QueueDeclare("orders", true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind("orders", "#", "orders", false, nil))

	pool, schema := pgtest.Schema(t)
	u, err := url.Parse(broker.URL())
	require.NoError(t, err)
	u.User = url.UserPassword("relay", "first")
	u.RawQuery = url.Values{"exchange": {"orders"}, "publish_timeout": {"5s"}}.Encode()
	p := startRelay(t, pgtest.URL(), schema, append(downFlags, "--sink", u.String())...)
	commit(t, pool, schema, messages("orders", keyNames("k", 5), 0, 5, nil))
	eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		left := count(t, pool, schema, "messages")
		return left == 0, fmt.Sprintf("%d of the first 5 pending", left)
	})

	_, err = broker.Ctl(ctx, "change_password", "relay", "second")
	require.NoError(t, err)
	_, err = broker.Ctl(ctx, "close_all_connections", "password rotated")
	require.NoError(t, err)
	commit(t, pool, schema, messages("orders", keyNames("k", 5), 5, 10, nil))
	downWithoutAttempts(t, pool, schema)
	eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		code, body, _ := p.get("/readyz")
		return code == 503 && strings.Contains(body, "refuses the credentials"), fmt.Sprintf("/readyz %d %s", code, body)
	})

	_, err = broker.Ctl(ctx, "change_password", "relay", "first")
	require.NoError(t, err)
	deliveredAfter(t, pool, schema, 60*time.Second, "the password was restored")
}
