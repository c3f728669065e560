package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
)

// The live group's floors: the least a process can do to deliver a
// trickle within a few milliseconds costs per message, measured in the
// relay's place under the same writers. The bench binary runs itself as
// the floor's child process (the floor's env variable set), followed as
// the relay is: its own CPU, and that of its database sessions, which
// carry the relay's application_name.
//
// Floor A polls: every floorInterval the raw-SQL yardstick's statement
// (one DELETE … RETURNING of up to 500 rows in id order, in autocommit:
// one round trip, no lanes, no order, no sink), on one connection. Floor
// B follows the WAL (livefloorwal.go). Where the relay polls, its rows at
// floorRates are divided by floor A's; where it follows the WAL, by floor
// B's: what remains is the relay's own cost, the rest is what any process
// that keeps the latency pays (issue 49).

// floorInterval is floor A's poll interval: a p99 within 10 ms needs
// looks about 5 ms apart.
const floorInterval = 5 * time.Millisecond

// floorRates are the rates of the floor rows.
var floorRates = []float64{100, 1000}

// floor is one kind of floor row.
type floor struct {
	id   string // as issue 49 names it: A (polling) or B (the WAL)
	env  string // set (to the outbox's schema), runs the bench binary as this floor
	name string // the rows' name
	sink string // the rows' sink column
	note string
}

var (
	floorA = &floor{id: "A", env: "BENCH_FLOOR_POLL", name: "raw SQL poll loop every 5 ms (floor A)", sink: "raw poll loop",
		note: fmt.Sprintf("the least a poller that keeps a trickle's latency within 10 ms does: one DELETE … RETURNING of up to 500 rows every %s on one connection, no lanes, no order, no sink", floorInterval)}
	floorB = &floor{id: "B", env: "BENCH_FLOOR_WAL", name: "logical-replication reader, deletes every 10 ms (floor B)", sink: "WAL reader",
		note: fmt.Sprintf("the least a reader of the WAL does: pgoutput on a temporary slot, whole rows from the stream, one DELETE … WHERE id = ANY($1) RETURNING id of what it read every %s (a row not yet visible stays for the next), on one connection beside the replication one; its walsender's CPU is in the database's", floorWALInterval)}
)

// floor is the floor of the set: B where the relay follows the WAL.
func (s *liveSet) floor() *floor {
	if s.wakeup == "wal" {
		return floorB
	}
	return floorA
}

// floorCounters are the two counters of the relay's /metrics that the
// live rows read, as a floor serves them.
type floorCounters struct{ published, batches atomic.Int64 }

// serve answers /metrics on addr until the returned func is called.
func (c *floorCounters) serve(addr string) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "%s %d\n%s %d\n", metricPublished, c.published.Load(), metricBatches, c.batches.Load())
	})}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() }, nil
}

// floorChild runs a floor when this process is its child (the floor's
// env variable: the outbox's schema; DATABASE_URL; BENCH_FLOOR_ADMIN:
// where to serve /metrics), until SIGTERM. It reports whether it was.
func floorChild() (bool, error) {
	var f *floor
	for _, k := range []*floor{floorA, floorB} {
		if os.Getenv(k.env) != "" {
			f = k
		}
	}
	if f == nil {
		return false, nil
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	cc, err := pgx.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return true, err
	}
	cc.RuntimeParams["application_name"] = "outbox-relay" // followed as the relay's sessions
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return true, err
	}
	defer conn.Close(context.Background())
	c := &floorCounters{}
	if f == floorB {
		return true, walFloor(ctx, conn, os.Getenv(f.env), c)
	}
	return true, pollFloor(ctx, conn, os.Getenv(f.env), c)
}

// pollFloor is floor A's loop.
func pollFloor(ctx context.Context, conn *pgx.Conn, schema string, c *floorCounters) error {
	stop, err := c.serve(os.Getenv("BENCH_FLOOR_ADMIN"))
	if err != nil {
		return err
	}
	defer stop()
	q := rawClaimSQL(schema, 500)
	tick := time.NewTicker(floorInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		rows, err := conn.Query(ctx, q)
		if err != nil {
			return err
		}
		n := int64(0)
		for rows.Next() {
			n++
		}
		if err := rows.Err(); err != nil && ctx.Err() == nil {
			return err
		}
		if n > 0 {
			c.published.Add(n)
			c.batches.Add(1)
		}
	}
}

// liveFloor runs the floor rows of set at floorRates: the set's floor's
// child process in the relay's place, the same writers and windows as the
// relay's rows, × drain against the relay's discard drain of the same set
// (drain). The relay's rows get their × floor at the end of the group
// (compareWithFloors).
func (b *bench) liveFloor(ctx context.Context, set *liveSet, recv *receiver, drain *liveStats) error {
	if drain == nil || drain.RelayCPUUs <= 0 || drain.DBCPUUs <= 0 {
		return errors.New("floor rows: no discard drain of the set to compare with")
	}
	f := set.floor()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	stderr := &tailBuffer{max: 8 << 10}
	p, err := testkit.StartRelay(ctx, testkit.RelayConfig{
		Bin:    self,
		Env:    append(os.Environ(), f.env+"="+liveSchema, "BENCH_FLOOR_ADMIN="+addr, "DATABASE_URL="+set.db.url),
		Stderr: stderr,
	})
	if err != nil {
		return err
	}
	lr := &liveRelay{p: &relayProc{Relay: p, stderr: stderr}, admin: addr, db: set.db,
		be: b.followBackends(set.db.admin, set.db.name, "outbox-relay")}
	defer lr.stop()
	if err := lr.answers(ctx); err != nil {
		return fmt.Errorf("floor %s: %w", f.id, err)
	}
	window := b.liveWindow()
	for _, rate := range floorRates {
		st, _, _, notes, err := b.liveRate(ctx, lr, recv, "discard", rate, window)
		if err != nil {
			return fmt.Errorf("floor %s at %.0f msg/s: %w", f.id, rate, err)
		}
		st.RelayX, st.DBX = st.RelayCPUUs/drain.RelayCPUUs, st.DBCPUUs/drain.DBCPUUs
		st.Set, st.Sink, st.Floor = set.label, f.sink, f.id
		r := &row{Group: "live", Name: set.rowName(f.name, st.Load), Live: st, Messages: int(st.Messages),
			PayloadBytes: b.cfg.payload, Keys: b.cfg.keys, Processes: 1, Runs: 1}
		r.addNote("%s; × drain is against the relay's discard drain of this set", f.note)
		for _, n := range notes {
			r.addNote("%s", n)
		}
		b.rep.add(r)
		b.log.Info("live floor", "floor", f.id, "set", set.label, "load", st.Load, "relay_us_per_msg", int(st.RelayCPUUs), "db_us_per_msg", int(st.DBCPUUs),
			"relay_x", st.RelayX, "db_x", st.DBX, "tx_per_msg", st.TxPerMsg, "own_stmt_per_msg", st.OwnStmtPerMsg)
	}
	return nil
}

// floorRatio is a relay row against one floor row of the same rate.
type floorRatio struct {
	Floor string `json:"floor"`         // A or B
	Set   string `json:"set,omitempty"` // the floor's set, where not the relay row's own
	// X is the relay's and its sessions' CPU per message over the
	// floor's; DBX its sessions' alone over the floor's sessions'.
	X   float64 `json:"relay_db_x_floor"`
	DBX float64 `json:"db_x_floor"`
}

// compareWithFloors gives each relay row of the live group its ratios to
// the floor rows of its rate: its own set's floor, and, where the relay
// follows the WAL, floor A of a polling set on the same server as well
// (issue 49 reads the relay against floor A at 1,000 msg/s and against
// floor B at 100). The floors run after the relay's discard rows and
// before its Kafka rows, so this waits for the group's end.
func compareWithFloors(rows []*row, sets []*liveSet) {
	bySet := map[string]*liveSet{}
	for _, s := range sets {
		bySet[s.label] = s
	}
	var floors []*liveStats
	for _, r := range rows {
		if l := r.Live; r.Group == "live" && l != nil && l.Floor != "" && l.Offered > 0 && l.DBCPUUs > 0 {
			floors = append(floors, l)
		}
	}
	for _, r := range rows {
		l := r.Live
		if r.Group != "live" || l == nil || l.Floor != "" || l.Offered == 0 || l.Messages == 0 {
			continue
		}
		own := bySet[l.Set]
		for _, f := range floors {
			fs := bySet[f.Set]
			if f.Offered != l.Offered || own == nil || fs == nil {
				continue
			}
			if fs != own && (f.Floor != floorA.id || own.wakeup != "wal" || fs.url != own.url) {
				continue
			}
			fr := floorRatio{Floor: f.Floor, X: (l.RelayCPUUs + l.DBCPUUs) / (f.RelayCPUUs + f.DBCPUUs), DBX: l.DBCPUUs / f.DBCPUUs}
			if fs != own {
				fr.Set = f.Set
			}
			l.VsFloors = append(l.VsFloors, fr)
		}
	}
}
