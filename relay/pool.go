package relay

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolConfig holds the session settings NewPool applies.
type PoolConfig struct {
	// URL is the database URL or DSN.
	URL string
	// Workers sizes the pool (Workers + 2 connections).
	Workers int
	// PublishTimeout sets the idle-in-transaction timeout (PublishTimeout +
	// 30s): a relay that stops talking to the database mid-batch has its
	// transaction aborted and its rows freed.
	PublishTimeout time.Duration
	// SynchronousCommit keeps synchronous_commit on for the relay's own
	// sessions. Off by default: a relay transaction lost in a database
	// crash only means a redelivery, never a loss. Applications' writes are
	// not affected.
	SynchronousCommit bool
}

// NewPool connects to the database with the session settings the relay
// relies on: bounded transactions and statements, TCP keepalives so a
// vanished relay host is noticed, an application_name for pg_stat_activity.
func NewPool(ctx context.Context, pc PoolConfig) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(pc.URL)
	if err != nil {
		// pgx's parse errors can echo the URL, password included.
		return nil, fmt.Errorf("outbox: database-url: cannot parse (check its syntax)")
	}
	if pc.Workers < 1 {
		pc.Workers = DefaultWorkers
	}
	if pc.PublishTimeout <= 0 {
		pc.PublishTimeout = DefaultPublishTimeout
	}
	cfg.MaxConns = int32(pc.Workers + 2)
	cfg.MinConns = 0
	p := cfg.ConnConfig.RuntimeParams
	if _, ok := p["application_name"]; !ok {
		p["application_name"] = "outbox-relay"
	}
	if !pc.SynchronousCommit {
		p["synchronous_commit"] = "off"
	}
	p["idle_in_transaction_session_timeout"] = strconv.FormatInt((pc.PublishTimeout + 30*time.Second).Milliseconds(), 10)
	p["statement_timeout"] = "60000"
	p["lock_timeout"] = "30000"
	p["tcp_keepalives_idle"] = "15"
	p["tcp_keepalives_interval"] = "5"
	p["tcp_keepalives_count"] = "3"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("outbox: connect: %w", err)
	}
	return pool, nil
}
