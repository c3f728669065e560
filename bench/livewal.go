package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// The live group's rows on a throwaway cluster (BENCH_LIVE_WAL): the
// shared server may not be reconfigured, and its wal_level = replica
// leaves the relay polling. A cluster of the bench's own with wal_level
// = logical runs the same rows twice, the relay following the WAL
// (--wakeup wal) and polling (--wakeup poll): the same server, only the
// relay's flag differs, so the pair says what polling costs.

// liveSet is one set of live rows: a server, the relay's --wakeup, and
// the database of the set's own on that server.
type liveSet struct {
	label  string        // names the set in its rows; empty on the shared server
	url    string        // the server (any database on it)
	admin  *pgxpool.Pool // the bench's queries on the server outside the set's database
	wakeup string        // the relay's --wakeup; empty leaves its default (auto)
	db     *liveDB
	// discardDrain is the set's drain row into discard: the floor rows'
	// yardstick (livefloor.go).
	discardDrain *liveStats
}

// sharedLiveSet is the set on the shared server (DATABASE_URL), the
// relay's wake-up left to its default.
func (b *bench) sharedLiveSet() *liveSet {
	return &liveSet{url: b.cfg.databaseURL, admin: b.pool}
}

// relayArgs are the set's flags for the relay.
func (s *liveSet) relayArgs() []string {
	if s.wakeup == "" {
		return nil
	}
	return []string{"--wakeup", s.wakeup}
}

// rowName is the name of the set's row of sink at load.
func (s *liveSet) rowName(sink, load string) string {
	if s.label == "" {
		return sink + ", " + load
	}
	return s.label + ": " + sink + ", " + load
}

// liveLogicalConf configures the throwaway cluster: logical decoding for
// the relay's temporary slot (PostgreSQL 15's defaults of 10 slots and 10
// WAL senders are plenty for one relay), and pg_stat_statements so that
// the rows report statements per message.
var liveLogicalConf = []string{
	"# outbox-relay bench, group live (BENCH_LIVE_WAL)",
	"wal_level = logical",
	"max_replication_slots = 10",
	"max_wal_senders = 10",
	"shared_preload_libraries = 'pg_stat_statements'",
}

// logicalLiveSets starts the throwaway cluster and returns its two sets,
// --wakeup wal and --wakeup poll, and what removes the cluster.
func (b *bench) logicalLiveSets(ctx context.Context) ([]*liveSet, func(), error) {
	srv, err := pgtest.Start(ctx, liveLogicalConf...)
	if err != nil {
		return nil, nil, err
	}
	pc, err := pgxpool.ParseConfig(srv.URL())
	if err != nil {
		_ = srv.Close()
		return nil, nil, err
	}
	pc.MaxConns = 4
	pc.ConnConfig.RuntimeParams["application_name"] = "bench-admin"
	admin, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		_ = srv.Close()
		return nil, nil, err
	}
	closeAll := func() {
		admin.Close()
		if err := srv.Close(); err != nil {
			b.log.Warn("removing the live group's throwaway cluster", "error", err)
		}
	}
	var version string
	if err := admin.QueryRow(ctx, "SELECT split_part(current_setting('server_version'), ' ', 1)").Scan(&version); err != nil {
		closeAll()
		return nil, nil, err
	}
	b.log.Info("live group: throwaway cluster with wal_level = logical", "url", srv.URL(), "version", version)
	var sets []*liveSet
	for _, w := range []string{"wal", "poll"} {
		sets = append(sets, &liveSet{
			label: fmt.Sprintf("throwaway cluster (PG %s, wal_level = logical), --wakeup %s", version, w),
			url:   srv.URL(), admin: admin, wakeup: w,
		})
	}
	return sets, closeAll, nil
}

const (
	metricWakeSource = "outbox_relay_wakeup_source"
	metricFallbacks  = "outbox_relay_wakeup_wal_fallbacks_total"
)

// checkWakeup fails a row of a set that asked for a wake-up (--wakeup wal
// or poll) when the relay did not use it: /metrics must show it as the
// relay's source, with no fallback from the WAL to polling, and its log
// no "cannot follow the WAL".
func (lr *liveRelay) checkWakeup(ctx context.Context, set *liveSet) error {
	if set.wakeup == "" {
		return nil
	}
	source := fmt.Sprintf("%s{mode=%q}", metricWakeSource, set.wakeup)
	m, err := scrapeMetrics(ctx, lr.admin, source, metricFallbacks)
	if err != nil {
		return err
	}
	if log := lr.p.stderr.String(); strings.Contains(log, "cannot follow the WAL") {
		return fmt.Errorf("--wakeup %s: the relay could not follow the WAL: %s", set.wakeup, shorten(log))
	}
	if m[source] != 1 || m[metricFallbacks] != 0 {
		return fmt.Errorf("--wakeup %s: the relay's /metrics say %s = %v, %s = %v (want 1 and 0); relay stderr: %s",
			set.wakeup, source, m[source], metricFallbacks, m[metricFallbacks], lr.p.stderr)
	}
	return nil
}
