package operator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/ident"
	"github.com/outbox-relay/outbox-relay/internal/store"
)

// DeadLetter is one row of the dead-letter table. A timestamp that is not
// finite (a row edited by hand) shows as the zero time, or null.
type DeadLetter struct {
	ID        int64             `json:"id"`
	MessageID string            `json:"message_id"`
	Topic     string            `json:"topic"`
	Key       *string           `json:"key"`
	Payload   []byte            `json:"payload"`
	Headers   map[string]string `json:"headers"`
	CreatedAt time.Time         `json:"created_at"`
	Attempts  int               `json:"attempts"`
	Reason    string            `json:"reason"`
	// Route is the fan-out destination whose copy died ("" for a message
	// dead-lettered from the outbox itself).
	Route         string     `json:"route"`
	FirstError    *string    `json:"first_error"`
	LastError     *string    `json:"last_error"`
	FirstFailedAt *time.Time `json:"first_failed_at"`
	DeadAt        time.Time  `json:"dead_at"`
	// Holds: a route with the hold policy keeps the later messages of the
	// key pending until this dead letter is replayed (it goes first) or
	// purged (the key moves on). Behind counts those messages. List fills
	// both; Show leaves them unset.
	Holds  bool  `json:"holds_key"`
	Behind int64 `json:"behind"`
}

// DefaultLimit is the page size of List when Selection.Limit is not set.
const DefaultLimit = 100

// Selection picks dead letters. Replay and Purge refuse an empty selection
// (set All to mean everything).
type Selection struct {
	IDs   []int64 `json:"ids,omitempty"`
	Topic string  `json:"topic,omitempty"`
	// Key selects the dead letters of one message key.
	Key string `json:"key,omitempty"`
	// Reason selects one dead-letter reason: max_attempts or permanent
	// (Reasons). Any other value is refused with ErrUnknownReason rather
	// than selecting nothing.
	Reason string `json:"reason,omitempty"`
	// Route selects the dead letters of one fan-out destination.
	Route string `json:"route,omitempty"`
	// DefaultRoute selects the dead letters of the default route: the
	// outbox's own messages (route ""), not their fan-out copies. It
	// cannot be combined with Route.
	DefaultRoute bool `json:"default_route,omitempty"`
	// DeadBefore selects dead letters that died before this time.
	DeadBefore time.Time `json:"dead_before,omitzero"`
	// DeadAfter selects dead letters that died at or after this time.
	DeadAfter time.Time `json:"dead_after,omitzero"`
	// OlderThan selects dead letters that died longer ago than this, on
	// the database clock (an operator's clock may be off).
	OlderThan time.Duration `json:"older_than_ns,omitempty"`
	All       bool          `json:"all,omitempty"`
	// Limit caps List (default DefaultLimit); Replay and Purge ignore it.
	Limit int `json:"limit,omitempty"`
	// AfterID and AfterRoute page List: it returns the dead letters after
	// this one in (id, route) order, so the next page starts after the
	// last row of the previous one (pass both: after (7, "") come the dead
	// fan-out copies of message 7). Replay and Purge ignore them: they act
	// on the whole selection, not on a page of it.
	AfterID    int64  `json:"after_id,omitempty"`
	AfterRoute string `json:"after_route,omitempty"`
}

// Empty reports whether s selects nothing.
func (s Selection) Empty() bool {
	return len(s.IDs) == 0 && s.Topic == "" && s.Key == "" && s.Reason == "" && s.Route == "" && !s.DefaultRoute &&
		s.DeadBefore.IsZero() && s.DeadAfter.IsZero() && s.OlderThan <= 0 && !s.All
}

// Reasons lists the dead-letter reasons a Selection may name.
func Reasons() []string { return slices.Clone(store.DeadLetterReasons) }

// Validate reports what in s can never select a dead letter: an unknown
// reason (ErrUnknownReason, naming the allowed values), or DefaultRoute
// together with a Route. List, Replay and Purge call it.
func (s Selection) Validate() error {
	if s.Reason != "" && !slices.Contains(store.DeadLetterReasons, s.Reason) {
		return fmt.Errorf("%w %q: the reasons are %s", ErrUnknownReason, s.Reason, strings.Join(store.DeadLetterReasons, ", "))
	}
	if s.DefaultRoute && s.Route != "" {
		return fmt.Errorf("%w: both the default route and route %q", ErrConflictingRoutes, s.Route)
	}
	return nil
}

func (s Selection) filter() store.DeadLetterFilter {
	return store.DeadLetterFilter{IDs: s.IDs, Topic: s.Topic, Key: s.Key, Reason: s.Reason, Route: s.Route, DefaultRoute: s.DefaultRoute,
		DeadBefore: s.DeadBefore, DeadAfter: s.DeadAfter, OlderThan: s.OlderThan}
}

func deadLetters(rows []store.DeadLetter) []DeadLetter {
	return convert(rows, func(r store.DeadLetter) DeadLetter { return DeadLetter(r) })
}

// List returns a page of the selected dead letters in (id, route) order:
// at most Limit, after (AfterID, AfterRoute). An empty selection lists
// from the first dead letter.
func (a *Admin) List(ctx context.Context, sel Selection) ([]DeadLetter, error) {
	if err := sel.Validate(); err != nil {
		return nil, err
	}
	if sel.Limit <= 0 {
		sel.Limit = DefaultLimit
	}
	rows, err := a.schema.ListDeadLetters(ctx, a.pool, sel.filter(),
		store.DeadLetterKey{ID: sel.AfterID, Route: sel.AfterRoute}, sel.Limit)
	if err != nil {
		return nil, ident.SchemaMissing(fmt.Errorf("outbox: list dead letters: %w", err), a.schema.Name())
	}
	return deadLetters(rows), nil
}

// Show returns the dead letters of one message: one, or one per fan-out
// destination whose copy died. It returns ErrNotFound when there is none.
func (a *Admin) Show(ctx context.Context, id int64) ([]DeadLetter, error) {
	rows, err := a.schema.DeadLettersOf(ctx, a.pool, id)
	if err != nil {
		return nil, ident.SchemaMissing(fmt.Errorf("outbox: show dead letter: %w", err), a.schema.Name())
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	return deadLetters(rows), nil
}

// Purge deletes the selected dead letters for good and returns how many;
// with dryRun it only counts them.
func (a *Admin) Purge(ctx context.Context, sel Selection, dryRun bool) (int64, error) {
	r, err := a.PurgeHolds(ctx, sel, dryRun)
	return r.Purged, err
}

// PurgeResult is what Purge did: the dead letters deleted (in a dry run,
// selected), and how many of them held their key (the hold policy), whose
// later messages now flow again.
type PurgeResult struct {
	DryRun       bool  `json:"dry_run"`
	Purged       int64 `json:"purged"`
	ReleasedKeys int64 `json:"released_keys"`
}

// PurgeHolds is Purge, reporting the keys it released too.
func (a *Admin) PurgeHolds(ctx context.Context, sel Selection, dryRun bool) (PurgeResult, error) {
	if sel.Empty() {
		return PurgeResult{}, ErrEmptySelection
	}
	if err := sel.Validate(); err != nil {
		return PurgeResult{}, err
	}
	if dryRun {
		n, err := a.schema.CountDeadLetters(ctx, a.pool, sel.filter())
		if err != nil {
			return PurgeResult{}, ident.SchemaMissing(fmt.Errorf("outbox: select dead letters: %w", err), a.schema.Name())
		}
		return PurgeResult{DryRun: true, Purged: n}, nil
	}
	n, released, err := a.schema.PurgeDeadLetters(ctx, a.pool, sel.filter())
	if err != nil {
		return PurgeResult{}, ident.SchemaMissing(fmt.Errorf("outbox: purge: %w", err), a.schema.Name())
	}
	if released > 0 {
		a.wake(ctx)
	}
	return PurgeResult{Purged: n, ReleasedKeys: released}, nil
}
