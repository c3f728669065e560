package faults

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
)

func amqpURL() string {
	if u := os.Getenv("TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func rabbitmqctl(args ...string) error {
	out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl %v: %v: %s", args, err, out)
	}
	return nil
}

// TestDisruptiveAMQPOutage stops the RabbitMQ application (rabbitmqctl
// stop_app) under the relay binary for outageLength() while applications
// keep writing, then starts it again. The exchange and queue are durable
// and the sink publishes persistent messages, so what the broker confirmed
// before the stop is still there after it. It stops the broker for every
// client, so it runs only with TEST_AMQP_DISRUPTIVE=1.
func TestDisruptiveAMQPOutage(t *testing.T) {
	if os.Getenv("TEST_AMQP_DISRUPTIVE") != "1" {
		t.Skip("stops the shared RabbitMQ (rabbitmqctl stop_app/start_app); set TEST_AMQP_DISRUPTIVE=1 to run")
	}
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		pgtest.Unavailable(t, "rabbitmqctl not found: %v", err)
	}
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		pgtest.Unavailable(t, "RabbitMQ at %s: %v", amqpURL(), err)
	}
	name := "faults-outage-" + randHex(4)
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare(name, "direct", true, false, false, false, nil))
	_, err = ch.QueueDeclare(name, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(name, "orders", name, false, nil))
	_ = conn.Close()
	t.Cleanup(func() {
		_ = rabbitmqctl("start_app") // no-op when running
		_ = rabbitmqctl("await_startup")
		if c, err := amqp.Dial(amqpURL()); err == nil {
			if ch, err := c.Channel(); err == nil {
				_, _ = ch.QueueDelete(name, false, false, false)
				_ = ch.ExchangeDelete(name, false, false)
			}
			_ = c.Close()
		}
	})

	pool, schema := pgtest.Schema(t)
	cfg := outageConfig
	sinkURL := amqpURL() + "?" + url.Values{"exchange": {name}, "reconnect_initial": {"200ms"}, "reconnect_max": {"1s"}}.Encode()
	p := startRelay(t, pgtest.URL(), schema, "--sink", sinkURL,
		"--batch-size", fmt.Sprint(cfg.BatchSize), "--max-attempts", fmt.Sprint(cfg.MaxAttempts),
		"--retry-initial", cfg.RetryInitial.String(), "--retry-multiplier", fmt.Sprint(cfg.RetryMultiplier),
		"--retry-max", cfg.RetryMax.String(), "--retry-jitter", fmt.Sprint(cfg.RetryJitter))

	var mu sync.Mutex
	var want []string
	stop, writerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(writerDone)
		keys := keyNames("k", 30)
		for seq := 0; ; seq += 20 {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			ps, err := commitErr(pool, schema, messages("orders", keys, seq, 20, nil))
			if err != nil {
				t.Errorf("writer: %v", err)
				return
			}
			mu.Lock()
			want = append(want, ps...)
			mu.Unlock()
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-writerDone
	}()
	time.Sleep(time.Second)

	outage := outageLength()
	s := migrations.Ident(schema)
	maxAttempts, maxPending := 0, 0
	sample := func() {
		var a, n int
		if err := pool.QueryRow(context.Background(), `SELECT coalesce(max(attempts), 0), count(*) FROM `+s+`.messages`).Scan(&a, &n); err == nil {
			maxAttempts, maxPending = max(maxAttempts, a), max(maxPending, n)
		}
	}
	downAt := time.Now()
	require.NoError(t, rabbitmqctl("stop_app"))
	stopTook := time.Since(downAt)
	for time.Since(downAt) < outage {
		sample()
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, rabbitmqctl("start_app"))
	require.NoError(t, rabbitmqctl("await_startup"))
	downtime := time.Since(downAt)
	upAt := time.Now()
	time.Sleep(time.Second)
	close(stop)
	<-writerDone
	eventually(t, 60*time.Second, 50*time.Millisecond, func() (bool, string) {
		sample()
		left := count(t, pool, schema, "messages")
		return left == 0, fmt.Sprintf("%d pending", left)
	})
	recovered := time.Since(upAt)

	mu.Lock()
	written := append([]string(nil), want...)
	mu.Unlock()
	conn, err = amqp.Dial(amqpURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err = conn.Channel()
	require.NoError(t, err)
	var got []delivery
	for seen := map[string]bool{}; len(seen) < len(written); {
		d, ok, err := ch.Get(name, true)
		require.NoError(t, err)
		if !ok {
			t.Fatalf("queue empty after %d of %d messages", len(seen), len(written))
		}
		seen[string(d.Body)] = true
		got = append(got, delivery{ID: d.MessageId, Payload: string(d.Body)})
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
