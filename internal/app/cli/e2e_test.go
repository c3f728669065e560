package cli_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/operator"
)

// e2e prepares a migrated schema and the environment for in-process runs
// of the real command line.
func e2e(t *testing.T) (*pgxpool.Pool, string, *outbox.Writer) {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	t.Setenv("DATABASE_URL", pgtest.URL())
	t.Setenv("OUTBOX_SCHEMA", schema)
	t.Setenv("OUTBOX_ADMIN_ADDR", "127.0.0.1:0")
	t.Setenv("OUTBOX_POLL_INTERVAL", "20ms")
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	require.NoError(t, err)
	return pool, schema, w
}

// appOrders commits n orders over keys k0..k9 (payload = key:seq), plus a
// poison message on key "poison" followed by a good one, and a rolled-back
// transaction that must never arrive.
func appOrders(t *testing.T, pool *pgxpool.Pool, w *outbox.Writer, n int, poison outbox.Message) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	var msgs []outbox.Message
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("k%d", i%10)
		msgs = append(msgs, outbox.Message{
			Topic: "orders", Key: key, Payload: []byte(fmt.Sprintf("%s:%d", key, i)),
			Headers: map[string]string{"type": "OrderPlaced", "trace": "ü-✓"},
		})
	}
	msgs = append(msgs, poison, outbox.Message{Topic: "orders", Key: poison.Key, Payload: []byte("after-poison")})
	require.NoError(t, w.Write(ctx, tx, msgs...))
	require.NoError(t, tx.Commit(ctx))

	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx, outbox.Message{Topic: "orders", Key: "k1", Payload: []byte("rolled-back")}))
	require.NoError(t, tx.Rollback(ctx))
}

func deadLetters(t *testing.T, pool *pgxpool.Pool, schema string) []operator.DeadLetter {
	t.Helper()
	admin, err := operator.New(pool, schema)
	require.NoError(t, err)
	dls, err := admin.List(context.Background(), operator.Selection{All: true})
	require.NoError(t, err)
	return dls
}

func checkSeqOrder(t *testing.T, payloads []string) {
	t.Helper()
	last := map[string]int{}
	for _, p := range payloads {
		key, seq, ok := strings.Cut(p, ":")
		if !ok {
			continue
		}
		var n int
		_, err := fmt.Sscan(seq, &n)
		require.NoError(t, err)
		if prev, seen := last[key]; seen {
			require.Greater(t, n, prev, "key %s out of order", key)
		}
		last[key] = n
	}
}

func TestRunKafkaEndToEnd(t *testing.T) {
	pool, schema, w := e2e(t)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders"))
	require.NoError(t, err)
	defer cluster.Close()
	broker := cluster.ListenAddrs()[0]

	const n = 300
	poison := outbox.Message{Topic: "orders", Key: "poison", Payload: make([]byte, 2000)}
	appOrders(t, pool, w, n, poison)

	code, _, stderr := run(t, "run", "--sink", "kafka://"+broker+"?max_message_bytes=1000", "--exit-when-empty")
	require.Equal(t, 0, code, stderr)

	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n+1 {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "got %d of %d records", len(recs), n+1)
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	partitionOf := map[string]int32{}
	byPartition := map[int32][]string{}
	for _, r := range recs {
		key := string(r.Key)
		if p, ok := partitionOf[key]; ok {
			require.Equal(t, p, r.Partition, "same key, same partition")
		}
		partitionOf[key] = r.Partition
		byPartition[r.Partition] = append(byPartition[r.Partition], string(r.Value))
		headers := map[string]string{}
		for _, h := range r.Headers {
			headers[h.Key] = string(h.Value)
		}
		require.Len(t, headers["outbox-message-id"], 36)
		if key != "poison" {
			require.Equal(t, "OrderPlaced", headers["type"])
			require.Equal(t, "ü-✓", headers["trace"])
		}
		require.NotEqual(t, "rolled-back", string(r.Value))
	}
	for _, vals := range byPartition {
		checkSeqOrder(t, vals)
	}
	dls := deadLetters(t, pool, schema)
	require.Len(t, dls, 1)
	require.Equal(t, "poison", *dls[0].Key)
	require.Equal(t, relay.ReasonPermanent, dls[0].Reason)
	require.Contains(t, *dls[0].LastError, "max_message_bytes", "the reason names the limit")
}

func TestRunHTTPEndToEnd(t *testing.T) {
	pool, schema, w := e2e(t)
	var mu sync.Mutex
	var got []string
	ids := map[string]bool{}
	badHeaders := 0
	srv := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		body := r.Body
		key, _ := url.PathUnescape(r.Header.Get("outbox-key"))
		if key == "poison" && string(body) != "after-poison" {
			return http.StatusBadRequest, "schema validation failed: field total is required"
		}
		mu.Lock()
		defer mu.Unlock()
		if string(body) != "after-poison" && r.Header.Get("Type") != "OrderPlaced" {
			badHeaders++
		}
		ids[r.Header.Get("webhook-id")] = true
		got = append(got, string(body))
		return http.StatusOK, ""
	})

	const n = 200
	appOrders(t, pool, w, n, outbox.Message{Topic: "orders", Key: "poison", Payload: []byte("{}")})
	code, _, stderr := run(t, "run", "--sink", srv.URL(), "--exit-when-empty")
	require.Equal(t, 0, code, stderr)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, n+1, "every committed message except the poison one; never the rolled-back one")
	require.Len(t, ids, n+1, "one webhook-id per message")
	require.Zero(t, badHeaders, "application headers arrive as HTTP headers")
	require.NotContains(t, got, "rolled-back")
	require.Contains(t, got, "after-poison", "the poison message's key moved on")
	checkSeqOrder(t, got)
	dls := deadLetters(t, pool, schema)
	require.Len(t, dls, 1)
	require.Equal(t, relay.ReasonPermanent, dls[0].Reason)
	require.Contains(t, *dls[0].LastError, "400")
	require.Contains(t, *dls[0].LastError, "field total is required", "the receiver's reason is kept")
	var left int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+migrations.Ident(schema)+".messages").Scan(&left))
	require.Zero(t, left)
}

func TestRunAMQPEndToEnd(t *testing.T) {
	pool, schema, w := e2e(t)
	amqpURL := testkit.AMQPURL()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		pgtest.Unavailable(t, "rabbitmq at %s: %v", amqpURL, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	exchange := "e2e-" + schema
	require.NoError(t, ch.ExchangeDeclare(exchange, "topic", false, true, false, false, nil))
	defer ch.ExchangeDelete(exchange, false, false)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "orders", exchange, false, nil))

	const n = 200
	appOrders(t, pool, w, n, outbox.Message{Topic: "nowhere", Key: "poison", Payload: []byte("{}")})
	sinkURL := strings.TrimSuffix(amqpURL, "/") + "/?exchange=" + url.QueryEscape(exchange)
	code, _, stderr := run(t, "run", "--sink", sinkURL, "--exit-when-empty")
	require.Equal(t, 0, code, stderr)
	require.NotContains(t, stderr, "guest:guest", "the password is redacted in logs")

	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	var got []string
	ids := map[string]bool{}
	timeout := time.After(20 * time.Second)
	for len(got) < n+1 {
		select {
		case d := <-deliveries:
			got = append(got, string(d.Body))
			ids[d.MessageId] = true
			require.Equal(t, uint8(2), d.DeliveryMode, "persistent")
			if string(d.Body) != "after-poison" {
				require.Equal(t, "OrderPlaced", d.Headers["type"])
			}
		case <-timeout:
			t.Fatalf("received %d of %d messages", len(got), n+1)
		}
	}
	require.Len(t, ids, n+1)
	require.NotContains(t, got, "rolled-back")
	checkSeqOrder(t, got)
	dls := deadLetters(t, pool, schema)
	require.Len(t, dls, 1)
	require.Equal(t, "nowhere", dls[0].Topic)
	require.Equal(t, relay.ReasonPermanent, dls[0].Reason)
	require.Contains(t, *dls[0].LastError, "unroutable")
}

// TestRunRoutes routes orders.* to Kafka and billing.* to a webhook that
// is down for a while, from one relay process: orders flow during the
// outage, billing catches up afterwards, and a topic no route matches is
// dead-lettered with the reason.
func TestRunRoutes(t *testing.T) {
	pool, schema, w := e2e(t)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders.placed"))
	require.NoError(t, err)
	defer cluster.Close()

	var mu sync.Mutex
	var billing []string
	var ordersDoneBeforeBillingUp bool
	up := make(chan struct{})
	srv := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		select {
		case <-up:
		default:
			return http.StatusServiceUnavailable, "maintenance"
		}
		body := r.Body
		mu.Lock()
		billing = append(billing, string(body))
		mu.Unlock()
		return http.StatusOK, ""
	})

	cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte(fmt.Sprintf(`
retry-initial: 20ms
retry-max: 100ms
routes:
  - name: orders
    topics: ["orders.*"]
    sink: kafka://%s
  - name: billing
    topics: ["billing.*"]
    sink: %s/hook
    max-attempts: 1000
`, cluster.ListenAddrs()[0], srv.Base())), 0o600))

	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	var msgs []outbox.Message
	for i := 0; i < 50; i++ {
		key := fmt.Sprintf("c%d", i%5) // the same customers on both routes
		msgs = append(msgs,
			outbox.Message{Topic: "orders.placed", Key: key, Payload: []byte(fmt.Sprintf("%s:%d", key, i))},
			outbox.Message{Topic: "billing.invoiced", Key: key, Payload: []byte(fmt.Sprintf("%s:%d", key, i))})
	}
	msgs = append(msgs, outbox.Message{Topic: "audit.login", Key: "u", Payload: []byte("nobody routes me")})
	require.NoError(t, w.Write(ctx, tx, msgs...))
	require.NoError(t, tx.Commit(ctx))

	// Bring billing back once every order has left the outbox.
	go func() {
		defer close(up)
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		testkit.Poll(pctx, 20*time.Millisecond, func() bool {
			var n int
			_ = pool.QueryRow(pctx, "SELECT count(*) FROM "+migrations.Ident(schema)+".messages WHERE topic LIKE 'orders.%'").Scan(&n)
			if n != 0 {
				return false
			}
			mu.Lock()
			ordersDoneBeforeBillingUp = len(billing) == 0
			mu.Unlock()
			return true
		})
	}()
	code, _, stderr := run(t, "run", "--config", cfgFile, "--exit-when-empty")
	require.Equal(t, 0, code, stderr)

	mu.Lock()
	defer mu.Unlock()
	require.True(t, ordersDoneBeforeBillingUp, "orders were all delivered while the billing webhook was down")
	require.Len(t, billing, 50)
	checkSeqOrder(t, billing)
	dls := deadLetters(t, pool, schema)
	require.Len(t, dls, 1)
	require.Equal(t, "audit.login", dls[0].Topic)
	require.Contains(t, *dls[0].LastError, `no route matches topic "audit.login"`)

	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()[0]), kgo.ConsumeTopics("orders.placed"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n := 0
	for n < 50 {
		fs := cl.PollFetches(pctx)
		require.NoError(t, pctx.Err())
		n += fs.NumRecords()
	}
}

func TestRunRoutesConfigErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ yaml, want string }{
		{"routes:\n  - name: a\n    topics: [x]\n", "routes[0].sink: required"},
		{"routes:\n  - name: A\n    topics: [x]\n    sink: stdout\n", "routes[0].name"},
		{"routes:\n  - name: a\n    sink: stdout\n", "routes[0].topics"},
		{"routes:\n  - name: a\n    topics: [x]\n    sink: stdout\n    colour: red\n", `unknown key "colour" in routes[0]`},
		{"routes:\n  - name: a\n    topics: [x]\n    sink: stdout\n  - name: a\n    topics: [y]\n    sink: stdout\n", "used twice"},
		{"routes:\n  - name: a\n    topics: [x]\n    sink: nonsense://\n", "routes[0]: outbox: sink: unsupported"},
	} {
		f := filepath.Join(dir, "c.yaml")
		require.NoError(t, os.WriteFile(f, []byte(tc.yaml), 0o600))
		code, _, stderr := run(t, "run", "--config", f, "--database-url", "postgres://x@127.0.0.1:1/d")
		require.Equal(t, 2, code, stderr)
		require.Contains(t, stderr, tc.want)
	}
	f := filepath.Join(dir, "c.yaml")
	require.NoError(t, os.WriteFile(f, []byte("routes:\n  - name: a\n    topics: [x]\n    sink: stdout\n"), 0o600))
	code, _, stderr := run(t, "run", "--config", f, "--sink", "stdout", "--database-url", "postgres://x@127.0.0.1:1/d")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "not both")
	code, _, stderr = run(t, "run", "--sink", "stdout", "--isolate-routes", "--database-url", "postgres://x@127.0.0.1:1/d")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "outbox: isolate-routes: isolates the routes of a routes table")
	code, _, stderr = run(t, "run", "--config", f, "--readiness", "some-routes", "--database-url", "postgres://x@127.0.0.1:1/d")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `outbox: readiness: "some-routes" must be any-route or every-route`)
}

func TestRunCloudEventsOverHTTP(t *testing.T) {
	pool, _, w := e2e(t)
	got := make(chan http.Header, 1)
	srv := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		select {
		case got <- r.Header.Clone():
		default:
		}
		return http.StatusOK, ""
	})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	res, err := w.Insert(ctx, tx, outbox.Message{Topic: "orders", Key: "o-1", Payload: []byte(`{}`),
		Headers: map[string]string{"type": "com.example.order.placed", "content-type": "application/json"}})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	code, _, stderr := run(t, "run", "--sink", srv.Base(), "--format", "cloudevents", "--cloudevents-source", "/orders", "--exit-when-empty")
	require.Equal(t, 0, code, stderr)
	h := <-got
	require.Equal(t, "1.0", h.Get("ce-specversion"))
	require.Equal(t, res[0].MessageID, h.Get("ce-id"))
	require.Equal(t, "/orders", h.Get("ce-source"))
	require.Equal(t, "com.example.order.placed", h.Get("ce-type"))
	require.Equal(t, "o-1", h.Get("ce-subject"))
	require.Equal(t, "application/json", h.Get("Content-Type"))

	code, _, stderr = run(t, "run", "--sink", srv.Base(), "--format", "protobuf")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "protobuf")
}

func TestRunFanOut(t *testing.T) {
	pool, schema, w := e2e(t)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders.placed", "users.updated"))
	require.NoError(t, err)
	defer cluster.Close()
	broker := cluster.ListenAddrs()[0]

	var mu sync.Mutex
	var hook []string
	var acceptPoison, kafkaDoneFirst bool
	down := make(chan struct{}) // closed when the webhook may take key c3
	srv := testkit.NewTestReceiver(t, func(r *testkit.Request) (int, string) {
		body := r.Body
		mu.Lock()
		defer mu.Unlock()
		switch {
		case string(body) == "poison" && !acceptPoison:
			return http.StatusBadRequest, "cannot parse"
		case strings.HasPrefix(string(body), "c3:"):
			select {
			case <-down:
			default:
				return http.StatusServiceUnavailable, "busy"
			}
		}
		hook = append(hook, string(body))
		return http.StatusOK, ""
	})

	cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte(fmt.Sprintf(`
retry-initial: 20ms
retry-max: 100ms
archive: true
routes:
  - name: orders
    topics: ["orders.*"]
    sink: kafka://%[1]s
  - name: users
    topics: ["users.*"]
    sink: kafka://%[1]s
  - name: hook
    topics: ["orders.placed"]
    sink: %[2]s/hook
    fanout: true
    max-attempts: 1000
`, broker, srv.Base())), 0o600))

	ctx := context.Background()
	var msgs []outbox.Message
	for i := 0; i < 100; i++ {
		key := fmt.Sprintf("c%d", i%5)
		msgs = append(msgs,
			outbox.Message{Topic: "orders.placed", Key: key, Payload: []byte(fmt.Sprintf("%s:%d", key, i))},
			outbox.Message{Topic: "users.updated", Key: key, Payload: []byte(fmt.Sprintf("%s:%d", key, i))})
	}
	msgs = append(msgs, outbox.Message{Topic: "orders.placed", Key: "p", Payload: []byte("poison")})
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.Write(ctx, tx, msgs...) }))

	// kafkaCount reads topic from the start until it has want records
	// (or 30 s pass), then half a second more for any beyond want, and
	// returns how many there were: a fixed two-second read returned 0 on a
	// loaded machine, before the client had even fetched metadata.
	kafkaCount := func(topic string, want int) int {
		cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		require.NoError(t, err)
		defer cl.Close()
		var vals []string
		poll := func(d time.Duration, done func() bool) {
			pctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			for pctx.Err() == nil && !done() {
				cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) { vals = append(vals, string(r.Value)) })
			}
		}
		poll(30*time.Second, func() bool { return len(vals) >= want })
		poll(500*time.Millisecond, func() bool { return false })
		checkSeqOrder(t, vals)
		return len(vals)
	}

	// Kafka gets every order while the webhook still refuses key c3.
	go func() {
		defer close(down)
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		testkit.Poll(pctx, 20*time.Millisecond, func() bool {
			var n, m int
			_ = pool.QueryRow(pctx, "SELECT count(*) FROM "+migrations.Ident(schema)+".deliveries WHERE route = 'orders'").Scan(&n)
			if n != 0 {
				return false
			}
			_ = pool.QueryRow(pctx, "SELECT count(*) FROM "+migrations.Ident(schema)+".messages").Scan(&m)
			if m != 0 {
				return false
			}
			mu.Lock()
			kafkaDoneFirst = true
			mu.Unlock()
			return true
		})
	}()
	code, _, stderr := run(t, "run", "--config", cfgFile, "--exit-when-empty")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, 101, kafkaCount("orders.placed", 101))
	require.Equal(t, 100, kafkaCount("users.updated", 100))
	mu.Lock()
	require.True(t, kafkaDoneFirst, "Kafka got every order while the webhook refused key c3")
	require.Len(t, hook, 100)
	checkSeqOrder(t, hook)
	acceptPoison = true
	mu.Unlock()

	dls := deadLetters(t, pool, schema)
	require.Len(t, dls, 1)
	require.Equal(t, "hook", dls[0].Route)
	code, out, stderr := run(t, "dlq", "list", "--route", "hook")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "ROUTE")
	require.Contains(t, out, "hook")
	code, out, stderr = run(t, "dlq", "replay", "--route", "hook")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "replayed 1 dead letters")
	code, _, stderr = run(t, "run", "--config", cfgFile, "--exit-when-empty")
	require.Equal(t, 0, code, stderr)
	mu.Lock()
	require.Equal(t, "poison", hook[len(hook)-1], "the replayed copy reached the webhook")
	mu.Unlock()
	require.Equal(t, 101, kafkaCount("orders.placed", 101), "Kafka did not get the replayed message again")

	// The archive replays what one destination delivered, to it alone.
	code, _, stderr = run(t, "replay", "--from", "1h", "--route", "nope", "--config", cfgFile)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `no route "nope"`)
	code, out, stderr = run(t, "replay", "--from", "1h", "--route", "hook", "--config", cfgFile)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "replayed 101 archived messages")
	code, _, stderr = run(t, "run", "--config", cfgFile, "--exit-when-empty")
	require.Equal(t, 0, code, stderr)
	mu.Lock()
	require.Len(t, hook, 202)
	checkSeqOrder(t, hook[101:])
	mu.Unlock()
	require.Equal(t, 101, kafkaCount("orders.placed", 101))
}

// A RabbitMQ sink whose password the broker refuses: `run` says so and
// exits 1 after --connect-timeout, as for a database that is not there,
// and delivers nothing meanwhile.
func TestRunAMQPRefusedCredentialsExits(t *testing.T) {
	pool, schema, w := e2e(t)
	raw := testkit.AMQPURL()
	conn, err := amqp.Dial(raw)
	if err != nil {
		pgtest.Unavailable(t, "rabbitmq at %s: %v", raw, err)
	}
	conn.Close()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "not-the-password")
	u.RawQuery = "exchange=amq.topic"
	appOrders(t, pool, w, 5, outbox.Message{Topic: "orders", Key: "poison", Payload: []byte("p")})

	code, _, stderr := run(t, "run", "--sink", u.String(), "--connect-timeout", "1s")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "the broker refuses the credentials")
	require.Contains(t, stderr, "403")
	require.NotContains(t, stderr, "not-the-password")
	var left int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM "+migrations.Ident(schema)+".messages").Scan(&left))
	require.Equal(t, 7, left, "nothing claimed, nothing lost")
}
