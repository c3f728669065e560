package lease

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/relay/internal/testsig"
)

// Config is what a Leaser works with: the relay's pool and lease
// statements, the settings of its configuration that concern the lanes,
// and the relay's side (its workers and its route's state), seen through
// functions. New validates it; the relay fills it from its own Config.
type Config struct {
	// Pool gives the leaser its connection, which it keeps for its whole
	// life (see service.DropConn). Required.
	Pool *pgxpool.Pool
	// Leases are the lease statements of the relay's id and route.
	// Required.
	Leases *store.Leases
	// Logger receives the leaser's log lines. Required.
	Logger *slog.Logger
	// Hooks are told, at each heartbeat, the lanes owned, the lanes no
	// live relay works and the route's configurations. Required.
	Hooks Hooks
	// Signals announces the heartbeats to tests. Default nil: nothing is
	// announced (a production relay).
	Signals *testsig.Bus

	// Route is the relay's route, named in errors. Default "": the single
	// route.
	Route string
	// LeaseTTL is how long a lane's lease lasts without a heartbeat.
	// Required (positive).
	LeaseTTL time.Duration
	// Heartbeat is how often the leaser renews its leases and rebalances.
	// Required: positive and shorter than LeaseTTL.
	Heartbeat time.Duration
	// FastFailover reaps a relay whose lease connection is gone without
	// waiting for its leases to expire. Default false.
	FastFailover bool
	// Version is the relay's version, registered for operators. Default
	// "".
	Version string
	// OnConfigChange is what the leaser does while live relays of its
	// route run another configuration. Default ConfigWait.
	OnConfigChange ConfigPolicy
	// ConfigHash fingerprints the route's configuration as this relay
	// runs it ("version:digest"); ConfigSummary says it for operators.
	// The leaser registers both and compares the hash with the other
	// relays' at each heartbeat. ConfigHash is required.
	ConfigHash, ConfigSummary string
	// ErrConflict is the error that the error of a configuration
	// conflict wraps, so that the relay's callers find it with
	// errors.Is. Required.
	ErrConflict error

	// Starved reports whether a worker has waited for a connection for
	// longer than the lease TTL, and for how long: the leaser then hands
	// the lanes back. Required.
	Starved func() (time.Duration, bool)
	// InFlight counts the claimed messages not yet settled, registered
	// for operators. Required.
	InFlight func() int64
	// WakeAll makes every worker visit all of its lanes: the lanes a
	// heartbeat took may hold a backlog that no wake-up named. Required.
	WakeAll func()
	// Report returns the route's delivery state, which each heartbeat
	// records for operators. Default nil: the route always delivers.
	Report func() Report
}

// Hooks is what the leaser tells the relay's hooks (relay.Hooks has these
// methods).
type Hooks interface {
	// Lanes reports how many lanes the relay owns.
	Lanes(owned int)
	// UnworkedLanes reports how many lanes of the route no live relay has
	// worked for longer than a lease TTL.
	UnworkedLanes(n int)
	// RouteConfigs reports how many configurations the route's live
	// relays run.
	RouteConfigs(n int)
}

// Report is the route's delivery state as a heartbeat records it in the
// relays table. A zero time says the route is not in that state: its
// destination is up, it waits for no limit, its messages do not fail.
type Report struct {
	// DownSince is when the destination went down as a whole, DownCause
	// why, and DownProbes how many probes found it still down.
	DownSince  time.Time
	DownCause  error
	DownProbes int
	// LimitedSince is when the route started waiting for its rate limit
	// or its destination, and LimitCause what it waits for.
	LimitedSince time.Time
	LimitCause   error
	// FailingSince is the first failure of the route's current streak of
	// failing messages, and LastError the latest.
	FailingSince time.Time
	LastError    error
}

// ConfigPolicy is what a relay does while live relays of its route,
// registered before it, run another configuration.
type ConfigPolicy int

// The policies, as the relay's Config.OnConfigChange names them.
const (
	// ConfigWait takes no lane (it does not even register) until they
	// are gone, logging a warning each minute; Conflict says why.
	ConfigWait ConfigPolicy = iota
	// ConfigFail stops the relay with the conflict's error (see
	// Leaser.Prepare).
	ConfigFail
	// ConfigAllow takes a share of the lanes beside them, and reports
	// the coexistence to Hooks.RouteConfigs.
	ConfigAllow
)

// String returns the policy's name as the relay's configuration spells
// it: "wait", "fail" or "allow".
func (p ConfigPolicy) String() string {
	switch p {
	case ConfigWait:
		return "wait"
	case ConfigFail:
		return "fail"
	case ConfigAllow:
		return "allow"
	}
	return fmt.Sprintf("ConfigPolicy(%d)", int(p))
}

// validate returns an error naming the first field of c that is missing
// or out of range.
func (c Config) validate() error {
	bad := func(field, problem string) error {
		return fmt.Errorf("outbox: lease: %s %s", field, problem)
	}
	switch {
	case c.Pool == nil:
		return bad("Pool", "is required")
	case c.Leases == nil:
		return bad("Leases", "is required")
	case c.Logger == nil:
		return bad("Logger", "is required")
	case c.Hooks == nil:
		return bad("Hooks", "is required")
	case c.LeaseTTL <= 0:
		return bad("LeaseTTL", "must be positive")
	case c.Heartbeat <= 0 || c.Heartbeat >= c.LeaseTTL:
		return bad("Heartbeat", "must be positive and shorter than LeaseTTL")
	case c.OnConfigChange < ConfigWait || c.OnConfigChange > ConfigAllow:
		return bad("OnConfigChange", "must be ConfigWait, ConfigFail or ConfigAllow")
	case !strings.Contains(c.ConfigHash, ":"):
		// The part before the colon says how the hash was made: only
		// hashes made the same way can be compared (see comparable).
		return bad("ConfigHash", `must be "version:digest"`)
	case c.ErrConflict == nil:
		return bad("ErrConflict", "is required")
	case c.Starved == nil:
		return bad("Starved", "is required")
	case c.InFlight == nil:
		return bad("InFlight", "is required")
	case c.WakeAll == nil:
		return bad("WakeAll", "is required")
	}
	return nil
}
