package relay

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/store"
	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay/internal/lanes"
	"github.com/outbox-relay/outbox-relay/relay/internal/lease"
	"github.com/outbox-relay/outbox-relay/relay/internal/share"
	"github.com/outbox-relay/outbox-relay/relay/internal/testsig"
	"github.com/outbox-relay/outbox-relay/topic"
)

// Config configures a Relay. The zero value of every field means "use the
// default" given in its comment.
type Config struct {
	// ID names this relay process in the relays table and in logs.
	// Default: hostname-pid-random.
	ID string
	// Schema holds the outbox tables. Default "outbox".
	Schema string
	// Route names the route this relay serves when one process runs
	// several (each leases its own lanes). Default "".
	Route string
	// Topics are the patterns (package topic: '*' any run of characters,
	// '?' one character) of the topics this route takes. Default: every
	// topic.
	Topics []string
	// ExcludeTopics are patterns taken by earlier routes (first match
	// wins). Default none.
	ExcludeTopics []string
	// Workers is the number of claim loops, each with its share of the
	// lanes and a database connection. Default 2.
	Workers int
	// Pipeline is how many batches a worker has in flight at most: while
	// the sink takes one, the worker claims the next from its other lanes
	// (never a lane in flight), on a connection of its own, when the sink
	// takes at least a third of a batch's time and the pool has a
	// connection to spare. 1: one batch at a time. Default 2.
	Pipeline int
	// BatchSize is the most messages claimed and handed to the sink at
	// once. Default 500.
	BatchSize int
	// BatchBytes is the most payload bytes claimed and handed to the sink
	// at once (a larger message goes alone); payloads past it are not
	// read. It bounds the memory of each batch in flight (docs/operations.md,
	// "Configuration"). Default 16 MiB.
	BatchBytes int64
	// MaxMessageBytes is the largest message (payload and headers) the
	// relay reads; a larger one is dead-lettered at once without being
	// read (reason permanent), its content moved inside the database.
	// Default 17 MiB: what the Go writer accepts by default, and room for
	// its headers.
	MaxMessageBytes int64
	// PollInterval is how often an idle worker looks for work when nothing
	// wakes it: a safety net for a wake-up lost (see Wakeup), one small
	// transaction per idle worker. Default 10s.
	PollInterval time.Duration
	// Wakeup is how relays learn of new rows (docs/design.md, "Wake-up"):
	// WakeupWAL follows the outbox's inserts in the WAL (one watcher per
	// schema, which wakes the others; it polls while it cannot), WakeupPoll
	// polls for them, WakeupNotify relies on the writers' trigger (their
	// commits pay for it), WakeupAuto is WAL where the server allows it,
	// else polling. Default WakeupAuto.
	Wakeup string
	// WatchInterval is the longest the polling watcher waits between two
	// looks: the worst wake-up delay after a quiet spell. Default 100ms.
	WatchInterval time.Duration
	// PublishTimeout bounds one Send to the sink; a Send that takes longer
	// counts as a failed attempt. Default 30s.
	PublishTimeout time.Duration
	// MaxAttempts is how many failed deliveries move a message to the
	// dead-letter table. Default 20.
	MaxAttempts int
	// OnDeadLetter is what a dead letter does to the later messages of its
	// key: OnDeadLetterSkip lets them go on, OnDeadLetterHold keeps them
	// until it is replayed or purged. Default OnDeadLetterSkip.
	OnDeadLetter string
	// Destination describes where the sink delivers, for status and for
	// the route's configuration fingerprint when the sink does not name
	// its target (sinks.Targeter). Never put a secret in it. Default "":
	// the sink's Go type.
	Destination string
	// OnConfigChange is what the relay does while live relays of its
	// route, registered before it, run another configuration (topics,
	// sink, format, OnDeadLetter, fan-out): ConfigChangeWait,
	// ConfigChangeFail or ConfigChangeAllow. Default ConfigChangeWait.
	OnConfigChange string
	// RetryInitial is the delay after the first failure. Default 1s.
	RetryInitial time.Duration
	// RetryMax caps the delay between attempts. Default 10m.
	RetryMax time.Duration
	// RetryMultiplier grows the delay after each failure. Default 2.
	RetryMultiplier float64
	// RetryJitter randomizes each delay by ± this fraction. Default 0.2;
	// negative disables jitter.
	RetryJitter float64
	// RetryPolicy, when set, decides every retry in place of MaxAttempts
	// and the Retry fields above. Default: ExponentialRetry of those.
	RetryPolicy RetryPolicy
	// LeaseTTL is how long a relay owns its lanes without renewing them:
	// the longest a dead relay's lanes wait for another. Default 15s.
	LeaseTTL time.Duration
	// Heartbeat is how often lanes are renewed and rebalanced. Default
	// LeaseTTL/3.
	Heartbeat time.Duration
	// DisableFastFailover: a relay whose lease connection is gone from
	// pg_stat_activity is not taken for dead (only its heartbeat's age
	// tells). Default false.
	DisableFastFailover bool
	// RateLimit bounds the route's deliveries by this relay process, in
	// messages a second (with N relays, give each an Nth). 0: no limit.
	// Default 0.
	RateLimit float64
	// RateBurst is how many messages may go at once under RateLimit (and
	// so the largest batch). Default: RateLimit rounded up (at least 1).
	RateBurst int
	// DrainTimeout is how long Run waits for in-flight batches after its
	// context is cancelled before rolling them back. Default PublishTimeout.
	DrainTimeout time.Duration
	// Archive keeps delivered messages in the archive table, by delivery
	// day, for replays. Default false.
	Archive bool
	// ArchiveRetention is how long archived messages are kept; older
	// daily partitions are dropped. Default 7 days.
	ArchiveRetention time.Duration
	// ConnectTimeout is how long Run waits for the database at start-up
	// before giving up. Default 30s.
	ConnectTimeout time.Duration
	// Producer names this outbox to consumers in every message's
	// sinks.HeaderProducer header (unless the application set it), so
	// that a consumer of several outboxes orders each key per producer
	// (docs/inbox.md, "Producers"). At most 255 bytes of printable
	// ASCII; ProducerNone sends no header. Default: the cluster's system
	// identifier, the database and the schema ("7713292241186691262/orders/outbox").
	Producer string
	// Version is recorded in the relays table. Default "dev".
	Version string
	// Logger receives the relay's logs. Default slog.Default().
	Logger *slog.Logger
	// Hooks observe the relay (metrics). Default none.
	Hooks Hooks

	// What a Set decides for the relays it runs (see SetConfig.Plan):
	// deliveries makes this relay take the fan-out copies made for Route
	// (the deliveries table) instead of messages from the outbox; fanOut
	// makes it the fan-out router, which copies each message its Topics
	// match, in the transaction that removes it from the outbox, to every
	// destination whose patterns match its topic; sharedListener: the Set
	// runs one listener that wakes all its relays, instead of each relay
	// holding a LISTEN connection of its own.
	deliveries     bool
	fanOut         []fanOutDest
	sharedListener bool
	// sig receives the components' test signals (see signal.go): nil
	// outside the package's tests.
	sig *testsig.Bus
	// share is the relay's source's part of the batches of a Sources
	// (nil: not a source's relay): a claim waits for it (see claim).
	share *share.Member
	// linger replaces settleLinger when positive: only the package's
	// tests set it, to decide when a settlement goes alone.
	linger time.Duration
}

// Router reports whether c is the configuration of a Set's fan-out
// router, which copies messages to the routes that take them instead of
// publishing them (it has no sink).
func (c Config) Router() bool { return len(c.fanOut) > 0 }

// fanOutDest is one route a fan-out router copies messages to: those
// whose topic matches one of Topics and none of ExcludeTopics (patterns,
// as in Config.Topics). Its fields are exported for the route's
// fingerprint (see fingerprint).
type fanOutDest struct {
	Route         string
	Topics        []string
	ExcludeTopics []string
}

// matches reports whether a message of topic goes to d.
func (d fanOutDest) matches(t string) bool {
	return !topic.MatchAny(d.ExcludeTopics, t) && topic.MatchAny(d.Topics, t)
}

// routesOf returns the routes a fan-out router of c copies a message of
// topic t to.
func (c Config) routesOf(t string) []string {
	var out []string
	for _, d := range c.fanOut {
		if d.matches(t) {
			out = append(out, d.Route)
		}
	}
	return out
}

// Dead-letter reasons (BatchEvent.DeadReasons; the operator's selections
// accept these only).
const (
	ReasonPermanent   = store.ReasonPermanent
	ReasonMaxAttempts = store.ReasonMaxAttempts
)

// Defaults, exported for documentation and flags.
const (
	DefaultWorkers         = 2
	DefaultPipeline        = 2
	DefaultBatchSize       = 500
	DefaultBatchBytes      = 16 << 20
	DefaultMaxMessageBytes = 17 << 20
	DefaultPollInterval    = 10 * time.Second
	DefaultPublishTimeout  = 30 * time.Second
	DefaultMaxAttempts     = 20
	DefaultRetryInitial    = time.Second
	DefaultRetryMax        = 10 * time.Minute
	DefaultRetryMultiplier = 2.0
	DefaultRetryJitter     = 0.2
	DefaultLeaseTTL        = 15 * time.Second
	DefaultWakeup          = WakeupAuto
	DefaultWatchInterval   = 100 * time.Millisecond
)

// maxPipeline bounds Config.Pipeline: each batch in flight holds a
// connection and up to BatchBytes of payload.
const maxPipeline = 8

// Dead-letter policies (Config.OnDeadLetter).
const (
	// OnDeadLetterSkip: the key moves on past its dead letter (notifications).
	OnDeadLetterSkip = "skip"
	// OnDeadLetterHold: the key waits for its dead letter to be replayed
	// or purged (event-sourcing feeds, projections).
	OnDeadLetterHold = "hold"
)

// Wake-up modes (Config.Wakeup).
const (
	WakeupAuto   = "auto"
	WakeupWAL    = "wal"
	WakeupPoll   = "poll"
	WakeupNotify = "notify"
)

// Configuration-change policies (Config.OnConfigChange): what a relay does
// while live relays of its route, registered before it, run another
// configuration.
const (
	// ConfigChangeWait: it takes no lane, Ready says why, and it joins
	// once they are gone (the end of a rolling deploy).
	ConfigChangeWait = "wait"
	// ConfigChangeFail: Run returns an error wrapping ErrConfig.
	ConfigChangeFail = "fail"
	// ConfigChangeAllow: it takes its share of the lanes beside them.
	ConfigChangeAllow = "allow"
)

// configPolicies maps each policy to the leaser's own (Validate admits
// no other).
var configPolicies = map[string]lease.ConfigPolicy{
	ConfigChangeWait:  lease.ConfigWait,
	ConfigChangeFail:  lease.ConfigFail,
	ConfigChangeAllow: lease.ConfigAllow,
}

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	if c.ID == "" {
		c.ID = defaultID()
	}
	if c.Schema == "" {
		c.Schema = migrations.DefaultSchema
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Pipeline == 0 {
		c.Pipeline = DefaultPipeline
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = DefaultBatchBytes
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Wakeup == "" {
		c.Wakeup = DefaultWakeup
	}
	if c.WatchInterval == 0 {
		c.WatchInterval = DefaultWatchInterval
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.OnDeadLetter == "" {
		c.OnDeadLetter = OnDeadLetterSkip
	}
	if c.RateLimit > 0 && c.RateBurst == 0 {
		c.RateBurst = max(1, int(math.Ceil(c.RateLimit)))
	}
	if c.OnConfigChange == "" {
		c.OnConfigChange = ConfigChangeWait
	}
	if c.RetryInitial == 0 {
		c.RetryInitial = DefaultRetryInitial
	}
	if c.RetryMax == 0 {
		c.RetryMax = DefaultRetryMax
	}
	if c.RetryMultiplier == 0 {
		c.RetryMultiplier = DefaultRetryMultiplier
	}
	// A negative jitter (disabled) stays negative, so that WithDefaults
	// can be applied twice (a Set's plan, then New) without turning "no
	// jitter" into the default.
	if c.RetryJitter == 0 {
		c.RetryJitter = DefaultRetryJitter
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = c.LeaseTTL / 3
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = c.PublishTimeout
	}
	if c.ArchiveRetention == 0 {
		c.ArchiveRetention = 7 * 24 * time.Hour
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 30 * time.Second
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Hooks == nil {
		c.Hooks = NopHooks{}
	}
	return c
}

// Validate reports the first invalid field, by name.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("outbox: %s: "+format, append([]any{field}, args...)...))
	}
	if err := migrations.ValidateSchema(c.Schema); err != nil {
		errs = append(errs, err)
	}
	for _, p := range append(append([]string(nil), c.Topics...), c.ExcludeTopics...) {
		if p == "" {
			bad("topics", "patterns must not be empty")
			break
		}
	}
	if (c.deliveries || len(c.fanOut) > 0) && c.Route == "" {
		bad("route", "a fan-out router or destination needs a route name")
	}
	if c.deliveries && len(c.fanOut) > 0 {
		bad("fan-out", "a relay is either a fan-out router or a destination, not both")
	}
	for i, d := range c.fanOut {
		if d.Route == "" || len(d.Topics) == 0 {
			bad(fmt.Sprintf("fan-out[%d]", i), "needs a route and at least one topic pattern")
		}
	}
	if c.Workers < 1 || c.Workers > lanes.N {
		bad("workers", "must be between 1 and %d, got %d", lanes.N, c.Workers)
	}
	if c.Pipeline < 1 || c.Pipeline > maxPipeline {
		bad("pipeline", "must be between 1 and %d, got %d", maxPipeline, c.Pipeline)
	}
	if c.BatchSize < 1 || c.BatchSize > 10000 {
		bad("batch-size", "must be between 1 and 10000, got %d", c.BatchSize)
	}
	if c.BatchBytes < 1 {
		bad("batch-bytes", "must be at least 1, got %d", c.BatchBytes)
	}
	if c.MaxMessageBytes < 1 {
		bad("max-message-bytes", "must be at least 1, got %d", c.MaxMessageBytes)
	}
	if c.PollInterval < time.Millisecond {
		bad("poll-interval", "must be at least 1ms, got %s", c.PollInterval)
	}
	switch c.Wakeup {
	case WakeupAuto, WakeupWAL, WakeupPoll, WakeupNotify:
	default:
		bad("wakeup", "must be one of auto, wal, poll, notify, got %q", c.Wakeup)
	}
	if c.WatchInterval < time.Millisecond {
		bad("watch-interval", "must be at least 1ms, got %s", c.WatchInterval)
	}
	if c.PublishTimeout < time.Millisecond {
		bad("publish-timeout", "must be at least 1ms, got %s", c.PublishTimeout)
	}
	if c.MaxAttempts < 1 {
		bad("max-attempts", "must be at least 1, got %d", c.MaxAttempts)
	}
	if c.RateLimit < 0 || math.IsNaN(c.RateLimit) || math.IsInf(c.RateLimit, 0) {
		bad("rate-limit", "must be a number of messages a second, 0 (none) or more, got %v", c.RateLimit)
	}
	if c.RateBurst < 0 || c.RateBurst > 0 && c.RateLimit == 0 {
		bad("rate-burst", "must be at least 1, and only with rate-limit, got %d", c.RateBurst)
	}
	if c.OnDeadLetter != OnDeadLetterSkip && c.OnDeadLetter != OnDeadLetterHold {
		bad("on-dead-letter", "must be skip or hold, got %q", c.OnDeadLetter)
	}
	switch c.OnConfigChange {
	case ConfigChangeWait, ConfigChangeFail, ConfigChangeAllow:
	default:
		bad("on-config-change", "must be one of wait, fail, allow, got %q", c.OnConfigChange)
	}
	if c.RetryInitial < 0 || c.RetryMax < c.RetryInitial {
		bad("retry-max", "must be at least retry-initial (%s), got %s", c.RetryInitial, c.RetryMax)
	}
	if c.RetryMultiplier < 1 {
		bad("retry-multiplier", "must be at least 1, got %g", c.RetryMultiplier)
	}
	if c.RetryJitter > 1 {
		bad("retry-jitter", "must be between 0 and 1, got %g", c.RetryJitter)
	}
	if c.LeaseTTL < time.Second {
		bad("lease-ttl", "must be at least 1s, got %s", c.LeaseTTL)
	}
	if c.Heartbeat <= 0 || c.Heartbeat > c.LeaseTTL/2 {
		bad("heartbeat", "must be positive and at most half of lease-ttl (%s), got %s", c.LeaseTTL, c.Heartbeat)
	}
	if c.ArchiveRetention < 24*time.Hour {
		bad("archive-retention", "must be at least 24h (partitions are daily), got %s", c.ArchiveRetention)
	}
	if c.DrainTimeout < 0 {
		bad("drain-timeout", "must not be negative, got %s", c.DrainTimeout)
	}
	if err := checkProducer(c.Producer); err != nil {
		bad("producer", "%v", err)
	}
	return errors.Join(errs...)
}

// defaultID is Config.ID's default: hostname-pid-random.
func defaultID() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "relay"
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// retryPolicy is c's RetryPolicy: its own, or ExponentialRetry from its
// Retry fields.
func (c Config) retryPolicy() RetryPolicy {
	if c.RetryPolicy != nil {
		return c.RetryPolicy
	}
	return ExponentialRetry{Initial: c.RetryInitial, Max: c.RetryMax, Multiplier: c.RetryMultiplier,
		Jitter: c.RetryJitter, MaxAttempts: c.MaxAttempts}
}
