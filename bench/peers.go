package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// peers drains the same number of same-sized messages with River and with
// Watermill's SQL subscriber, on the same Postgres.
func (b *bench) peers(ctx context.Context) error {
	cfg := b.cfg
	river := &row{Group: "peers", Name: "River v0.51.1 (riverpgxv5), no-op worker", Messages: cfg.n, PayloadBytes: cfg.payload,
		Mode: "in-process",
		Note: "River's own benchmark settings (cmd/river/riverbench): FetchCooldown 2ms, FetchPollInterval 20ms, MaxWorkers 2000 on one queue; pgxpool defaults; jobs inserted with InsertManyFast (COPY) in chunks of 5,000; completed jobs stay in river_job (River's model); JSON args of 200 bytes; no ordering"}
	wmQueue := &row{Group: "peers", Name: "Watermill SQL v4.0.0, PostgreSQLQueueSchema + DeleteOnAck", Messages: cfg.n, PayloadBytes: cfg.payload,
		Batch: 100, Mode: "in-process",
		Note: "its delete-on-ack queue schema (PostgreSQLQueueOffsetsAdapter{DeleteOnAck: true}), SubscribeBatchSize default 100, one subscriber (its SELECT … FOR UPDATE without SKIP LOCKED serializes subscribers), published with its Publisher in calls of 1,000 messages; pgx adapter; no ordering key"}
	wmDefault := &row{Group: "peers", Name: "Watermill SQL v4.0.0, DefaultPostgreSQLSchema (documented default)", Messages: cfg.n, PayloadBytes: cfg.payload,
		Batch: 100, Mode: "in-process",
		Note: fmt.Sprintf("DefaultPostgreSQLSchema + DefaultPostgreSQLOffsetsAdapter (offsets per consumer group, xid8 watermark), SubscribeBatchSize 100, one subscriber; timed for at most %s and rated on what it acked by then", cfg.wmCap)}
	for run := 0; run < cfg.runs; run++ {
		if err := b.riverRun(ctx, river); err != nil {
			b.log.Warn("river run failed", "error", err)
			river.addNote("run %d failed: %v", run+1, shorten(err.Error()))
		}
		if err := b.watermillRun(ctx, wmQueue, true, 10*time.Minute); err != nil {
			b.log.Warn("watermill queue run failed", "error", err)
			wmQueue.addNote("run %d failed: %v", run+1, shorten(err.Error()))
		}
		if err := b.watermillRun(ctx, wmDefault, false, cfg.wmCap); err != nil {
			b.log.Warn("watermill default run failed", "error", err)
			wmDefault.addNote("run %d failed: %v", run+1, shorten(err.Error()))
		}
	}
	for _, r := range []*row{river, wmQueue, wmDefault} {
		r.finish()
		b.rep.add(r)
	}
	return nil
}

type riverArgs struct {
	N int64  `json:"n"`
	P string `json:"p"`
}

func (riverArgs) Kind() string { return "bench" }

type riverWorker struct {
	river.WorkerDefaults[riverArgs]
}

func (riverWorker) Work(context.Context, *river.Job[riverArgs]) error { return nil }

// pad fills the "p" field so that {"n":n,"p":"…"} is size bytes.
func pad(n int64, size int) string {
	return strings.Repeat("x", max(0, size-len(fmt.Sprintf(`{"n":%d,"p":""}`, n))))
}

func (b *bench) riverRun(ctx context.Context, r *row) error {
	schema := fmt.Sprintf("%sriver_%d_%d", schemaPrefix, os.Getpid(), b.seq.Add(1))
	if _, err := b.pool.Exec(ctx, "CREATE SCHEMA "+migrations.Ident(schema)); err != nil {
		return err
	}
	defer b.dropSchema(ctx, schema)
	pool, err := pgxpool.New(ctx, b.cfg.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	mig, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: schema, Logger: quiet})
	if err != nil {
		return err
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Schema:            schema,
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2000}},
		Workers:           workers,
		Logger:            quiet,
	})
	if err != nil {
		return err
	}
	n := b.cfg.n
	start := time.Now()
	const chunk = 5000
	params := make([]river.InsertManyParams, 0, chunk)
	for i := 0; i < n; i += chunk {
		params = params[:0]
		for j := i; j < min(i+chunk, n); j++ {
			params = append(params, river.InsertManyParams{Args: riverArgs{N: int64(j), P: pad(int64(j), b.cfg.payload)}})
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return fmt.Errorf("river insert: %w", err)
		}
	}
	if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+migrations.Ident(schema)+".river_job"); err != nil {
		return err
	}
	b.checkpoint(ctx)
	b.log.Info("river jobs inserted", "jobs", n, "took", time.Since(start).Round(time.Millisecond))

	if note := b.awaitHorizon(ctx); note != "" {
		r.addNote("run %d: %s", len(r.Rates)+1, note)
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: n, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	defer cancel()
	start = time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	defer client.Stop(context.WithoutCancel(ctx)) //nolint:errcheck
	done := 0
	timeout := time.After(10 * time.Minute)
	var last time.Time
	for done < n {
		select {
		case <-events:
			done++
			last = time.Now()
		case <-timeout:
			return fmt.Errorf("river completed %d of %d jobs in 10m", done, n)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	el := last.Sub(start)
	rate := float64(n) / el.Seconds()
	r.addRun(rate, 0)
	b.log.Info("river", "rate", int(rate), "took", el.Round(time.Millisecond))
	return nil
}

// watermillRun publishes n messages into Watermill's Postgres schema and
// times one subscriber acking them, for at most limit.
func (b *bench) watermillRun(ctx context.Context, r *row, queue bool, limit time.Duration) error {
	schema := fmt.Sprintf("%swm_%d_%d", schemaPrefix, os.Getpid(), b.seq.Add(1))
	if _, err := b.pool.Exec(ctx, "CREATE SCHEMA "+migrations.Ident(schema)); err != nil {
		return err
	}
	defer b.dropSchema(ctx, schema)
	pool, err := pgxpool.New(ctx, b.cfg.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	table := func(topic string) string { return migrations.Ident(schema) + `."watermill_` + topic + `"` }
	offsets := func(topic string) string { return migrations.Ident(schema) + `."watermill_offsets_` + topic + `"` }
	var (
		schemaAdapter  wsql.SchemaAdapter
		offsetsAdapter wsql.OffsetsAdapter
	)
	if queue {
		schemaAdapter = wsql.PostgreSQLQueueSchema{GenerateMessagesTableName: table}
		offsetsAdapter = wsql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: true, GenerateMessagesTableName: table}
	} else {
		schemaAdapter = wsql.DefaultPostgreSQLSchema{GenerateMessagesTableName: table}
		offsetsAdapter = wsql.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: offsets}
	}
	logger := watermill.NopLogger{}
	db := wsql.BeginnerFromPgx(pool)
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schemaAdapter, AutoInitializeSchema: true}, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	const topic = "bench"
	n := b.cfg.n
	start := time.Now()
	const chunk = 1000
	msgs := make([]*message.Message, 0, chunk)
	for i := 0; i < n; i += chunk {
		msgs = msgs[:0]
		for j := i; j < min(i+chunk, n); j++ {
			msgs = append(msgs, message.NewMessage(watermill.NewUUID(), payloadGo(int64(j), b.cfg.payload)))
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			return fmt.Errorf("watermill publish: %w", err)
		}
	}
	if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+table(topic)); err != nil {
		return err
	}
	b.checkpoint(ctx)
	b.log.Info("watermill messages published", "queue_schema", queue, "messages", n, "took", time.Since(start).Round(time.Millisecond))

	if note := b.awaitHorizon(ctx); note != "" {
		r.addNote("run %d: %s", len(r.Rates)+1, note)
	}
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter:    schemaAdapter,
		OffsetsAdapter:   offsetsAdapter,
		InitializeSchema: true,
	}, logger)
	if err != nil {
		return err
	}
	defer sub.Close()
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start = time.Now()
	ch, err := sub.Subscribe(subCtx, topic)
	if err != nil {
		return err
	}
	var acked atomic.Int64
	deadline := time.After(limit)
	var last time.Time
loop:
	for acked.Load() < int64(n) {
		select {
		case m, ok := <-ch:
			if !ok {
				return fmt.Errorf("watermill subscription closed after %d messages", acked.Load())
			}
			m.Ack()
			acked.Add(1)
			last = time.Now()
		case <-deadline:
			break loop
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	got := acked.Load()
	if got == 0 {
		return fmt.Errorf("watermill acked nothing in %s", limit)
	}
	el := last.Sub(start)
	rate := float64(got) / el.Seconds()
	r.addRun(rate, 0)
	if got < int64(n) {
		r.addNote("run %d: %d of %d acked in %s", len(r.Rates), got, n, limit)
	}
	b.log.Info("watermill", "queue_schema", queue, "acked", got, "rate", int(rate), "took", el.Round(time.Millisecond))
	return nil
}
