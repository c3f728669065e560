package faults

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/amqptest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

// TestAMQPOutage stops the application of a throwaway RabbitMQ node (its
// stop_app) under the relay binary for outageLength() while applications keep
// writing, then starts it again. The exchange and queue are durable and
// the sink publishes persistent messages, so what the broker confirmed
// before the stop is still there after it. The broker is a throwaway node
// of the test's own (amqptest.Server): the shared one is never stopped.
func TestAMQPOutage(t *testing.T) {
	t.Parallel()
	broker := amqptest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), runBound())
	defer cancel()
	conn, err := amqp.Dial(broker.URL())
	require.NoError(t, err)
	name := testkit.RandName("faults-outage-")
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(name, "direct", true, false, false, false, nil))
	_, err = ch.QueueDeclare(name, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(name, "orders", name, false, nil))
	_ = conn.Close()

	pool, schema := pgtest.Schema(t)
	cfg := outageConfig
	// The sink's own reconnect backoff (500ms doubling to 10s): the time
	// to recover after a long outage is what a user gets.
	sinkURL := broker.URL() + "?" + url.Values{"exchange": {name}}.Encode()
	p := startRelay(t, pgtest.URL(), schema, "--sink", sinkURL,
		"--batch-size", fmt.Sprint(cfg.BatchSize), "--max-attempts", fmt.Sprint(cfg.MaxAttempts),
		"--retry-initial", cfg.RetryInitial.String(), "--retry-multiplier", fmt.Sprint(cfg.RetryMultiplier),
		"--retry-max", cfg.RetryMax.String(), "--retry-jitter", fmt.Sprint(cfg.RetryJitter))

	w := startSteadyWriter(t, pool, schema, nil)
	p.publishedMore(100) // steady state first

	s := migrations.Ident(schema)
	maxAttempts, maxPending := 0, 0
	sample := func() {
		var a, n int
		if err := pool.QueryRow(context.Background(), `SELECT coalesce(max(attempts), 0), count(*) FROM `+s+`.messages`).Scan(&a, &n); err == nil {
			maxAttempts, maxPending = max(maxAttempts, a), max(maxPending, n)
		}
	}
	downAt := time.Now()
	require.NoError(t, broker.StopApp(ctx))
	stopTook := time.Since(downAt)
	w.writeMore(t, outageWrites(), sample)
	require.NoError(t, broker.StartApp(ctx)) // returns once it has booted
	downtime := time.Since(downAt)
	upAt := time.Now()
	p.publishedMore(100) // the writer goes on until the relay delivers again
	written := w.stop()
	eventually(t, drainBound(), 50*time.Millisecond, func() (bool, string) {
		sample()
		left := count(t, pool, schema, "messages")
		return left == 0, fmt.Sprintf("%d pending", left)
	})
	recovered := time.Since(upAt)

	conn, err = amqp.Dial(broker.URL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err = conn.Channel()
	require.NoError(t, err)
	// One consumer reads the queue in its order (a basic.get a message
	// took most of an hour for a 10-minute outage's backlog).
	require.NoError(t, ch.Qos(1000, 0, false))
	ds, err := ch.Consume(name, "", true, true, false, false, nil)
	require.NoError(t, err)
	var got []delivery
	for seen := map[string]bool{}; len(seen) < len(written); {
		select {
		case d, ok := <-ds:
			require.True(t, ok, "consumer closed after %d of %d messages", len(seen), len(written))
			seen[string(d.Body)] = true
			got = append(got, delivery{ID: d.MessageId, Payload: string(d.Body)})
		case <-time.After(30 * time.Second): // a bound, not a measure: nothing more is coming
			t.Fatalf("queue empty after %d of %d messages", len(seen), len(written))
		}
	}
	dups := checkAllDelivered(t, written, got)
	checkKeyOrder(t, got)
	require.Empty(t, deadLetters(t, pool, schema), "an outage must not dead-letter anything")
	bound := maxFailures(cfg, downtime+2*time.Second, 30*time.Millisecond)
	require.LessOrEqual(t, maxAttempts, bound, "failed attempts per message are bounded by the backoff")
	t.Logf("broker down %s (stop_app took %s): backlog up to %d, at most %d failed attempts per message (bound %d); "+
		"%d written, all delivered %s after start_app (%d duplicates); relay log lines at WARN: %d",
		downtime.Round(time.Millisecond), stopTook.Round(time.Millisecond), maxPending, maxAttempts, bound,
		len(written), recovered.Round(time.Millisecond), dups, p.logs.Count(`"level":"WARN"`))
}
