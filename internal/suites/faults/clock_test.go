package faults

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// clockTracer records every statement a pool runs, with the Go types of
// its arguments.
type clockTracer struct {
	mu    sync.Mutex
	stmts []tracedStmt
}

type tracedStmt struct {
	sql  string
	args []any
}

func (c *clockTracer) add(sql string, args []any) {
	c.mu.Lock()
	c.stmts = append(c.stmts, tracedStmt{sql: sql, args: append([]any(nil), args...)})
	c.mu.Unlock()
}

func (c *clockTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.add(d.SQL, d.Args)
	return ctx
}
func (c *clockTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *clockTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (c *clockTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.add(d.SQL, d.Args)
}
func (c *clockTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// timeArgs lists the statements that passed a point in time taken from the
// relay's clock to the database.
func (c *clockTracer) timeArgs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	timeTypes := map[reflect.Type]bool{
		reflect.TypeOf(time.Time{}): true, reflect.TypeOf(pgtype.Timestamptz{}): true,
		reflect.TypeOf(pgtype.Timestamp{}): true, reflect.TypeOf(pgtype.Date{}): true,
	}
	var bad []string
	for _, s := range c.stmts {
		for i, a := range s.args {
			t := reflect.TypeOf(a)
			for t != nil && t.Kind() == reflect.Pointer {
				t = t.Elem()
			}
			if t != nil && timeTypes[t] {
				bad = append(bad, fmt.Sprintf("arg $%d (%T) of %s", i+1, a, oneLine(s.sql)))
			}
		}
	}
	return bad
}

func (c *clockTracer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.stmts)
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}

// attemptSeen is the database's view of one delivery attempt.
type attemptSeen struct {
	dbNow       time.Time  // database clock when the sink got the message
	availableAt *time.Time // the row's available_at at that moment
}

// TestClockSkewRetrySchedule: the relay must schedule retries on the
// database's clock, so that a relay host whose clock is off (or several
// relays whose clocks disagree) retries neither early nor late.
//
// The process clock cannot be moved: libfaketime's LD_PRELOAD does not
// reach Go programs, which read the clock through the vDSO, not libc
// (`faketime -f +1h` on a Go binary prints the real time; see
// docs/guarantees.md). So the test proves the property directly:
//   - no statement the relay sends carries a time taken from its own clock
//     (every argument of every query is traced);
//   - the stored delay, available_at - first_failed_at, both computed by the
//     database, is the configured backoff;
//   - each retry happens at or after the stored available_at and within a
//     poll interval of it, measured on the database clock.
func TestClockSkewRetrySchedule(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Schema(t)
	ctx := context.Background()
	cfg := relay.Config{
		Schema: schema, Workers: 1, MaxAttempts: 10, PollInterval: 50 * time.Millisecond,
		RetryInitial: time.Second, RetryMultiplier: 2, RetryMax: time.Minute, RetryJitter: 0.2,
	}

	pc, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	tracer := &clockTracer{}
	pc.ConnConfig.Tracer = tracer
	pc.MaxConns = 4
	rpool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	defer rpool.Close()

	var mu sync.Mutex
	seen := map[string][]attemptSeen{} // by payload
	slowFail := map[string]time.Duration{}
	fails := map[string]int{}
	sink := memory.New()
	sink.SetFail(func(m sinks.Message) error {
		var a attemptSeen
		if err := pool.QueryRow(ctx, `SELECT clock_timestamp(), (SELECT available_at FROM `+migrations.Ident(schema)+`.messages WHERE id = $1)`,
			m.Seq).Scan(&a.dbNow, &a.availableAt); err != nil {
			return fmt.Errorf("test: %w", err)
		}
		p := string(m.Payload)
		mu.Lock()
		seen[p] = append(seen[p], a)
		n, d := len(seen[p]), slowFail[p]
		want := fails[p]
		mu.Unlock()
		if n <= want {
			// A send that takes sendTakes before failing is part of the
			// subject: where the backoff counts from.
			time.Sleep(d)
			return errors.New("test: refused")
		}
		return nil
	})
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := relay.New(rpool, sink, cfg.WithDefaults())
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { cancel(); require.NoError(t, <-done); require.NoError(t, sink.Close(ctx)) }()

	deliver := func(payload string, failures int, sendTakes time.Duration) []attemptSeen {
		mu.Lock()
		fails[payload], slowFail[payload] = failures, sendTakes
		mu.Unlock()
		commit(t, pool, schema, []outbox.Message{{Topic: "t", Key: payload, Payload: []byte(payload)}})
		eventually(t, 30*time.Second, 10*time.Millisecond, func() (bool, string) {
			for _, m := range sink.Delivered() {
				if string(m.Payload) == payload {
					return true, ""
				}
			}
			return false, payload + " not delivered"
		})
		mu.Lock()
		defer mu.Unlock()
		return append([]attemptSeen(nil), seen[payload]...)
	}

	// Two failures, then success: delays ~1s then ~2s (±20%).
	as := deliver("fast-failures", 2, 0)
	require.Len(t, as, 3)
	for i := 1; i < len(as); i++ {
		require.NotNil(t, as[i].availableAt, "attempt %d: the row had no available_at", i+1)
		late := as[i].dbNow.Sub(*as[i].availableAt)
		gap := as[i].dbNow.Sub(as[i-1].dbNow)
		lo, hi := minDelay(cfg, i), time.Duration(float64(minDelay(cfg, i))/(1-cfg.RetryJitter)*(1+cfg.RetryJitter))
		t.Logf("attempt %d: %s after attempt %d (backoff %s..%s); %s after available_at (database clock)",
			i+1, gap.Round(time.Millisecond), i, lo, hi, late.Round(time.Millisecond))
		require.GreaterOrEqual(t, late, time.Duration(0), "attempt %d came before available_at", i+1)
		require.Less(t, late, cfg.PollInterval+time.Second, "attempt %d came late", i+1)
		require.GreaterOrEqual(t, gap, lo-50*time.Millisecond, "attempt %d: retried before the backoff", i+1)
		require.Less(t, gap, hi+time.Second, "attempt %d: retried long after the backoff", i+1)
	}

	// The stored schedule is the database's arithmetic: check it on a row
	// that has failed once and waits (the sink keeps failing it).
	mu.Lock()
	fails["waiting"] = 100
	mu.Unlock()
	commit(t, pool, schema, []outbox.Message{{Topic: "t", Key: "waiting", Payload: []byte("waiting")}})
	var delay time.Duration
	eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		var d pgtype.Interval
		err := pool.QueryRow(ctx, `SELECT available_at - first_failed_at FROM `+migrations.Ident(schema)+`.messages
			WHERE payload = 'waiting' AND attempts = 1`).Scan(&d)
		if err != nil {
			return false, err.Error()
		}
		delay = time.Duration(d.Microseconds) * time.Microsecond
		return true, ""
	})
	require.GreaterOrEqual(t, delay, minDelay(cfg, 1), "stored delay")
	require.LessOrEqual(t, delay, time.Duration(float64(cfg.RetryInitial)*(1+cfg.RetryJitter)), "stored delay")

	// A failure that takes longer than the backoff (a timeout, say).
	slow := deliver("slow-failure", 1, 1500*time.Millisecond)
	require.Len(t, slow, 2)
	sendEnd := slow[0].dbNow.Add(1500 * time.Millisecond)
	effective := slow[1].dbNow.Sub(sendEnd)
	stored := slow[1].availableAt.Sub(sendEnd)
	t.Logf("a failed Send that took 1.5s with a 1s backoff: retried %s after the failure (available_at was %s after the failure)",
		effective.Round(time.Millisecond), stored.Round(time.Millisecond))
	require.GreaterOrEqual(t, effective, minDelay(cfg, 1),
		"the backoff must count from the failure, not from the claim (scheduleRetry uses now(), the transaction start)")

	bad := tracer.timeArgs()
	require.Empty(t, bad, "the relay sent times from its own clock to the database")
	t.Logf("%d statements traced, none carried a time from the relay's clock; stored delay after 1 failure %s (backoff 1s ±20%%)",
		tracer.count(), delay.Round(time.Millisecond))
}

// TestClockSkewSinkTimestamps: the times a sink puts on the wire must come
// from the database, so that a relay host whose clock is off (which this
// process cannot fake, see TestClockSkewRetrySchedule) changes nothing.
// The sinks themselves are tested against a skewed host clock
// (sinks/kafkasink TestRelayClockSkewRecordTimestamp, sinks/httpsink
// TestRelayClockSkewWebhookTimestamp); this test checks what the relay
// hands them:
//   - every message carries ClaimedAt, the database's now() at claim, lying
//     between the row's created_at and the database's clock during Send;
//   - end to end through the Kafka sink, each record's timestamp is the
//     row's created_at as stored in the database.
func TestClockSkewSinkTimestamps(t *testing.T) {
	t.Parallel()
	t.Run("ClaimedAt", func(t *testing.T) {
		t.Parallel()
		pool, schema := pgtest.Schema(t)
		ctx := context.Background()
		type seen struct{ created, claimed, dbAtSend time.Time }
		var mu sync.Mutex
		got := map[string]seen{}
		sink := memory.New()
		sink.SetFail(func(m sinks.Message) error {
			var now time.Time
			if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
				return fmt.Errorf("test: %w", err)
			}
			mu.Lock()
			got[string(m.Payload)] = seen{m.CreatedAt, m.ClaimedAt, now}
			mu.Unlock()
			return nil
		})
		runInproc(t, pgtest.URL(), schema, sink, relay.Config{Workers: 2})
		written := commit(t, pool, schema, messages("t", keyNames("k", 5), 0, 50, nil))
		eventually(t, 20*time.Second, 10*time.Millisecond, func() (bool, string) {
			n := len(sink.Delivered())
			return n >= len(written), fmt.Sprintf("%d of %d delivered", n, len(written))
		})
		mu.Lock()
		defer mu.Unlock()
		for _, p := range written {
			s := got[p]
			require.False(t, s.claimed.IsZero(), "%s: the relay did not fill ClaimedAt", p)
			require.False(t, s.claimed.Before(s.created), "%s: claimed %s before it was created %s", p, s.claimed, s.created)
			require.False(t, s.claimed.After(s.dbAtSend), "%s: claimed %s after the database's clock at Send %s", p, s.claimed, s.dbAtSend)
		}
	})
	t.Run("KafkaRecordTimestamp", func(t *testing.T) {
		t.Parallel()
		pool, schema := pgtest.Schema(t)
		ctx := context.Background()
		k := newKafkaRig(t, []string{"orders"})
		written := commit(t, pool, schema, messages("orders", keyNames("k", 5), 0, 50, nil))
		created := map[string]time.Time{}
		rows, err := pool.Query(ctx, `SELECT payload, created_at FROM `+migrations.Ident(schema)+`.messages`)
		require.NoError(t, err)
		for rows.Next() {
			var p []byte
			var at time.Time
			require.NoError(t, rows.Scan(&p, &at))
			created[string(p)] = at
		}
		require.NoError(t, rows.Err())
		require.Len(t, created, len(written))

		runInproc(t, pgtest.URL(), schema, k.sink(t, nil), relay.Config{Workers: 2})
		eventually(t, 20*time.Second, 10*time.Millisecond, func() (bool, string) {
			n := distinct(k.deliveries())
			return n >= len(written), fmt.Sprintf("%d of %d delivered", n, len(written))
		})
		for p, ts := range k.timestamps() {
			want := created[p].Truncate(time.Millisecond)
			require.True(t, want.Equal(ts), "%s: record timestamp %s, created_at %s", p, ts, want)
		}
	})
}
