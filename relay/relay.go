// Package relay is the engine of outbox-relay: workers claim committed
// outbox rows, hand them to a sink, and delete what the sink accepted, in
// one transaction per batch ("lock while publishing").
//
// Ordering. Every message belongs to one of 256 lanes (a hash of its key).
// Relay processes lease lanes through the lanes table, each taking a fair
// share; a lane is worked on by one worker of one process at a time, and in
// id order. Messages with the same key therefore reach the sink in the
// order they were written, never concurrently, whatever the number of
// relay processes. A message whose delivery failed waits for its retry in
// the row (attempts, available_at) and holds back the later messages of its
// key, and only of its key.
//
// Failure. A relay that dies mid-batch loses nothing: its transaction
// aborts and the rows are claimable again. Its lanes go to other relays
// when its lease connection is seen closed, or at the latest after LeaseTTL.
// Idle-in-transaction and statement timeouts on the relay's sessions bound
// how long a relay cut off from the database can hold rows.
//
// This package does not parse flags or know any concrete sink.
package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// Relay moves messages from the outbox to a sink.
type Relay struct {
	cfg  Config
	pool *pgxpool.Pool
	sink sinks.Sink
	q    queries
	log  *slog.Logger

	// leftover: this relay reads the outbox, but fan-out copies made for
	// its route under an earlier configuration are still waiting; it
	// delivers them (with copyQ) before it reads the outbox again, so that
	// they are not stranded and each key stays in order.
	leftover atomic.Bool
	copyQ    queries

	// topics and exclude are the route's patterns in LIKE form (nil: no
	// filter).
	topics, exclude []string

	wake     []chan struct{}
	lastLoop []atomic.Int64 // unix nanos of each worker's latest loop turn
	connWait []atomic.Int64 // see starved
	// priority[w]: worker w's last claim saw priority messages in its
	// lanes (only worker w touches it).
	priority  []bool
	ownedLane atomic.Int64
	// leaseOK: when the lease heartbeat last succeeded (unix nanos);
	// unworked: see UnworkedLanes.
	leaseOK, unworked atomic.Int64
	// handover holds lanes this relay is giving up: workers skip them so
	// the leaser can release them at its next heartbeat.
	handover atomic.Pointer[[]int16]
	inFlight atomic.Int64 // claimed messages not yet settled
	// failures since the last "deliveries failing" warning, and when it was
	// logged (unix nanos): a sink outage shows in the logs at the default
	// level without a line per message.
	failures   atomic.Int64
	failWarned atomic.Int64
	draining   atomic.Bool
	// schemaErr is set while the schema needs a newer relay (it was
	// migrated under a running relay): workers claim nothing.
	schemaErr atomic.Pointer[error]
	stats     Stats
}

// Stats are running totals, read with Relay.Stats.
type Stats struct {
	Claimed, Delivered, Retried, DeadLettered, Batches, CommitFailures atomic.Int64
}

// StatsSnapshot is a copy of Stats.
type StatsSnapshot struct {
	Claimed, Delivered, Retried, DeadLettered, Batches, CommitFailures int64
}

// New returns a relay that reads the outbox through pool and publishes to
// sink. The pool needs at least a connection per worker, one for the lane
// lease and, unless SharedListener, one for LISTEN (Conns counts them for
// a whole process); use NewPool to get one with the session settings the
// relay wants.
func New(pool *pgxpool.Pool, sink sinks.Sink, cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if pool == nil || (sink == nil && len(cfg.FanOut) == 0) {
		return nil, errors.New("outbox: relay: pool and sink are required")
	}
	// What this relay holds itself (a shared LISTEN is the caller's: see
	// Conns for a whole process).
	need, what := cfg.Workers+2, "one each, the lane lease and LISTEN"
	if cfg.SharedListener {
		need, what = cfg.Workers+1, "one each and the lane lease"
	}
	if max := int(pool.Config().MaxConns); max < need {
		return nil, fmt.Errorf("outbox: max-conns: %d workers need a pool of at least %d connections (%s), have %d", cfg.Workers, need, what, max)
	}
	r := &Relay{
		cfg:      cfg,
		pool:     pool,
		sink:     sink,
		q:        newQueries(cfg.Schema, cfg.Deliveries),
		copyQ:    newQueries(cfg.Schema, true),
		log:      cfg.Logger.With("relay_id", cfg.ID),
		wake:     make([]chan struct{}, cfg.Workers),
		lastLoop: make([]atomic.Int64, cfg.Workers),
		connWait: make([]atomic.Int64, cfg.Workers),
		priority: make([]bool, cfg.Workers),
	}
	for i := range r.wake {
		r.wake[i] = make(chan struct{}, 1)
		r.priority[i] = true // until the first probe says otherwise
	}
	r.topics = likePatterns(cfg.Topics)
	r.exclude = likePatterns(cfg.ExcludeTopics)
	if cfg.Route != "" {
		r.log = r.log.With("route", cfg.Route)
	}
	return r, nil
}

// ID returns the relay's id.
func (r *Relay) ID() string { return r.cfg.ID }

// OwnedLanes returns how many lanes this relay holds right now.
func (r *Relay) OwnedLanes() int { return int(r.ownedLane.Load()) }

// Draining reports whether Run's context has been cancelled.
func (r *Relay) Draining() bool { return r.draining.Load() }

// Stats returns running totals.
func (r *Relay) Stats() StatsSnapshot {
	return StatsSnapshot{
		Claimed: r.stats.Claimed.Load(), Delivered: r.stats.Delivered.Load(),
		Retried: r.stats.Retried.Load(), DeadLettered: r.stats.DeadLettered.Load(),
		Batches: r.stats.Batches.Load(), CommitFailures: r.stats.CommitFailures.Load(),
	}
}

// Run relays messages until ctx is cancelled, then drains: it stops
// claiming, lets in-flight batches finish (rolling them back after
// DrainTimeout), hands its lanes back and returns nil. It does not close
// the sink or the pool.
func (r *Relay) Run(ctx context.Context) error {
	v, relayMin, err := r.schemaVersion(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started: nothing to drain
		}
		return err
	}
	if err := r.runsOn(v, relayMin); err != nil {
		return err
	}
	if v > migrations.Latest() {
		r.log.Info("schema is newer than this relay, and compatible with it", "schema_version", v, "relay_knows", migrations.Latest())
	}

	// hard is cancelled DrainTimeout after ctx: in-flight work then rolls
	// back instead of holding the shutdown.
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	stopDrainTimer := context.AfterFunc(ctx, func() {
		r.draining.Store(true)
		r.log.Info("draining: no new claims", "drain_timeout", r.cfg.DrainTimeout)
		time.AfterFunc(r.cfg.DrainTimeout, cancelHard)
	})
	defer stopDrainTimer()

	r.log.Info("relay starting", "schema", r.cfg.Schema, "workers", r.cfg.Workers, "batch_size", r.cfg.BatchSize, "batch_bytes", r.cfg.BatchBytes, "archive", r.cfg.Archive)
	if !r.cfg.Deliveries && len(r.cfg.FanOut) == 0 && r.cfg.Route != "" {
		left, err := r.copiesLeft(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("outbox: look for fan-out copies of route %q: %w", r.cfg.Route, err)
		}
		if left {
			r.leftover.Store(true)
			r.log.Warn("fan-out copies made for this route under an earlier configuration are waiting; delivering them before the outbox")
		}
	}
	if r.cfg.Archive {
		// Partitions must exist before the first delivery is archived.
		if err := r.maintainArchive(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		archiveDone := make(chan struct{})
		defer func() { <-archiveDone }()
		go func() {
			defer close(archiveDone)
			t := time.NewTicker(10 * time.Minute)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if err := r.maintainArchive(ctx); err != nil && ctx.Err() == nil {
					r.log.Warn("archive maintenance failed", "error", err)
				}
			}
		}()
	}
	lease := newLeaser(r)
	leaseDone := make(chan struct{})
	go func() {
		defer close(leaseDone)
		lease.run(ctx)
	}()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		r.watchSchema(ctx)
	}()
	defer func() { <-watchDone }()
	listenDone := make(chan struct{})
	go func() {
		defer close(listenDone)
		if !r.cfg.SharedListener {
			Listen(ctx, r.pool, r.cfg.Schema, r.log, r.wakeAll)
		}
	}()

	var wg sync.WaitGroup
	for i := 0; i < r.cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.work(ctx, hard, i)
		}()
	}
	wg.Wait()
	<-listenDone
	<-leaseDone
	// Hand the lanes to the other relays now rather than after LeaseTTL.
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	lease.releaseAll(relCtx)
	s := r.Stats()
	r.log.Info("relay stopped", "delivered", s.Delivered, "retried", s.Retried, "dead_lettered", s.DeadLettered)
	return nil
}

// schemaVersion reads the schema version, waiting up to ConnectTimeout for
// the database to be reachable: a relay started alongside its database (a
// sidecar, a compose stack) should not exit just because it came first.
func (r *Relay) schemaVersion(ctx context.Context) (version, relayMin int, err error) {
	deadline := time.Now().Add(r.cfg.ConnectTimeout)
	bo := newReconnectBackoff()
	for {
		version, relayMin, err = migrations.Requirement(ctx, r.pool, r.cfg.Schema)
		if err == nil {
			return version, relayMin, nil
		}
		d := bo.NextBackOff()
		if ctx.Err() != nil || time.Now().Add(d).After(deadline) {
			return 0, 0, err
		}
		r.log.Warn("database not reachable yet; retrying", "error", err, "retry_in", d)
		sleep(ctx, d)
	}
}

// Live reports whether every worker's loop has turned recently. A worker
// may legitimately spend up to PublishTimeout in the sink plus the
// statement timeouts in the database, so "recently" is generous. It does
// not touch the database.
func (r *Relay) Live() error {
	limit := r.cfg.PublishTimeout + r.cfg.PollInterval + 2*time.Minute
	now := time.Now()
	for i := range r.lastLoop {
		last := r.lastLoop[i].Load()
		if last == 0 {
			continue // not started yet
		}
		if age := now.Sub(time.Unix(0, last)); age > limit {
			return fmt.Errorf("outbox: worker %d stuck for %s", i, age.Round(time.Second))
		}
	}
	return nil
}

// Ready reports whether the relay can do its job right now: not draining,
// its lane lease renewed within the lease TTL, the database reachable, the
// sink healthy (when it can tell). It answers for this relay only: lanes
// of its route that no relay works are reported by UnworkedLanes, not here.
func (r *Relay) Ready(ctx context.Context) error {
	if r.draining.Load() {
		return errors.New("outbox: draining")
	}
	if err := r.schemaErr.Load(); err != nil {
		return *err
	}
	if d, starved := r.starved(); starved {
		return fmt.Errorf("outbox: database: a worker has had no connection for %s (its lanes are handed to other relays)", d.Round(time.Second))
	}
	if err := r.leaseHealthy(); err != nil {
		return err
	}
	var readOnly bool
	if err := r.pool.QueryRow(ctx, `SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool`).Scan(&readOnly); err != nil {
		return fmt.Errorf("outbox: database: %w", err)
	}
	if readOnly {
		return errors.New("outbox: database: read-only (a standby, or default_transaction_read_only is on)")
	}
	if hc, ok := r.sink.(sinks.HealthChecker); ok {
		if err := hc.Healthy(ctx); err != nil {
			return fmt.Errorf("outbox: sink: %w", err)
		}
	}
	return nil
}

func (r *Relay) wakeAll() {
	for _, c := range r.wake {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// Wake makes every worker look for work now (as a notification does).
func (r *Relay) Wake() { r.wakeAll() }

// Listen calls wake on every NOTIFY from writers to schema's outbox (and
// from the fan-out router), until ctx ends. A relay runs it itself unless
// Config.SharedListener is set: a process running several relays (one per
// route) saves a connection per relay by running one Listen that wakes
// them all. Notifications are an optimization: workers poll anyway, so a
// lost connection only costs latency until it is back.
func Listen(ctx context.Context, pool *pgxpool.Pool, schema string, log *slog.Logger, wake func()) {
	if log == nil {
		log = slog.Default()
	}
	channel := pgx.Identifier{migrations.Channel(schema)}.Sanitize()
	bo := newReconnectBackoff()
	for ctx.Err() == nil {
		err := func() error {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			// The connection carries LISTEN state: never give it back to
			// the pool (but keep it counted there, see dropConn).
			defer dropConn(context.WithoutCancel(ctx), conn)
			pc := conn.Conn()
			if _, err := pc.Exec(ctx, "LISTEN "+channel); err != nil {
				return err
			}
			bo.Reset()
			wake() // anything written while we were not listening
			for {
				if _, err := pc.WaitForNotification(ctx); err != nil {
					return err
				}
				wake()
			}
		}()
		if ctx.Err() != nil {
			return
		}
		d := bo.NextBackOff()
		log.Warn("listen connection lost; polling until it is back", "error", err, "retry_in", d)
		sleep(ctx, d)
	}
}

// work is one worker's loop.
func (r *Relay) work(ctx, hard context.Context, worker int) {
	log := r.log.With("worker", worker)
	bo := newReconnectBackoff()
	rotation := worker
	for ctx.Err() == nil {
		r.lastLoop[worker].Store(time.Now().UnixNano())
		if r.schemaErr.Load() != nil {
			// Claim nothing on a schema this relay does not know.
			sleep(ctx, r.cfg.PollInterval)
			continue
		}
		n, err := r.cycle(ctx, hard, worker, rotation)
		rotation = (rotation + r.cfg.Workers) % numLanes
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := bo.NextBackOff()
			if errors.Is(err, errNothingAttempted) {
				// The sink could not reach its backend (it wrote nothing):
				// the next cycle is the probe, and a backend that is back
				// should not wait the database's reconnect pace.
				d = min(d, time.Second)
			}
			log.Warn("batch failed; retrying", "error", err, "retry_in", d)
			if ch, ok := r.cfg.Hooks.(CycleErrorHooks); ok {
				ch.CycleError(err)
			}
			sleep(ctx, d)
			continue
		}
		bo.Reset()
		if n == 0 && r.leftover.Load() {
			// Nobody makes copies for this route any more: once none are
			// left, none will appear.
			if left, err := r.copiesLeft(ctx); err == nil && !left && r.leftover.CompareAndSwap(true, false) {
				log.Info("earlier fan-out copies all delivered; reading the outbox")
				r.wakeAll() // the other workers may be idle until their next poll
				continue
			}
		}
		if n >= r.cfg.BatchSize {
			continue // likely more waiting
		}
		if n > 0 {
			// Others may be waiting in lanes this claim did not reach.
			continue
		}
		t := time.NewTimer(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-r.wake[worker]:
		case <-t.C:
		}
		t.Stop()
	}
}

// errNothingAttempted: the sink tried none of a batch's messages and
// reported no failure (its backend unreachable, or a broken sink).
var errNothingAttempted = errors.New("outbox: sink attempted nothing")

// claimed is one claimed row.
type claimed struct {
	msg      sinks.Message
	attempts int
	ctid     pgtype.TID
}

// cycle claims one batch, publishes it and settles the outcome, all in one
// transaction. It returns how many messages it claimed.
func (r *Relay) cycle(ctx, hard context.Context, worker, rotation int) (_ int, err error) {
	start := time.Now()
	r.waitingForConn(worker)
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		// Still without a connection (through the backoff too): see
		// starved.
		return 0, fmt.Errorf("outbox: acquire connection: %w", err)
	}
	r.gotConn(worker)
	defer func() {
		// A session that cannot write (it started on a read-only or
		// standby server) stays that way: close it so that the pool opens
		// a new one instead of handing it out again.
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "25006" {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
		conn.Release()
	}()
	// From here on the batch belongs to the hard context: a drain lets it
	// finish. BEGIN and the claim go out in one round trip, as do the
	// settle statements and COMMIT below.
	handover := []int16{}
	if h := r.handover.Load(); h != nil && *h != nil {
		handover = *h
	}
	pc := conn.Conn()
	committed := false
	defer func() {
		if !committed && !pc.IsClosed() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(hard), 5*time.Second)
			if _, rerr := pc.Exec(rctx, "ROLLBACK"); rerr != nil {
				// The session's state is unknown: do not reuse it.
				_ = pc.Close(rctx)
			}
			cancel()
		}
	}()
	// The priority probe rides along with every claim; what it finds
	// chooses the claim of the worker's next cycle (the one with a
	// priority phase costs more, so it runs only while there are priority
	// messages).
	// The fan-out router copies in id order whatever the priority (the
	// destinations' claims honour it).
	router := len(r.cfg.FanOut) > 0
	q, copies, topics, exclude := &r.q, r.cfg.Deliveries, r.topics, r.exclude
	if r.leftover.Load() {
		// Every copy made for this route is this route's, whatever its
		// patterns say now.
		q, copies, topics, exclude = &r.copyQ, true, nil, nil
	}
	claim := q.claim
	switch {
	case router:
		claim = q.routerClaim
	case r.priority[worker]:
		claim = q.claimPriority
	}
	cb := &pgx.Batch{}
	cb.Queue("BEGIN")
	if !router {
		probe := []any{r.cfg.Workers, worker, topics, exclude}
		if copies {
			probe = append(probe, r.cfg.Route)
		}
		cb.Queue(q.hasPriority, probe...)
	}
	args := []any{r.cfg.ID, r.cfg.Workers, worker, rotation, r.cfg.BatchSize,
		r.cfg.Route, topics, exclude, handover}
	if !router {
		// The router reads no payloads: it has no byte limit.
		args = append(args, r.cfg.BatchBytes)
	}
	cb.Queue(claim, args...)
	br := pc.SendBatch(hard, cb)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return 0, fmt.Errorf("outbox: begin: %w", err)
	}
	if !router {
		if err := br.QueryRow().Scan(&r.priority[worker]); err != nil {
			br.Close()
			return 0, fmt.Errorf("outbox: claim: priority probe: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		return 0, fmt.Errorf("outbox: claim: %w", err)
	}
	batch := make([]claimed, 0, r.cfg.BatchSize)
	var dbNow time.Time
	var headers []byte
	var createdAt pgtype.Timestamptz
	for rows.Next() {
		var c claimed
		m := &c.msg
		if err := rows.Scan(&m.Seq, &m.ID, &m.Topic, &m.Key, &m.Payload, &headers, &createdAt, &c.attempts, &dbNow, &c.ctid); err != nil {
			rows.Close()
			br.Close()
			return 0, fmt.Errorf("outbox: claim: scan: %w", err)
		}
		// A created_at of ±infinity (only ever written by hand) is
		// delivered as the claim's time.
		m.CreatedAt = finiteTime(createdAt, dbNow)
		if m.Headers, err = decodeHeaders(headers); err != nil {
			rows.Close()
			br.Close()
			return 0, fmt.Errorf("outbox: claim: headers of message %d: %w", m.Seq, err)
		}
		m.Attempt = c.attempts + 1
		m.ClaimedAt = dbNow
		batch = append(batch, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		br.Close()
		return 0, fmt.Errorf("outbox: claim: %w", err)
	}
	if err := br.Close(); err != nil {
		return 0, fmt.Errorf("outbox: claim: %w", err)
	}
	claimDur := time.Since(start)
	if len(batch) == 0 {
		if _, err := pc.Exec(hard, "COMMIT"); err != nil {
			return 0, fmt.Errorf("outbox: commit: %w", err)
		}
		committed = true
		return 0, nil
	}
	r.stats.Claimed.Add(int64(len(batch)))
	if router {
		err := r.fanOut(hard, pc, batch)
		committed = err == nil
		return len(batch), err
	}
	r.inFlight.Add(int64(len(batch)))
	defer r.inFlight.Add(-int64(len(batch)))

	msgs := make([]sinks.Message, len(batch))
	for i := range batch {
		msgs[i] = batch[i].msg
	}
	sendStart := time.Now()
	sendCtx, cancel := context.WithTimeout(hard, r.cfg.PublishTimeout)
	sendErr := r.sink.Send(sendCtx, msgs)
	cancel()
	sendDur := time.Since(sendStart)
	// The claim ran at dbNow (database clock), roughly at start.
	ackedAt := dbNow.Add(time.Since(start))
	if hard.Err() != nil {
		// Drain deadline passed mid-publish: roll back so the messages come
		// back untouched (some may be delivered twice, never lost).
		return len(batch), fmt.Errorf("outbox: drain timeout during publish: batch rolled back: %w", hard.Err())
	}

	ev := BatchEvent{Worker: worker, Claimed: len(batch), Messages: msgs, ClaimDuration: claimDur,
		SendStart: sendStart, SendDuration: sendDur, SendErr: sendErr, AckedAt: ackedAt}
	s := r.settle(batch, sendErr, &ev)
	if ev.Untouched == len(batch) {
		// The sink tried nothing and reported no failure (it broke off, or
		// breaks the contract): claiming the same batch again at once would
		// spin. Release it and let the worker back off.
		return len(batch), fmt.Errorf("%w: none of %d messages: %w", errNothingAttempted, len(batch), sendErr)
	}

	settleStart := time.Now()
	b := &pgx.Batch{}
	r.queue(b, q, copies, s)
	b.Queue("COMMIT")
	err = pc.SendBatch(hard, b).Close()
	if refusedRow(err) {
		r.log.Warn("the database refused to settle the batch; settling its messages one by one", "messages", len(batch), "error", err)
		s, err = r.settleApart(hard, pc, q, copies, s)
		ev.Delivered, ev.Retried, ev.DeadLettered, ev.DeadReasons = len(s.delivered), len(s.retryIDs), len(s.deadIDs), s.deadReasons
	}
	committed = err == nil
	ev.SettleDuration = time.Since(settleStart)
	ev.Committed = err == nil
	r.stats.Batches.Add(1)
	if err != nil {
		r.stats.CommitFailures.Add(1)
		r.cfg.Hooks.Batch(ev)
		return len(batch), fmt.Errorf("outbox: settle batch of %d (%d delivered messages will be delivered again): %w", len(batch), len(s.delivered), err)
	}
	if failed := len(s.retryIDs) + len(s.deadIDs); failed > 0 {
		r.warnFailing(failed, sendErr)
	}
	r.stats.Delivered.Add(int64(len(s.delivered)))
	r.stats.Retried.Add(int64(len(s.retryIDs)))
	r.stats.DeadLettered.Add(int64(len(s.deadIDs)))
	r.cfg.Hooks.Batch(ev)
	return len(batch), nil
}

// withRoute appends the route to a settle statement's arguments when the
// relay works on fan-out copies (their statements also match the route).
func (r *Relay) withRoute(copies bool, args ...any) []any {
	if copies {
		return append(args, r.cfg.Route)
	}
	return args
}

// copiesLeft reports whether fan-out copies for this relay's route exist.
func (r *Relay) copiesLeft(ctx context.Context) (bool, error) {
	var left bool
	err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+migrations.Ident(r.cfg.Schema)+`.deliveries WHERE route = $1)`,
		r.cfg.Route).Scan(&left)
	return left, err
}

// fanOut is the router's settle: each claimed message is copied to its
// destination routes and leaves the outbox, in the claim's transaction
// (so a crash copies nothing, and a copy is never made twice). A message
// no destination takes (the routes changed under it) is dead-lettered.
func (r *Relay) fanOut(ctx context.Context, pc *pgx.Conn, batch []claimed) error {
	var ids []int64
	var routes []string
	var tids []pgtype.TID
	var deadIDs []int64
	var deadReasons, deadErrs []string
	for _, c := range batch {
		n := len(ids)
		for _, d := range r.cfg.FanOut {
			if d.matches(c.msg.Topic) {
				ids = append(ids, c.msg.Seq)
				routes = append(routes, d.Route)
			}
		}
		if len(ids) == n {
			deadIDs = append(deadIDs, c.msg.Seq)
			deadReasons = append(deadReasons, ReasonPermanent)
			deadErrs = append(deadErrs, fmt.Sprintf("no route matches topic %q", c.msg.Topic))
			continue
		}
		tids = append(tids, c.ctid)
	}
	b := &pgx.Batch{}
	if len(ids) > 0 {
		b.Queue(r.q.copyToRoutes, ids, routes, tids)
		b.Queue(r.q.deleteDelivered, tids)
	}
	if len(deadIDs) > 0 {
		b.Queue(r.q.deadLetter, deadIDs, deadReasons, deadErrs)
	}
	b.Queue("COMMIT")
	r.stats.Batches.Add(1)
	if err := pc.SendBatch(ctx, b).Close(); err != nil {
		r.stats.CommitFailures.Add(1)
		return fmt.Errorf("outbox: fan-out of %d messages: %w", len(batch), err)
	}
	r.stats.Delivered.Add(int64(len(tids)))
	r.stats.DeadLettered.Add(int64(len(deadIDs)))
	return nil
}

// warnFailing logs at most one warning per interval about failing
// deliveries, with the count since the previous one and a sample error.
func (r *Relay) warnFailing(n int, sample error) {
	const every = 30 * time.Second
	total := r.failures.Add(int64(n))
	now := time.Now().UnixNano()
	last := r.failWarned.Load()
	if now-last < int64(every) || !r.failWarned.CompareAndSwap(last, now) {
		return
	}
	r.failures.Add(-total)
	if last == 0 {
		r.log.Warn("deliveries failing", "failed", total, "error", sample)
		return
	}
	r.log.Warn("deliveries failing", "failed", total, "since", time.Duration(now-last).Round(time.Second).String(), "error", sample)
}

// decodeHeaders decodes a jsonb headers value; "{}" (the common case)
// costs nothing.
func decodeHeaders(raw []byte) (map[string]string, error) {
	if len(raw) <= 2 {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, err
	}
	return h, nil
}

// errText bounds what is stored of an error.
func errText(err error) string {
	const max = 2000
	s := err.Error()
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

func defaultID() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "relay"
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// likePatterns turns glob patterns ('*' any run, '?' one character) into
// LIKE patterns with '\' as the escape character. nil stays nil (no
// filter).
func likePatterns(globs []string) []string {
	if len(globs) == 0 {
		return nil
	}
	out := make([]string, len(globs))
	for i, g := range globs {
		var b strings.Builder
		for _, c := range g {
			switch c {
			case '\\', '%', '_':
				b.WriteByte('\\')
				b.WriteRune(c)
			case '*':
				b.WriteByte('%')
			case '?':
				b.WriteByte('_')
			default:
				b.WriteRune(c)
			}
		}
		out[i] = b.String()
	}
	return out
}

// MatchTopic reports whether topic matches the glob pattern the way a
// route's Topics do.
func MatchTopic(pattern, topic string) bool {
	if pattern == "" {
		return topic == ""
	}
	switch pattern[0] {
	case '*':
		for i := 0; i <= len(topic); i++ {
			if MatchTopic(pattern[1:], topic[i:]) {
				return true
			}
		}
		return false
	case '?':
		if topic == "" {
			return false
		}
		_, n := utf8.DecodeRuneInString(topic)
		return MatchTopic(pattern[1:], topic[n:])
	}
	if topic == "" {
		return false
	}
	pr, pn := utf8.DecodeRuneInString(pattern)
	tr, tn := utf8.DecodeRuneInString(topic)
	return pr == tr && MatchTopic(pattern[pn:], topic[tn:])
}

// PatternsOverlap reports whether some topic matches both glob patterns
// (as MatchTopic reads them): whether two routes can ever take the same
// message.
func PatternsOverlap(a, b string) bool {
	x, y := []rune(a), []rune(b)
	// seen[i][j]: the suffixes x[i:], y[j:] were already explored.
	seen := make([][]bool, len(x)+1)
	for i := range seen {
		seen[i] = make([]bool, len(y)+1)
	}
	var walk func(i, j int) bool
	walk = func(i, j int) bool {
		if seen[i][j] {
			return false
		}
		seen[i][j] = true
		switch {
		case i == len(x) && j == len(y):
			return true
		case i < len(x) && x[i] == '*':
			// The star matches nothing more, or swallows y's next character
			// (or y's star: both stars then still match anything).
			return walk(i+1, j) || (j < len(y) && walk(i, j+1))
		case j < len(y) && y[j] == '*':
			return walk(i, j+1) || (i < len(x) && walk(i+1, j))
		case i == len(x) || j == len(y):
			return false
		case x[i] == '?' || y[j] == '?' || x[i] == y[j]:
			return walk(i+1, j+1)
		}
		return false
	}
	return walk(0, 0)
}
