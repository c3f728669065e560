package amqpsink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/amqptest"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Poison: true, Transient: true, Restart: true, Outage: true,
			Why: map[string]string{"Partitions": "RabbitMQ queues have no partitions"}},
		Setup: func(t *testing.T) *sinktest.Env {
			needRabbitmqctl(t)
			// The sink goes through a proxy that Down closes: the broker,
			// which other tests share, keeps running.
			e := setup(t, viaProxy())
			return &sinktest.Env{
				Sink:  e.sink,
				Topic: e.topic,
				Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
					ds, err := e.read(ctx, n)
					out := make([]sinktest.Delivered, len(ds))
					for i, d := range ds {
						h := make(map[string]string, len(d.Headers))
						for k, v := range d.Headers {
							if s, ok := v.(string); ok {
								h[k] = s
							}
						}
						seq, _ := d.Headers[HeaderSeq].(int64)
						out[i] = sinktest.Delivered{ID: d.MessageId, Seq: seq, Topic: d.Type, Key: headerString(d, HeaderKey),
							Payload: d.Body, Headers: h, Partition: -1}
					}
					return out, err
				},
				Poison: func(topic string) sinks.Message {
					m := sinktest.Msg(topic, "", 0, []byte("poison"))
					m.Headers = map[string]string{"x-test-route": ".unbound"}
					return m
				},
				BreakTransient: e.breakExchange,
				Restart:        e.restartConn,
				Down:           e.proxy.Down,
				Up:             e.proxy.Up,
			}
		},
	})
}

func TestSendDeliversWithProperties(t *testing.T) {
	t.Parallel()
	e := setup(t)
	topic := e.topic("orders")
	created := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	batch := []sinks.Message{
		{ID: sinktest.NewID(), Seq: 1, Topic: topic, Key: "a", Payload: []byte{0, 1, 2, 0xff}, CreatedAt: created, Attempt: 1,
			Headers: map[string]string{"traceparent": "00-abc-def-01", "tenant": "t1"}},
		{ID: sinktest.NewID(), Seq: 2, Topic: topic, Payload: []byte(`{"x":1}`), CreatedAt: created, Attempt: 1,
			Headers: map[string]string{"Content-Type": "application/json"}},
		{ID: sinktest.NewID(), Seq: 3, Topic: topic, Key: "a", Payload: nil, CreatedAt: created, Attempt: 2},
	}
	require.NoError(t, e.sink.Send(context.Background(), batch))
	ds := e.mustRead(3)
	byID := map[string]amqp.Delivery{}
	for _, d := range ds {
		byID[d.MessageId] = d
	}
	for _, m := range batch {
		d, ok := byID[m.ID]
		require.True(t, ok, "message %s not delivered", m.ID)
		require.Equal(t, uint8(amqp.Persistent), d.DeliveryMode)
		require.Equal(t, m.Topic, d.Type)
		require.Equal(t, m.Topic, d.RoutingKey)
		require.Equal(t, e.exchange, d.Exchange)
		require.True(t, created.Equal(d.Timestamp), "timestamp %v", d.Timestamp)
		require.Equal(t, "outbox-relay", d.AppId)
		require.True(t, bytes.Equal(m.Payload, d.Body), "payload")
		for k, v := range m.Headers {
			require.Equal(t, v, headerString(d, k), "header %s", k)
		}
		require.Equal(t, m.Key, headerString(d, HeaderKey))
		if m.Key == "" {
			require.NotContains(t, d.Headers, HeaderKey)
		}
	}
	require.Equal(t, DefaultContentType, byID[batch[0].ID].ContentType)
	require.Equal(t, "application/json", byID[batch[1].ID].ContentType)
	// Per-key order: a#1 before a#2.
	var order []string
	for _, d := range ds {
		if headerString(d, HeaderKey) == "a" {
			order = append(order, d.MessageId)
		}
	}
	require.Equal(t, []string{batch[0].ID, batch[2].ID}, order)
}

func TestSendKeepsPerKeyOrderInLargeBatches(t *testing.T) {
	t.Parallel()
	e := setup(t)
	topic := e.topic("order")
	// 1200 messages: more than returnBuffer in round 0 (keyless + first of
	// each key), and 30 rounds for the hot key.
	var batch []sinks.Message
	for i := range 1200 {
		key := ""
		switch {
		case i%4 == 0:
			key = "hot"
		case i%4 == 1:
			key = fmt.Sprintf("k%d", i%97)
		}
		batch = append(batch, sinktest.Msg(topic, key, int64(i+1), []byte(fmt.Sprint(i))))
	}
	batch = batch[:1200]
	require.NoError(t, e.sink.Send(context.Background(), batch))
	ds := e.mustRead(len(batch))
	want := map[string][]string{}
	for _, m := range batch {
		if m.Key != "" {
			want[m.Key] = append(want[m.Key], m.ID)
		}
	}
	got := map[string][]string{}
	seen := map[string]bool{}
	for _, d := range ds {
		require.False(t, seen[d.MessageId], "duplicate %s", d.MessageId)
		seen[d.MessageId] = true
		if k := headerString(d, HeaderKey); k != "" {
			got[k] = append(got[k], d.MessageId)
		}
	}
	require.Equal(t, want, got)
}

func TestUnroutableIsPermanentAndBlocksItsKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ok := e.topic("ok")
	batch := []sinks.Message{
		sinktest.Msg(ok, "k1", 1, []byte("1")),
		sinktest.Msg(e.unboundTopic(), "k2", 2, []byte("2")),
		sinktest.Msg(ok, "k2", 3, []byte("3")),
		sinktest.Msg(ok, "", 4, []byte("4")),
		sinktest.Msg(ok, "k1", 5, []byte("5")),
		sinktest.Msg(e.unboundTopic(), "", 6, []byte("6")),
	}
	err := e.sink.Send(context.Background(), batch)
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.Len(t, be.Errs, len(batch))
	require.NoError(t, be.Errs[0])
	require.True(t, sinks.IsPermanent(be.Errs[1]), "unroutable must be permanent: %v", be.Errs[1])
	require.ErrorIs(t, be.Errs[1], ErrUnroutable)
	require.ErrorIs(t, be.Errs[2], sinks.ErrNotAttempted)
	require.NoError(t, be.Errs[3])
	require.NoError(t, be.Errs[4])
	require.True(t, sinks.IsPermanent(be.Errs[5]))

	// Exactly 1, 4 and 5 arrived: a sentinel sent afterwards is next.
	sentinel := sinktest.Msg(ok, "", 7, []byte("7"))
	require.NoError(t, e.sink.Send(context.Background(), []sinks.Message{sentinel}))
	ds := e.mustRead(4)
	var ids []string
	for _, d := range ds {
		ids = append(ids, d.MessageId)
	}
	require.ElementsMatch(t, []string{batch[0].ID, batch[3].ID, batch[4].ID}, ids[:3])
	require.Equal(t, sentinel.ID, ids[3])
	require.NoError(t, e.sink.Healthy(context.Background()), "a returned message must not break the sink")
}

func TestUnroutableRetry(t *testing.T) {
	t.Parallel()
	e := setup(t, withConfig(func(c *Config) { c.Unroutable = UnroutableRetry }))
	err := e.sink.Send(context.Background(), []sinks.Message{sinktest.Msg(e.unboundTopic(), "k", 1, nil)})
	require.Error(t, err)
	require.False(t, sinks.IsPermanent(sinks.Outcome(err, 0, 1)))
	require.ErrorIs(t, sinks.Outcome(err, 0, 1), ErrUnroutable)
}

func TestTooLargeIsPermanentAndNotSent(t *testing.T) {
	t.Parallel()
	e := setup(t, withConfig(func(c *Config) { c.MaxMessageSize = 1000 }))
	topic := e.topic("big")
	batch := []sinks.Message{
		sinktest.Msg(topic, "k", 1, make([]byte, 1001)),
		sinktest.Msg(topic, "k", 2, make([]byte, 10)),
		sinktest.Msg(topic, "j", 3, make([]byte, 1000)),
	}
	err := e.sink.Send(context.Background(), batch)
	require.True(t, sinks.IsPermanent(sinks.Outcome(err, 0, 3)))
	require.ErrorIs(t, sinks.Outcome(err, 1, 3), sinks.ErrNotAttempted)
	require.NoError(t, sinks.Outcome(err, 2, 3))
	ds := e.mustRead(1)
	require.Equal(t, batch[2].ID, ds[0].MessageId)
}

func TestMissingExchangeIsRetriable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	topic := e.topic("x")
	restore := e.breakExchange()
	batch := sinktest.Batch(topic, 20, 3, 10)
	err := e.sink.Send(context.Background(), batch)
	require.Error(t, err)
	for i := range batch {
		oe := sinks.Outcome(err, i, len(batch))
		require.Error(t, oe, "message %d", i)
		require.False(t, sinks.IsPermanent(oe), "message %d: %v", i, oe)
	}
	// The first message of each key was tried, the rest were held back.
	require.ErrorIs(t, sinks.Outcome(err, 3, len(batch)), sinks.ErrNotAttempted)
	require.ErrorContains(t, sinks.Outcome(err, 0, len(batch)), "NOT_FOUND")
	// The exchange deleted under a connected sink makes it unhealthy
	// (declare_exchange=none, the default), and healthy again once the
	// exchange is back (checked again a second later).
	require.ErrorIs(t, e.sink.Healthy(context.Background()), ErrExchangeMissing)
	restore()
	require.NoError(t, e.sink.Send(context.Background(), batch))
	require.Len(t, e.mustRead(len(batch)), len(batch))
	require.Eventually(t, func() bool { return e.sink.Healthy(context.Background()) == nil }, 10*time.Second, 50*time.Millisecond,
		"healthy once the exchange exists again")
}

// Issue 34: with the default declare_exchange (none), a sink whose
// exchange does not exist is unhealthy, saying so, from its first
// connection: the broker is reachable but nothing can be delivered.
func TestMissingExchangeIsUnhealthyByDefault(t *testing.T) {
	t.Parallel()
	if c, err := amqp.Dial(testkit.AMQPURL()); err != nil {
		unavailable(t, "RabbitMQ not reachable at TEST_AMQP_URL: %v", err)
	} else {
		_ = c.Close()
	}
	name := testkit.RandName("missing")
	s, err := New(Config{URL: testkit.AMQPURL(), Exchange: name, PublishTimeout: time.Second, ReconnectInitial: 50 * time.Millisecond}, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close(context.Background())) }()
	require.Eventually(t, func() bool { return errors.Is(s.Healthy(context.Background()), ErrExchangeMissing) }, 10*time.Second, 20*time.Millisecond)
	err = s.Healthy(context.Background())
	require.ErrorContains(t, err, name)
	require.ErrorContains(t, err, "NOT_FOUND")
}

func TestRecoversAfterBrokerClosesConnection(t *testing.T) {
	t.Parallel()
	needRabbitmqctl(t)
	e := setup(t)
	topic := e.topic("r")
	ctx := context.Background()
	require.NoError(t, e.sink.Send(ctx, sinktest.Batch(topic, 5, 2, 10)))
	e.mustRead(5)

	require.NoError(t, e.restartConn())
	// Sends during and after the drop either fail retriably or succeed;
	// one must succeed within the deadline, and everything reported
	// delivered must arrive.
	var delivered []string
	deadline := time.Now().Add(15 * time.Second)
	for {
		batch := sinktest.Batch(topic, 10, 3, 10)
		err := e.sink.Send(ctx, batch)
		for i, m := range batch {
			oe := sinks.Outcome(err, i, len(batch))
			require.False(t, sinks.IsPermanent(oe), "connection loss must not be permanent: %v", oe)
			if oe == nil {
				delivered = append(delivered, m.ID)
			}
		}
		if err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "no successful Send after the restart: %v", err)
	}
	require.NoError(t, e.sink.Healthy(ctx))
	got := map[string]bool{}
	for _, d := range e.mustRead(len(delivered)) {
		got[d.MessageId] = true
	}
	for _, id := range delivered {
		require.True(t, got[id], "message %s reported delivered but not read", id)
	}
}

// TestConnectionLossMidBatch closes the connection (rabbitmqctl
// close_connection: 320 CONNECTION_FORCED) while two senders stream
// batches back to back, and checks on every batch what the relay relies
// on: nothing reported delivered is missing, failures say the broker is
// down (not sent, or unavailable), and a message after a failed one of
// its key was never delivered in that call.
func TestConnectionLossMidBatch(t *testing.T) {
	t.Parallel()
	needRabbitmqctl(t)
	e := setup(t)
	topic := e.topic("mid")
	ctx := context.Background()

	type result struct {
		batch []sinks.Message
		err   error
	}
	var (
		mu        sync.Mutex
		results   []result
		failures  int
		successes int
		wg        sync.WaitGroup
	)
	stop := make(chan struct{})
	for g := range 2 { // two senders leave no gap between Sends
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				batch := sinktest.Batch(topic, 300, 50, 200)
				for i := range batch {
					batch[i].Key = fmt.Sprintf("g%d-%s", g, batch[i].Key) // senders never share a key
				}
				err := e.sink.Send(ctx, batch)
				mu.Lock()
				results = append(results, result{batch, err})
				if err != nil {
					failures++
				} else {
					successes++
				}
				mu.Unlock()
			}
		}()
	}
	stopped := false
	stopAll := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopAll()
	// poll waits for cond, checked every 5 ms, for at most 30 s.
	poll := func(what string, cond func() bool) {
		t.Helper()
		testkit.Eventually(t, 30*time.Second, 5*time.Millisecond, func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			return cond(), "waiting for " + what
		})
	}
	conn := func() *connState {
		e.sink.mu.Lock()
		defer e.sink.mu.Unlock()
		return e.sink.conn
	}
	poll("two delivered batches", func() bool { return successes >= 2 })
	// A close that lands between two Sends fails nothing; try again until
	// one lands inside a batch.
	for try := 0; try < 5; try++ {
		before := conn()
		require.NoError(t, e.restartConn())
		var okBefore int
		poll("a new connection", func() bool {
			c := conn()
			okBefore = successes
			return c != nil && c != before
		})
		poll("a delivered batch after the reconnect", func() bool { return successes > okBefore })
		mu.Lock()
		hit := failures > 0
		mu.Unlock()
		if hit {
			break
		}
	}
	stopAll()

	mu.Lock()
	defer mu.Unlock()
	require.Positive(t, failures, "five connection closes all missed the Sends")
	delivered := map[string]bool{}
	notAttempted := map[string]bool{}
	for _, r := range results {
		var gate sinks.KeyGate
		for i, m := range r.batch {
			oe := sinks.Outcome(r.err, i, len(r.batch))
			require.False(t, sinks.IsPermanent(oe), "%v", oe)
			switch {
			case oe == nil:
				require.False(t, gate.Blocked(m), "message reported delivered after a failed message of its key")
				delivered[m.ID] = true
			case sinks.IsNotSent(oe):
				// Not published: the channel broke before its turn.
				notAttempted[m.ID] = true
				gate.Fail(m)
			case errors.Is(oe, sinks.ErrNotAttempted):
				require.True(t, gate.Blocked(m), "not attempted, but no earlier message of its key failed")
				notAttempted[m.ID] = true
			default:
				require.ErrorIs(t, oe, sinks.ErrUnavailable, "a message on a connection the broker closed")
				gate.Fail(m)
			}
		}
	}
	confirmed := len(delivered)
	// Unconfirmed messages may have arrived too (at least once); read
	// until every confirmed one is there.
	ctx2, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for len(delivered) > 0 {
		ds, err := e.read(ctx2, 1)
		require.NoError(t, err, "%d confirmed messages never arrived", len(delivered))
		require.False(t, notAttempted[ds[0].MessageId], "a not-attempted message was delivered")
		delete(delivered, ds[0].MessageId)
	}
	t.Logf("%d batches (%d failed), %d confirmed messages all delivered", len(results), failures, confirmed)
}

func TestSendWhileDisconnectedFailsRetriably(t *testing.T) {
	t.Parallel()
	// Nothing listens on port 1 of loopback.
	s, err := New(Config{URL: "amqp://guest:guest@127.0.0.1:1/", Exchange: "x", PublishTimeout: 300 * time.Millisecond,
		ReconnectInitial: 50 * time.Millisecond}, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close(context.Background())) }()
	start := time.Now()
	err = s.Send(context.Background(), sinktest.Batch("t", 3, 1, 1))
	require.ErrorIs(t, err, ErrNotConnected)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, sinks.IsPermanent(err))
	// Returns at its 300ms publish timeout, not after a reconnect loop; 3s
	// is ten times that, so a loaded machine under -race stays inside it.
	require.Less(t, time.Since(start), 3*time.Second)
	require.ErrorIs(t, s.Healthy(context.Background()), ErrNotConnected)
	require.NotContains(t, err.Error(), "guest:guest")
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := e.sink.Send(ctx, sinktest.Batch(e.topic("c"), 3, 1, 1))
	require.ErrorIs(t, err, context.Canceled)
}

func TestCloseAndHealth(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	require.NoError(t, e.sink.Send(ctx, sinktest.Batch(e.topic("h"), 1, 0, 1)))
	require.NoError(t, e.sink.Healthy(ctx))
	require.NoError(t, e.sink.Send(ctx, nil))
	require.NoError(t, e.sink.Close(ctx))
	require.NoError(t, e.sink.Close(ctx))
	require.ErrorIs(t, e.sink.Send(ctx, sinktest.Batch(e.topic("h"), 1, 0, 1)), sinks.ErrClosed)
	require.ErrorIs(t, e.sink.Healthy(ctx), sinks.ErrClosed)
}

func TestPassiveExchangeCheck(t *testing.T) {
	t.Parallel()
	if c, err := amqp.Dial(testkit.AMQPURL()); err != nil {
		unavailable(t, "RabbitMQ not reachable at TEST_AMQP_URL: %v", err)
	} else {
		_ = c.Close()
	}
	s, err := New(Config{URL: testkit.AMQPURL(), Exchange: testkit.RandName("missing"), DeclareExchange: DeclarePassive,
		PublishTimeout: time.Second, ReconnectInitial: 50 * time.Millisecond}, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close(context.Background())) }()
	err = s.Send(context.Background(), sinktest.Batch("t", 1, 0, 1))
	require.ErrorIs(t, err, ErrNotConnected)
	require.ErrorContains(t, err, "NOT_FOUND")
	require.ErrorContains(t, s.Healthy(context.Background()), "NOT_FOUND")
}

func TestConcurrentSends(t *testing.T) {
	t.Parallel()
	e := setup(t, withConfig(func(c *Config) { c.Channels = 3 }))
	topic := e.topic("conc")
	const senders, batches, per = 6, 5, 40
	var wg sync.WaitGroup
	want := map[string][]string{}
	var mu sync.Mutex
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				batch := make([]sinks.Message, per)
				for i := range batch {
					batch[i] = sinktest.Msg(topic, fmt.Sprintf("g%d-k%d", g, i%5), int64(b*per+i), []byte("x"))
				}
				if err := e.sink.Send(context.Background(), batch); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, m := range batch {
					want[m.Key] = append(want[m.Key], m.ID)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	got := map[string][]string{}
	for _, d := range e.mustRead(senders * batches * per) {
		k := headerString(d, HeaderKey)
		got[k] = append(got[k], d.MessageId)
	}
	require.Equal(t, want, got)
}

// TestBrokerRestart stops and starts the whole RabbitMQ application in the
// middle of a stream of batches, on a throwaway node of its own
// (amqptest.Server): the shared broker is never stopped.
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	broker := amqptest.Server(t)
	e := setup(t, onBroker(broker), durable(), noReader())
	topic := e.topic("restart")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var pending []sinks.Message // not yet confirmed, in order
	confirmed := map[string]bool{}
	sent := map[string][]string{} // key -> ids in creation (= relay) order
	next := 0
	// send tops pending up to a full batch when refill is set, sends it
	// and keeps what failed (in order) for the next call.
	send := func(refill bool) error {
		for refill && len(pending) < 1000 {
			m := sinktest.Batch(topic, 1, 0, 200)[0]
			m.Key = fmt.Sprintf("k%d", next%20)
			next++
			sent[m.Key] = append(sent[m.Key], m.ID)
			pending = append(pending, m)
		}
		err := e.sink.Send(ctx, pending)
		var keep []sinks.Message
		for i, m := range pending {
			oe := sinks.Outcome(err, i, len(pending))
			require.False(t, sinks.IsPermanent(oe), "%v", oe)
			if oe == nil {
				confirmed[m.ID] = true
			} else {
				keep = append(keep, m)
			}
		}
		pending = keep
		return err
	}
	require.NoError(t, send(true))

	stopped := make(chan error, 1)
	go func() { stopped <- broker.StopApp(ctx) }()
	failures := 0
	for restarted := false; !restarted || failures == 0; {
		if err := send(true); err != nil {
			failures++
			t.Logf("send during restart: %d pending: %v", len(pending), err)
		}
		select {
		case err := <-stopped:
			require.NoError(t, err)
			require.NoError(t, broker.StartApp(ctx)) // returns once it has booted
			restarted = true
		default:
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(pending) > 0 {
		require.True(t, time.Now().Before(deadline), "%d messages still failing after the restart", len(pending))
		_ = send(false)
	}
	require.Greater(t, failures, 0)

	// Read the durable queue only now, so that it holds everything
	// confirmed before, during and after the restart.
	conn, err := amqp.Dial(broker.URL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	deliv, err := ch.Consume(e.queue, "", true, false, false, false, nil)
	require.NoError(t, err)
	timeout := time.After(30 * time.Second)
	got := map[string]bool{}
	firsts := map[string][]string{} // key -> first deliveries, in arrival order
	for missing := len(confirmed); missing > 0; {
		select {
		case d := <-deliv:
			if !got[d.MessageId] {
				got[d.MessageId] = true
				k := headerString(d, HeaderKey)
				firsts[k] = append(firsts[k], d.MessageId)
				if confirmed[d.MessageId] {
					missing--
				}
			}
		case <-timeout:
			t.Fatalf("%d of %d confirmed messages lost across the broker restart", missing, len(confirmed))
		}
	}
	// Per-key order of first arrivals (duplicates aside) is the order the
	// relay handed the messages over.
	for k, ids := range sent {
		require.Equal(t, ids, firsts[k], "key %s out of order", k)
	}
	t.Logf("%d messages confirmed and delivered across the restart, %d failed sends", len(confirmed), failures)
}

// TestBrokerMemoryAlarm sets the broker's memory watermark near zero so it
// blocks every publisher, and checks that Send still returns within its
// deadline (the client library's socket writes ignore contexts), that
// every failure says the broker is down (not sent, or unavailable: a
// connection closed under a stuck write, no confirm within the publish
// timeout), and that it delivers again once the alarm clears. The alarm is
// broker-wide, so the broker is a throwaway node of the test's own
// (amqptest.Server).
func TestBrokerMemoryAlarm(t *testing.T) {
	t.Parallel()
	broker := amqptest.Server(t)
	e := setup(t, onBroker(broker), withConfig(func(c *Config) { c.PublishTimeout = 2 * time.Second }))
	topic := e.topic("alarm")
	ctx := context.Background()
	require.NoError(t, e.sink.Send(ctx, sinktest.Batch(topic, 10, 2, 10)))
	e.mustRead(10)

	ctlCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	out, err := broker.Ctl(ctlCtx, "eval", "vm_memory_monitor:get_vm_memory_high_watermark().")
	require.NoError(t, err)
	orig := strings.TrimSpace(out) // 0.4 or {absolute,N}
	restoreArgs := []string{"set_vm_memory_high_watermark", orig}
	if strings.HasPrefix(orig, "{absolute,") {
		restoreArgs = []string{"set_vm_memory_high_watermark", "absolute", strings.TrimSuffix(strings.TrimPrefix(orig, "{absolute,"), "}")}
	}
	_, err = broker.Ctl(ctlCtx, "set_vm_memory_high_watermark", "0.000001")
	require.NoError(t, err)

	// Keyless, so 512 messages (10 MB) go out per round: more than the
	// socket buffers hold, so writes block.
	batch := sinktest.Batch(topic, 2000, 0, 20_000)
	start := time.Now()
	err = e.sink.Send(ctx, batch)
	took := time.Since(start)
	require.Error(t, err)
	requireOutage(t, err, len(batch))
	// The bound is the publish timeout plus the grace for a stuck write,
	// with 3s more so that a loaded machine under -race stays inside it: a
	// Send that ignored its timeout would block as long as the alarm lasts.
	require.Less(t, took, 2*time.Second+stuckGrace+3*time.Second, "Send overran its publish timeout")
	t.Logf("blocked Send returned after %s: %v", took, err)

	// The stuck write made the sink close its connection. On the new one
	// the broker reads up to the first publish and then stops reading, so
	// a few small messages are written out and their confirms never come:
	// no confirm within the publish timeout says the broker is
	// unavailable. (Whether connection.blocked reaches the sink before
	// the deadline varies from run to run: the outcome is not sent then.)
	small := sinktest.Batch(topic, 5, 0, 10)
	err = e.sink.Send(ctx, small)
	require.Error(t, err)
	requireOutage(t, err, len(small))
	timedOut := 0
	for i := range small {
		if oe := sinks.Outcome(err, i, len(small)); errors.Is(oe, ErrNotConfirmed) && errors.Is(oe, context.DeadlineExceeded) {
			require.ErrorIs(t, oe, sinks.ErrUnavailable)
			timedOut++
		}
	}
	t.Logf("small Send under the alarm: %d of %d without a confirm in time: %v", timedOut, len(small), err)

	_, err = broker.Ctl(ctlCtx, restoreArgs...)
	require.NoError(t, err, "restoring the memory watermark")
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := e.sink.Send(ctx, sinktest.Batch(topic, 10, 2, 10))
		if err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "no delivery after the alarm cleared: %v", err)
	}
	require.NoError(t, e.sink.Healthy(ctx))
}

// requireOutage requires every message of a failed batch of n to say the
// broker is down (not sent, or unavailable), or to be a later message of
// a key that did: what opens the relay's outage breaker.
func requireOutage(t *testing.T, err error, n int) {
	t.Helper()
	for i := range n {
		oe := sinks.Outcome(err, i, n)
		if oe == nil || errors.Is(oe, sinks.ErrNotAttempted) || errors.Is(oe, sinks.ErrUnavailable) {
			continue
		}
		require.Failf(t, "a failure that does not say the broker is down", "message %d: %v", i, oe)
	}
}

// BenchmarkSend measures one Send of 500 messages of 200 B to a durable
// queue (persistent messages, publisher confirms): no keys (one round),
// 400 keys (2 rounds: the batch a breadth-first claim takes from a
// 1,000-key backlog with two workers), 100 keys (5 rounds), 5 keys (100
// rounds: the batch the lane-local claim took from the same backlog) and
// one hot key (500 rounds, the worst case).
func BenchmarkSend(b *testing.B) {
	for _, keys := range []int{0, 400, 100, 5, 1} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			e := setup(b, durable())
			topic := e.topic("bench")
			go func() {
				for range e.deliv {
				}
			}()
			b.SetBytes(500 * 200)
			b.ReportAllocs()
			for b.Loop() {
				if err := e.sink.Send(context.Background(), sinktest.Batch(topic, 500, keys, 200)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*500)/b.Elapsed().Seconds(), "msg/s")
		})
	}
}
