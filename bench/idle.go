package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// idleRelays is how many relay processes the idle-cost row runs.
const idleRelays = 16

// idleCost measures what idle relays cost the database: 16 relay processes
// (default wake-up) on an empty outbox, in a database of their own so that
// pg_stat_database.xact_commit counts nobody else's transactions; then
// the commit-to-receive latency of the first message after the idle spell.
func (b *bench) idleCost(ctx context.Context) error {
	r := &row{Group: "idle", Name: fmt.Sprintf("%d idle relays (--wakeup auto), empty outbox", idleRelays), Processes: idleRelays, Workers: b.cfg.workers}
	defer func() { r.finish(); b.rep.add(r) }()
	db := fmt.Sprintf("%sidle_%d", schemaPrefix, os.Getpid())
	if _, err := b.pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		r.addNote("cannot create a database of its own: %v", shorten(err.Error()))
		return nil
	}
	defer func() {
		_, _ = b.pool.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
	}()
	u, err := url.Parse(b.cfg.databaseURL)
	if err != nil {
		return err
	}
	u.Path = "/" + db
	dbURL := u.String()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	const schema = "outbox"
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		return err
	}
	recv, err := newReceiver()
	if err != nil {
		return err
	}
	defer recv.close()
	recv.reset(1)
	for range idleRelays {
		p, err := b.startRelay(ctx, schema, recv.URL, nil, "--database-url", dbURL, "--max-conns", fmt.Sprint(b.cfg.workers+2))
		if err != nil {
			return err
		}
		defer p.stop()
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox.relays").Scan(&n); err != nil {
			return err
		}
		if n == idleRelays {
			break
		}
		if time.Now().After(deadline) {
			r.addNote("only %d relays registered after 60s", n)
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(b.cfg.idleSettle) // lanes balanced, start-up over
	xacts := func() (int64, error) {
		var n int64
		// Stats are flushed by each backend at most once a second, or
		// after 10s idle: the window is long enough that this blurs
		// little.
		err := pool.QueryRow(ctx, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()").Scan(&n)
		return n, err
	}
	x0, err := xacts()
	if err != nil {
		return err
	}
	start := time.Now()
	time.Sleep(b.cfg.idleWindow)
	x1, err := xacts()
	if err != nil {
		return err
	}
	idleRate := float64(x1-x0-1) / time.Since(start).Seconds() // minus our own query
	r.addRun(idleRate, 0)
	// The first message after the idle spell.
	var committed time.Time
	if _, err := pool.Exec(ctx, "INSERT INTO outbox.messages (topic, key, payload) VALUES ('bench', 'k', $1)", payloadGo(0, b.cfg.payload)); err != nil {
		return err
	}
	committed = time.Now()
	if !recv.waitCount(ctx, 1, 30*time.Second) {
		r.addNote("first message after the idle spell not received within 30s")
		return nil
	}
	lat := float64(recv.arrivals[0].Load()-committed.UnixNano()) / 1e6
	r.Lat = append(r.Lat, []float64{lat, lat, lat, lat})
	// The relays' transactions per message at low and middle rates (the
	// writes themselves and the idle rate taken out): how many claims
	// each wake-up costs.
	for _, rate := range []float64{50, 500} {
		dur := b.cfg.idleWindow / 4
		x0, err := xacts()
		if err != nil {
			return err
		}
		start := time.Now()
		period := time.Duration(float64(time.Second) / rate)
		var n int
		for i := 1; time.Since(start) < dur; i++ {
			if d := time.Until(start.Add(time.Duration(i) * period)); d > 0 {
				time.Sleep(d)
			}
			if _, err := pool.Exec(ctx, "INSERT INTO outbox.messages (topic, key, payload) VALUES ('bench', $1, $2)", fmt.Sprint("k", i%1000), payloadGo(int64(i), b.cfg.payload)); err != nil {
				return err
			}
			n++
		}
		time.Sleep(2 * time.Second) // deliveries and their stats
		x1, err := xacts()
		if err != nil {
			return err
		}
		el := time.Since(start).Seconds()
		per := (float64(x1-x0-1-int64(n)) - idleRate*el) / float64(n)
		r.addNote("at %.0f msg/s: %.1f relay transactions per message (over the idle rate)", rate, per)
		b.log.Info("relay transactions per message", "rate", rate, "per_message", per)
	}
	r.addNote("database transactions/s over %s (pg_stat_database.xact_commit + xact_rollback of a database of their own), after %s of settling; first message after the idle spell: commit → webhook %.1f ms", b.cfg.idleWindow, b.cfg.idleSettle, lat)
	b.log.Info("idle cost", "relays", idleRelays, "xact_per_s", idleRate, "first_message_ms", lat)
	return nil
}
