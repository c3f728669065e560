package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/store"
)

// PoolConfig holds the session settings NewPool applies, and the
// process's connection budget.
type PoolConfig struct {
	// URL is the database URL or DSN.
	URL string
	// Workers is how many workers the pool serves, over every relay that
	// shares it; it sizes the default MaxConns. Default 2.
	Workers int
	// MaxConns caps every connection the process opens through the pool
	// (docs/operations.md, "Sizing the pool of an embedded relay").
	// Default Workers × DefaultPipeline + 3, which fits one relay; for
	// several relays on one pool, Conns + PipelineConns + 1 of their
	// configurations; down to Conns only narrows the pipeline.
	MaxConns int
	// PublishTimeout + 30s is the idle-in-transaction timeout, which frees
	// the rows of a relay that went silent mid-batch.
	PublishTimeout time.Duration
	// SynchronousCommit keeps synchronous_commit on for the relay's own
	// sessions (off by default: a lost settle is a redelivery, not a loss).
	SynchronousCommit bool
	// Password, when set, gives the password of each new connection, in
	// place of URL's (and of PGPASSWORD's or a .pgpass file's): the pool
	// calls it before every connection it opens, and the WAL wake-up
	// before its replication connection, so that credentials that rotate
	// (a file a secret manager rewrites, an RDS IAM token valid 15
	// minutes) are read when a connection needs them, not once at start.
	// Open connections keep the password they logged in with. It is
	// called concurrently, with the context of the connection attempt; an
	// error or an empty password fails that attempt, which the relay
	// retries as any failed connection. A source that is slow or charged
	// per call should cache (the command line's command and IAM sources
	// do). Errors must not carry the password. Default nil: URL's
	// password.
	Password func(ctx context.Context) (string, error)
	// IdleTime is how long a connection no worker uses stays open before
	// the pool closes it. Default pgxpool's, 30 minutes; a process of many
	// sources (Sources) closes them sooner, so that a source holds
	// sessions only while it has work.
	IdleTime time.Duration
}

// NewPool connects to the database with the session settings the relay
// relies on: bounded transactions and statements, TCP keepalives so a
// vanished relay host is noticed, an application_name, read committed
// whatever the database's default, and no idle_session_timeout (its
// LISTEN and lease sessions are idle by design).
//
// Behind a transaction-pooling proxy (PgBouncer in transaction mode) the
// pool finds out with a probe connection, sends no session settings and
// prepares no statements (docs/operations.md, "Behind PgBouncer").
func NewPool(ctx context.Context, pc PoolConfig) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(pc.URL)
	if err != nil {
		// pgx's parse errors can echo the URL, password included.
		return nil, fmt.Errorf("outbox: database-url: cannot parse (check its syntax)")
	}
	if pc.Workers < 1 {
		pc.Workers = DefaultWorkers
	}
	if pc.MaxConns == 0 {
		pc.MaxConns = pc.Workers*DefaultPipeline + 3
	}
	if pc.MaxConns < 1 {
		return nil, fmt.Errorf("outbox: max-conns: must be positive, got %d", pc.MaxConns)
	}
	if pc.PublishTimeout <= 0 {
		pc.PublishTimeout = DefaultPublishTimeout
	}
	cfg.MaxConns = int32(pc.MaxConns)
	cfg.MinConns = 0
	if pc.IdleTime > 0 {
		cfg.MaxConnIdleTime = pc.IdleTime
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "outbox-relay"
	}
	session := map[string]string{
		"idle_in_transaction_session_timeout": strconv.FormatInt((pc.PublishTimeout + 30*time.Second).Milliseconds(), 10),
		"statement_timeout":                   "60000",
		"lock_timeout":                        "30000",
		"default_transaction_isolation":       "read committed",
		"tcp_keepalives_idle":                 "15",
		"tcp_keepalives_interval":             "5",
		"tcp_keepalives_count":                "3",
	}
	if !pc.SynchronousCommit {
		session["synchronous_commit"] = "off"
	}
	var k sessionKind
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		if pc.Password != nil {
			// Before the probe, which connects with cc.
			pw, err := pc.Password(ctx)
			if err != nil {
				return fmt.Errorf("outbox: database password: %w", err)
			}
			if pw == "" {
				return errors.New("outbox: database password: the password source gave an empty password")
			}
			cc.Password = pw
		}
		kind, err := k.get(ctx, cc)
		if err != nil {
			return err
		}
		if kind.pooled {
			if cc.DefaultQueryExecMode != pgx.QueryExecModeSimpleProtocol {
				cc.DefaultQueryExecMode = pgx.QueryExecModeExec
			}
			return nil
		}
		for name, v := range session {
			if _, set := cc.RuntimeParams[name]; !set {
				cc.RuntimeParams[name] = v
			}
		}
		if kind.version >= 14 {
			cc.RuntimeParams["idle_session_timeout"] = "0"
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("outbox: connect: %w", err)
	}
	return pool, nil
}

// sessionKind is what the pool's first connection found out about the
// server's sessions, once.
type sessionKind struct {
	mu     sync.Mutex
	known  bool
	pooled bool
	// version is the server's major version (0 when unknown).
	version int
}

// get probes the server with a connection of cc's (its own settings only,
// none of the relay's) the first time, and returns what it found.
func (k *sessionKind) get(ctx context.Context, cc *pgx.ConnConfig) (*sessionKind, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.known {
		return k, nil
	}
	c, err := pgx.ConnectConfig(ctx, cc.Copy())
	if err != nil {
		return nil, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	pooled, err := store.Pooled(ctx, c)
	if err != nil {
		return nil, err
	}
	k.known, k.pooled = true, pooled
	v := c.PgConn().ParameterStatus("server_version")
	if i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' }); i > 0 {
		v = v[:i]
	}
	k.version, _ = strconv.Atoi(v)
	return k, nil
}

// Conns returns how many connections relays of these configurations hold
// on one pool when every worker is busy (a worker each, a lane lease and
// a LISTEN per relay or Set): the least PoolConfig.MaxConns that lets
// every worker work. Give one more for health checks and metrics.
func Conns(cfgs ...Config) int {
	n, shared := 0, false
	for _, c := range cfgs {
		w := c.Workers
		if w == 0 {
			w = DefaultWorkers
		}
		n += w + 1
		if c.sharedListener {
			shared = true
		} else {
			n++
		}
	}
	if shared {
		n++
	}
	return n
}

// PipelineConns returns how many connections beyond Conns the relays with
// these configurations use when every worker has Config.Pipeline batches
// in flight: one per batch beyond the first.
func PipelineConns(cfgs ...Config) int {
	n := 0
	for _, c := range cfgs {
		w, p := c.Workers, c.Pipeline
		if w == 0 {
			w = DefaultWorkers
		}
		if p == 0 {
			p = DefaultPipeline
		}
		n += w * (p - 1)
	}
	return n
}
