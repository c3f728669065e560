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

// The live group's floor: what the least a process can do to deliver a
// trickle within a few milliseconds, by polling, costs per message. The
// bench binary runs itself as a child process (BENCH_FLOOR_POLL set)
// that polls the outbox every floorInterval with the raw-SQL yardstick's
// statement (one DELETE … RETURNING of up to 500 rows in id order, in
// autocommit: one round trip, no lanes, no order, no sink), on one
// connection. The live rows of the relay at the same rates, divided by
// these, say how much of the relay's cost at a trickle is its own, and
// how much any poller that keeps the latency pays.

// floorInterval is the floor's poll interval: a p99 within 10 ms needs
// looks about 5 ms apart.
const floorInterval = 5 * time.Millisecond

// floorRates are the rates of the floor rows.
var floorRates = []float64{100, 1000}

// floorChild runs the floor's poll loop when this process is the child
// (BENCH_FLOOR_POLL: the outbox's schema; DATABASE_URL, BENCH_FLOOR_ADMIN:
// where to serve /metrics with the relay's two counters the live rows
// read), until SIGTERM. It reports whether it was the child.
func floorChild() (bool, error) {
	schema := os.Getenv("BENCH_FLOOR_POLL")
	if schema == "" {
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
	var published, polls atomic.Int64
	ln, err := net.Listen("tcp", os.Getenv("BENCH_FLOOR_ADMIN"))
	if err != nil {
		return true, err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "%s %d\n%s %d\n", metricPublished, published.Load(), metricBatches, polls.Load())
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	q := rawClaimSQL(schema, 500)
	tick := time.NewTicker(floorInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return true, nil
		case <-tick.C:
		}
		rows, err := conn.Query(ctx, q)
		if err != nil {
			return true, err
		}
		n := int64(0)
		for rows.Next() {
			n++
		}
		if err := rows.Err(); err != nil && ctx.Err() == nil {
			return true, err
		}
		if n > 0 {
			published.Add(n)
			polls.Add(1)
		}
	}
}

// liveFloor runs the floor rows of set at floorRates: the child process
// in the relay's place, the same writers and windows as the relay's rows,
// the ratios against the relay's discard drain of the same set (drain).
func (b *bench) liveFloor(ctx context.Context, set *liveSet, recv *receiver, drain *liveStats) error {
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
		Env:    append(os.Environ(), "BENCH_FLOOR_POLL="+liveSchema, "BENCH_FLOOR_ADMIN="+addr, "DATABASE_URL="+set.db.url),
		Stderr: stderr,
	})
	if err != nil {
		return err
	}
	lr := &liveRelay{p: &relayProc{Relay: p, stderr: stderr}, admin: addr, db: set.db,
		be: b.followBackends(set.db.admin, set.db.name, "outbox-relay")}
	defer lr.stop()
	if err := lr.answers(ctx); err != nil {
		return fmt.Errorf("floor poller: %w", err)
	}
	window := b.liveWindow()
	for _, rate := range floorRates {
		st, _, _, notes, err := b.liveRate(ctx, lr, recv, "discard", rate, window)
		if err != nil {
			return fmt.Errorf("floor at %.0f msg/s: %w", rate, err)
		}
		if drain == nil || drain.RelayCPUUs <= 0 || drain.DBCPUUs <= 0 {
			return errors.New("floor rows: no discard drain of the set to compare with")
		}
		st.RelayX, st.DBX = st.RelayCPUUs/drain.RelayCPUUs, st.DBCPUUs/drain.DBCPUUs
		st.Set = set.label
		st.Sink = "raw poll loop"
		r := &row{Group: "live", Name: set.rowName("raw SQL poll loop every 5 ms (floor)", st.Load), Live: st, Messages: int(st.Messages),
			PayloadBytes: b.cfg.payload, Keys: b.cfg.keys, Processes: 1, Runs: 1}
		r.addNote("the least a poller that keeps a trickle's latency within 10 ms does: one DELETE … RETURNING of up to 500 rows every %s on one connection, no lanes, no order, no sink; × is against the relay's discard drain of this set", floorInterval)
		for _, n := range notes {
			r.addNote("%s", n)
		}
		b.rep.add(r)
		b.log.Info("live floor", "set", set.label, "load", st.Load, "relay_us_per_msg", int(st.RelayCPUUs), "db_us_per_msg", int(st.DBCPUUs),
			"relay_x", st.RelayX, "db_x", st.DBX, "tx_per_msg", st.TxPerMsg)
	}
	return nil
}
