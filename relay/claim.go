package relay

import (
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/relay/internal/claim"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// source is where a worker's claims come from, and the statements that
// settle them: the outbox itself, the fan-out copies of this relay's
// route (the deliveries table), or, for the fan-out router, the outbox
// without payloads. New chooses it once; the only switch at run time is
// to the leftover copies (see Relay.leftover).
type source struct {
	*store.Engine
	// topics and exclude are the route's patterns in LIKE form (nil: no
	// filter).
	topics, exclude []string
}

// router reports whether the claimed rows are copied to their destination
// routes instead of published.
func (s *source) router() bool { return s.Source() == store.Router }

// newSources renders the relay's source, and the one for the fan-out
// copies that an earlier configuration left for its route.
func newSources(schema store.Schema, cfg Config) (main, leftover *source) {
	kind := store.Outbox
	switch {
	case len(cfg.fanOut) > 0:
		kind = store.Router
	case cfg.deliveries:
		kind = store.Copies
	}
	main = &source{Engine: store.NewEngine(schema, kind, cfg.Route, cfg.OnDeadLetter == OnDeadLetterHold),
		topics: likePatterns(cfg.Topics), exclude: likePatterns(cfg.ExcludeTopics)}
	// Every copy made for this route is this route's, whatever its
	// patterns say now: no topic filter.
	leftover = &source{Engine: store.NewEngine(schema, store.Copies, cfg.Route, cfg.OnDeadLetter == OnDeadLetterHold)}
	return main, leftover
}

// source returns the source of the next claim.
func (r *Relay) source() *source {
	if r.leftover.Load() {
		return r.leftoverSrc
	}
	return r.src
}

// claimRows begins the batch's transaction on pc (or goes on in the
// parked batch's, see worker.chain) and claims up to BatchSize rows (and
// BatchBytes of payload) from src, in the lanes of the worker (its
// rotation chooses the first lane, handover are lanes no longer to be
// claimed). BEGIN, the priority probe and the claim go out in one round
// trip, after what cb already holds (the settlement of the session's
// previous batch, see worker.parked). The transaction stays open: the
// caller settles and commits it.
//
// more says whether the worker's lanes may hold deliverable messages this
// claim left behind: it is full, it may have taken a whole lane's share
// (laneLimit), the byte limit cut it, or it ran with the priority phase
// (which takes only the priority keys' messages when there are some).
// Otherwise the claim visited every lane of the worker and took all it
// found.
//
// cut says the byte limit cut the batch: the transaction then also holds
// rows it did not return, whose lanes may not be among the batch's.
//
// a says which lanes, how many rows, and whether the claim goes on in
// the transaction of the batch it settles (see claimArgs).
func (w *worker) claimRows(pc *pgx.Conn, cb *pgx.Batch, src *source, a claimArgs) (_ []claim.Row, more, cut bool, _ error) {
	r, hard := w.r, w.hard
	limit := a.limit
	partial := w.priority
	found := 0
	if !a.chained {
		cb.Queue(store.Begin)
	}
	// What the probe finds chooses the claim of the worker's next cycle
	// (the one with a priority phase costs more, so it runs only while
	// there are priority messages).
	// Room for a small claim: at middle rates a claim takes tens of rows,
	// and a whole batch's worth for each (some 85 KB at 500) was most of
	// the relay's garbage (its CPU beside 16 writers: −15 %).
	batch := make([]claim.Row, 0, min(limit, 64))
	laneLimit := min(r.laneLimit, limit)
	src.QueueClaim(cb, store.ClaimParams{
		Relay: r.cfg.ID, Workers: r.cfg.Workers, Worker: w.id, Rotation: w.rotation,
		Limit: limit, LaneLimit: laneLimit, MaxBytes: r.cfg.BatchBytes, MaxMessage: r.cfg.MaxMessageBytes,
		Topics: src.topics, Exclude: src.exclude, Handover: a.skip, Only: a.only,
		Priority: w.priority, Settings: r.claimSettings,
		// A claim of the lanes wake-ups named: the worker's claims of
		// all its lanes (at least every fullEvery while it is woken, and
		// every claim of a backlog) probe for priorities.
		NoProbe: !a.probe && !w.priority,
		Session: r.claimSettings == "" && store.ClaimsPrepared(pc),
		Settle:  a.settle,
	}, &w.priority, func(row store.ClaimedRow) error {
		headers, err := decodeHeaders(row.Headers)
		if err != nil {
			return fmt.Errorf("headers of message %d: %w", row.Seq, err)
		}
		headers = r.producer.named(headers)
		found = row.Found
		var oversize int64
		if row.Size > r.cfg.MaxMessageBytes {
			oversize = row.Size
		}
		batch = append(batch, claim.Row{Attempts: row.Attempts, CTID: row.CTID, Lane: row.Lane, Oversize: oversize, Msg: sinks.Message{
			Seq: row.Seq, ID: row.ID, Topic: row.Topic, Key: row.Key, Payload: row.Payload, Headers: headers,
			// A created_at of ±infinity (only ever written by hand) is
			// delivered as the claim's time.
			CreatedAt: finiteTime(row.CreatedAt, row.ClaimedAt),
			Attempt:   row.Attempts + 1, ClaimedAt: row.ClaimedAt,
		}})
		return nil
	})
	if err := pc.SendBatch(hard, cb).Close(); err != nil {
		return nil, false, false, fmt.Errorf("outbox: claim: %w", err)
	}
	n := len(batch)
	return batch, n >= laneLimit || found > n || (partial && n > 0), found > n, nil
}

// claimArgs are a claim's arguments besides its source.
type claimArgs struct {
	// limit is the most rows claimed.
	limit int
	// skip are lanes not to claim: those being handed over, and those of
	// the worker's batches in flight. only, unless nil, are the only
	// lanes visited.
	skip, only []int16
	// probe: the claim probes for priority messages (see
	// store.ClaimParams.NoProbe).
	probe bool
	// chained: the claim goes on in the open transaction of the worker's
	// parked batch (no BEGIN), and deletes settle, that batch's rows, in
	// its statement (see worker.chain).
	chained bool
	settle  []pgtype.TID
}

// keySerialLanes: a sink that sends a key's messages one round trip after
// another gets batches drawn from at least this many lanes (unless it
// asks for more: sinks.BatchLanes) when the backlog allows (1,000 keys
// spread over 256 lanes: about 4 keys a lane, so some 32 keys a batch
// instead of 4). Measured against whole lanes,
// alternated in one session: NATS strict +8 to +17 %; RabbitMQ and
// webhooks within the bench's noise (docs/benchmarks.md).
const keySerialLanes = 8
