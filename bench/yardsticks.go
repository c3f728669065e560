package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// The sinks' own yardsticks: what each sink takes with no relay in front
// of it (or, for Kafka, with a relay that keeps no order), measured in the
// same run as the relay's drain into it. A relay row's "× yardstick" is its
// rate divided by its sink's yardstick of the same run.

// httpConcurrency is max_concurrency of the HTTP sink in the drain, and the
// number of requests the raw client keeps in flight.
const httpConcurrency = 64

// amqpRound is how many messages the raw RabbitMQ publisher puts on the
// channel before it waits for their confirms.
const amqpRound = 500

// rawAMQPRun publishes cfg.amqpN messages with amqp091-go into the same
// kind of exchange and durable queue as the relay's drain: one channel in
// confirm mode, persistent, mandatory, rounds of amqpRound messages whose
// confirms are awaited together (pipelined).
func (b *bench) rawAMQPRun(ctx context.Context, r *row, run int) error {
	url, check, cleanup, err := b.amqpSetup(ctx, 1000+run)
	if err != nil {
		return err
	}
	defer cleanup()
	exchange := url[strings.LastIndex(url, "exchange=")+len("exchange="):]
	conn, err := amqp.Dial(b.cfg.amqpURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, amqpRound))
	n := b.cfg.amqpN
	pubs := make([]amqp.Publishing, n)
	for i := range pubs {
		pubs[i] = amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/json",
			MessageId: fmt.Sprintf("m-%d", i), Timestamp: time.Now(), Type: "bench",
			Headers: amqp.Table{wire.Key: fmt.Sprintf("key-%d", (i+1)%b.cfg.keys)},
			Body:    payloadGo(int64(i+1), b.cfg.payload)}
	}
	start := time.Now()
	dcs := make([]*amqp.DeferredConfirmation, 0, amqpRound)
	for i := 0; i < n; i += amqpRound {
		dcs = dcs[:0]
		for j := i; j < min(i+amqpRound, n); j++ {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "bench", true, false, pubs[j])
			if err != nil {
				return err
			}
			dcs = append(dcs, dc)
		}
		for _, dc := range dcs {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("nacked")
			}
		}
		select {
		case ret := <-returns:
			return fmt.Errorf("returned: %s", ret.ReplyText)
		default:
		}
	}
	el := time.Since(start)
	if msg := check(); msg != "" {
		return fmt.Errorf("raw publisher: %s", msg)
	}
	rate := float64(n) / el.Seconds()
	r.addRun(rate, 0)
	b.log.Info("raw amqp091-go", "rate", int(rate), "took", el.Round(time.Millisecond))
	return nil
}

// rawHTTPRun posts cfg.httpN messages to the same receiver as the relay's
// HTTP drain with plain net/http, httpConcurrency requests in flight.
func (b *bench) rawHTTPRun(ctx context.Context, r *row, recv *receiver) error {
	recv.reset(0)
	n := b.cfg.httpN
	tr := &http.Transport{MaxIdleConnsPerHost: httpConcurrency, MaxConnsPerHost: httpConcurrency}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = payloadGo(int64(i+1), b.cfg.payload)
	}
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range httpConcurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, recv.URL, bytes.NewReader(bodies[i]))
				if err != nil {
					failed.Store(err)
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("webhook-id", fmt.Sprintf("m-%d", i))
				res, err := client.Do(req)
				if err != nil {
					failed.Store(err)
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					failed.Store(fmt.Errorf("status %d", res.StatusCode))
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		return err
	}
	if got := recv.count.Load(); got != int64(n) {
		return fmt.Errorf("receiver got %d of %d", got, n)
	}
	rate := float64(n) / el.Seconds()
	r.addRun(rate, 0)
	b.log.Info("raw net/http", "rate", int(rate), "took", el.Round(time.Millisecond))
	return nil
}

// unorderedKafkaRun drains a backlog of cfg.n into a fresh kfake with the
// plainest pipeline there is: in as many connections as the relay has
// workers, each loop deletes the next batch in id order (SKIP LOCKED,
// DELETE … RETURNING), hands it to the relay's Kafka sink in one Send and
// commits. No lanes, no per-key order, no retries: what the relay's
// ordering costs is the gap between this row and the relay's.
func (b *bench) unorderedKafkaRun(ctx context.Context, r *row, run int) error {
	schema, err := b.newSchema(ctx, "unordered")
	if err != nil {
		return err
	}
	defer b.dropSchema(ctx, schema)
	if err := b.loadBacklog(ctx, schema, b.cfg.n, b.cfg.keys); err != nil {
		return err
	}
	url, _, cleanup, err := b.kafkaSetup(ctx, run)
	if err != nil {
		return err
	}
	defer cleanup()
	sink, err := openSink(url)
	if err != nil {
		return err
	}
	defer sink.Close(context.WithoutCancel(ctx))
	pc, err := pgxpool.ParseConfig(b.cfg.databaseURL)
	if err != nil {
		return err
	}
	pc.MaxConns, pc.MinConns = int32(b.cfg.workers), int32(b.cfg.workers)
	pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()
	s := migrations.Ident(schema)
	q := fmt.Sprintf(`DELETE FROM %s.messages WHERE id IN (
    SELECT id FROM %s.messages ORDER BY id LIMIT %d FOR UPDATE SKIP LOCKED)
RETURNING id, message_id::text, topic, coalesce(key, ''), payload, headers, created_at`, s, s, b.cfg.batch)
	conns := make([]*pgxpool.Conn, b.cfg.workers)
	for i := range conns {
		if conns[i], err = pool.Acquire(ctx); err != nil {
			return err
		}
		defer conns[i].Release()
	}
	if note := b.awaitHorizon(ctx); note != "" {
		r.addNote("run %d: %s", run+1, note)
	}
	var total atomic.Int64
	errs := make(chan error, len(conns))
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range conns {
		wg.Go(func() {
			for {
				n, err := unorderedBatch(ctx, c.Conn(), q, sink)
				if err != nil {
					errs <- err
					return
				}
				if n == 0 {
					return
				}
				total.Add(int64(n))
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	close(errs)
	for err := range errs {
		return err
	}
	if got := total.Load(); got != int64(b.cfg.n) {
		return fmt.Errorf("unordered pipeline delivered %d of %d", got, b.cfg.n)
	}
	rate := float64(b.cfg.n) / el.Seconds()
	r.addRun(rate, 0)
	b.log.Info("unordered kafka pipeline", "rate", int(rate), "took", el.Round(time.Millisecond))
	return nil
}

// unorderedBatch is one batch of the unordered pipeline: claim and delete,
// produce, commit (or roll back when the sink failed).
func unorderedBatch(ctx context.Context, c *pgx.Conn, q string, sink sinks.Sink) (int, error) {
	tx, err := c.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit: a no-op
	rows, _ := tx.Query(ctx, q)
	var msgs []sinks.Message
	var m sinks.Message
	var headers []byte
	_, err = pgx.ForEachRow(rows, []any{&m.Seq, &m.ID, &m.Topic, &m.Key, &m.Payload, &headers, &m.CreatedAt}, func() error {
		m.Headers = nil
		if len(headers) > 2 {
			if err := json.Unmarshal(headers, &m.Headers); err != nil {
				return err
			}
		}
		m.Attempt = 1
		msgs = append(msgs, m)
		return nil
	})
	if err != nil || len(msgs) == 0 {
		return 0, err
	}
	if err := sink.Send(ctx, msgs); err != nil {
		return 0, fmt.Errorf("produce: %w", err)
	}
	return len(msgs), tx.Commit(ctx)
}
