package lease

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/relay/internal/lanes"
)

// The cause the heartbeat records fits a text column: one line, valid
// UTF-8 without NUL, at most maxDownCause characters.
func TestDownCause(t *testing.T) {
	t.Parallel()
	require.Equal(t, "unknown", downCause(nil))
	require.Equal(t, "post: dial tcp: connection refused", downCause(errors.New("post:\n\tdial tcp:\x00 connection refused")))
	got := downCause(errors.New("bad \xff byte"))
	require.True(t, utf8.ValidString(got))
	require.Equal(t, "bad \uFFFD byte", got)
	long := downCause(errors.New(strings.Repeat("é", 2*maxDownCause)))
	require.Equal(t, maxDownCause, utf8.RuneCountInString(long))
	require.True(t, strings.HasSuffix(long, "…"))
}

type nopHooks struct{}

func (nopHooks) Lanes(int)         {}
func (nopHooks) UnworkedLanes(int) {}
func (nopHooks) RouteConfigs(int)  {}

var errTestConflict = errors.New("outbox: configuration")

// validConfig returns a Config that New accepts. Its pool connects to
// nothing until used, and these tests use it for nothing.
func validConfig(t *testing.T) Config {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/nothing")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	schema, err := store.NewSchema("outbox")
	require.NoError(t, err)
	return Config{
		Pool: pool, Leases: store.NewLeases(schema, "relay-a", "orders"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Hooks: nopHooks{},
		Route: "orders", LeaseTTL: 15 * time.Second, Heartbeat: 5 * time.Second,
		ConfigHash: "2:0123456789abcdef", ConfigSummary: "sink stdout, topics *, on-dead-letter skip",
		ErrConflict: errTestConflict,
		Starved:     func() (time.Duration, bool) { return 0, false },
		InFlight:    func() int64 { return 0 },
		WakeAll:     func() {},
	}
}

// New refuses a Config that misses an input, naming the field.
func TestNewNamesTheField(t *testing.T) {
	t.Parallel()
	l, err := New(validConfig(t))
	require.NoError(t, err)
	require.Zero(t, l.OwnedCount())
	require.ErrorContains(t, l.Healthy(), "no lane lease heartbeat has ended yet")
	require.NoError(t, l.Conflict())
	require.Equal(t, "sink stdout, topics *, on-dead-letter skip", l.Summary())

	for field, spoil := range map[string]func(c *Config){
		"Pool":           func(c *Config) { c.Pool = nil },
		"Leases":         func(c *Config) { c.Leases = nil },
		"Logger":         func(c *Config) { c.Logger = nil },
		"Hooks":          func(c *Config) { c.Hooks = nil },
		"LeaseTTL":       func(c *Config) { c.LeaseTTL = 0 },
		"Heartbeat":      func(c *Config) { c.Heartbeat = c.LeaseTTL },
		"OnConfigChange": func(c *Config) { c.OnConfigChange = ConfigAllow + 1 },
		"ConfigHash":     func(c *Config) { c.ConfigHash = "" },
		"ErrConflict":    func(c *Config) { c.ErrConflict = nil },
		"Starved":        func(c *Config) { c.Starved = nil },
		"InFlight":       func(c *Config) { c.InFlight = nil },
		"WakeAll":        func(c *Config) { c.WakeAll = nil },
	} {
		c := validConfig(t)
		spoil(&c)
		_, err := New(c)
		require.ErrorContains(t, err, "outbox: lease: "+field+" ", field)
	}
}

// Only fingerprints made the same way as this relay's are compared; the
// others (a relay of an older version) are counted as unknown, and the
// configurations are counted once each.
func TestJudge(t *testing.T) {
	t.Parallel()
	mine := "2:aaaa"
	v := judge([]store.OtherConfig{
		{ID: "b", Hash: "2:bbbb", Earlier: true},
		{ID: "c", Hash: "2:bbbb"},
		{ID: "d", Hash: "2:cccc"},
		{ID: "e", Hash: ""},
		{ID: "f", Hash: "1:bbbb", Earlier: true},
	}, mine)
	require.Equal(t, 3, v.configs)
	require.Equal(t, 2, v.unknown)
	require.Len(t, v.blocking, 1)
	require.Equal(t, "b", v.blocking[0].ID)
	require.Equal(t, verdict{configs: 1}, judge(nil, mine))
}

// The conflict's error wraps the relay's sentinel, names both
// configurations, and says how to allow them together.
func TestConflictError(t *testing.T) {
	t.Parallel()
	c := validConfig(t)
	l, err := New(c)
	require.NoError(t, err)
	err = l.conflictError([]store.OtherConfig{{ID: "relay-b", Version: "v1.2", Hash: "2:bbbb", Summary: "sink kafka://k, topics *"}})
	require.ErrorIs(t, err, errTestConflict)
	require.Equal(t, `outbox: configuration: route "orders": live relays of the route run another configuration; `+
		`this relay takes none of their lanes and waits until they are gone (the end of a rolling change). `+
		`This relay: sink stdout, topics *, on-dead-letter skip. Running: relay relay-b (version v1.2): sink kafka://k, topics *. `+
		`Stop them, give this relay their configuration, or allow both to deliver during a rolling change `+
		`(--allow-config-change; Config.OnConfigChange "allow")`, err.Error())

	// Refused with ConfigFail, the relay stops with the error.
	c.OnConfigChange = ConfigFail
	l, err = New(c)
	require.NoError(t, err)
	var aborted error
	l.Prepare(false, func(cause error) { aborted = cause })
	require.Error(t, l.judgeOthers([]store.OtherConfig{{ID: "relay-b", Hash: "2:bbbb", Earlier: true}}))
	require.ErrorIs(t, l.Conflict(), errTestConflict)
	l.refused(l.Conflict())
	require.ErrorIs(t, aborted, errTestConflict)
	require.NotContains(t, aborted.Error(), "waits until they are gone")
}

// The lanes are shared out equally, the remainder going to the relays
// with the smallest ids.
func TestFairShare(t *testing.T) {
	t.Parallel()
	total := 0
	for rank := range 3 {
		total += fairShare(store.RelayCount{Alive: 3, Rank: rank})
	}
	require.Equal(t, lanes.N, total)
	require.Equal(t, lanes.N/3+1, fairShare(store.RelayCount{Alive: 3, Rank: 0}))
	require.Equal(t, lanes.N/3, fairShare(store.RelayCount{Alive: 3, Rank: 2}))
	require.Equal(t, lanes.N, fairShare(store.RelayCount{}), "a relay alone (or not yet counted) takes every lane")
}

// A notification that lanes were handed back asks for a heartbeat only
// of a relay below its fair share; one that relays came or went asks it
// of every relay.
func TestMembersNotified(t *testing.T) {
	t.Parallel()
	l, err := New(validConfig(t))
	require.NoError(t, err)
	asked := func() bool {
		select {
		case <-l.rebalance:
			return true
		default:
			return false
		}
	}
	l.MembersNotified(true)
	require.True(t, asked(), "below its share until the first heartbeat")
	l.short.Store(false)
	l.MembersNotified(true)
	require.False(t, asked())
	l.MembersNotified(false)
	require.True(t, asked())
}
