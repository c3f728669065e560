package operator

import (
	"context"
	"fmt"
	"slices"

	"github.com/outbox-relay/outbox-relay/internal/ident"
	"github.com/outbox-relay/outbox-relay/internal/store"
)

// ReplayOptions tune Replay.
type ReplayOptions struct {
	// DryRun only reports what Replay would do, without changing or
	// locking anything.
	DryRun bool `json:"dry_run,omitempty"`
	// ClearConflictingDedupKeys replays a dead letter whose dedup key is
	// held by a pending message (or by an earlier dead letter replayed in
	// the same run) without its dedup key, instead of skipping it. Default
	// false: such a dead letter is skipped and stays in the table.
	ClearConflictingDedupKeys bool `json:"clear_conflicting_dedup_keys,omitempty"`
}

// ReplayOutcome says what Replay did with one dead letter.
type ReplayOutcome string

// Replay outcomes.
const (
	// Replayed: back in the outbox (or, for a dead fan-out copy, in its
	// destination's deliveries) with its dedup key.
	Replayed ReplayOutcome = "replayed"
	// ReplayedWithoutDedupKey: replayed with its dedup key cleared,
	// because another message held the key (ClearConflictingDedupKeys).
	ReplayedWithoutDedupKey ReplayOutcome = "replayed_without_dedup_key"
	// ReplaySkipped: left in the dead-letter table; Reason says why.
	ReplaySkipped ReplayOutcome = "skipped"
)

// ReplayCause is why Replay skipped a dead letter or cleared its dedup
// key.
type ReplayCause string

// Replay causes.
const (
	// CauseDedupKeyPending: a pending message holds the dedup key (HeldBy).
	CauseDedupKeyPending ReplayCause = "dedup_key_pending"
	// CauseDedupKeyInRun: an older dead letter replayed in the same run
	// took the dedup key.
	CauseDedupKeyInRun ReplayCause = "dedup_key_in_run"
	// CauseIDPending: the message (or, for a fan-out copy, its copy for
	// that route) is pending already.
	CauseIDPending ReplayCause = "id_pending"
	// CauseBusy: another transaction held the dead letter (a concurrent
	// replay or purge).
	CauseBusy ReplayCause = "busy"
	// CauseConflict: another unique index of the outbox refused it.
	CauseConflict ReplayCause = "conflict"
)

// ReplayedDeadLetter is what Replay did (or, in a dry run, would do) with
// one selected dead letter.
type ReplayedDeadLetter struct {
	ID        int64   `json:"id"`
	Route     string  `json:"route"`
	MessageID string  `json:"message_id"`
	DedupKey  *string `json:"dedup_key"`
	// Outcome is replayed, replayed_without_dedup_key or skipped.
	Outcome ReplayOutcome `json:"outcome"`
	// Cause says, for a skip or a cleared dedup key, what stood in the
	// way (one of the ReplayCause constants); Reason says it in words.
	// Both are empty for a dead letter replayed as it was.
	Cause  ReplayCause `json:"cause,omitempty"`
	Reason string      `json:"reason,omitempty"`
	// HeldBy is the message id of the pending message that holds the
	// dead letter's dedup key, when that is why it was skipped or cleared
	// (and the message was visible when the replay started).
	HeldBy string `json:"held_by,omitempty"`
}

// ReplayResult reports Replay's decision for every selected dead letter,
// in id order.
type ReplayResult struct {
	DryRun      bool                 `json:"dry_run"`
	DeadLetters []ReplayedDeadLetter `json:"dead_letters"`
}

// IDs returns the ids of the dead letters with one of the outcomes (all
// of them when none is given).
func (r ReplayResult) IDs(outcomes ...ReplayOutcome) []int64 {
	var ids []int64
	for _, d := range r.DeadLetters {
		if len(outcomes) == 0 || slices.Contains(outcomes, d.Outcome) {
			ids = append(ids, d.ID)
		}
	}
	return ids
}

// Count returns how many dead letters had outcome o.
func (r ReplayResult) Count(o ReplayOutcome) int {
	n := 0
	for _, d := range r.DeadLetters {
		if d.Outcome == o {
			n++
		}
	}
	return n
}

// Replay moves the selected dead letters back into the outbox under their
// original id and message id, with a fresh attempt count; a dead fan-out
// copy goes back to its own destination only (the routes that delivered
// the message do not get it again). Rows another operator is replaying at
// the same moment are skipped, so two concurrent replays never publish a
// message twice.
//
// A dead letter whose dedup key a pending message holds (the application
// wrote the operation again while it was dead) is skipped and stays in the
// table: replaying it too would publish the operation twice under two
// message ids, which consumers deduplicating by message id cannot catch.
// The operator decides: purge it, replay it once the pending message is
// delivered, or replay it without its dedup key
// (ReplayOptions.ClearConflictingDedupKeys). The same holds for several
// selected dead letters sharing a dedup key: the oldest gets the key. One
// such conflict never stops the others from being replayed.
func (a *Admin) Replay(ctx context.Context, sel Selection, opts ReplayOptions) (ReplayResult, error) {
	if sel.Empty() {
		return ReplayResult{}, ErrEmptySelection
	}
	if err := sel.Validate(); err != nil {
		return ReplayResult{}, err
	}
	replay := a.schema.ReplayDeadLetters
	if opts.DryRun {
		replay = a.schema.PlanReplay
	}
	rows, err := replay(ctx, a.pool, sel.filter(), opts.ClearConflictingDedupKeys)
	if err != nil {
		return ReplayResult{}, ident.SchemaMissing(fmt.Errorf("outbox: replay: %w", err), a.schema.Name())
	}
	if !opts.DryRun && len(rows) > 0 {
		a.wake(ctx)
	}
	return ReplayResult{DryRun: opts.DryRun, DeadLetters: convert(rows, explain)}, nil
}

// explain says, for a dead letter not replayed as it was, what stood in
// the way.
func explain(r store.ReplayedRow) ReplayedDeadLetter {
	d := ReplayedDeadLetter{ID: r.ID, Route: r.Route, MessageID: r.MessageID, DedupKey: r.DedupKey, Outcome: ReplayOutcome(r.Outcome)}
	if d.Outcome == Replayed {
		return d
	}
	key := ""
	if d.DedupKey != nil {
		key = *d.DedupKey
	}
	switch {
	case r.Busy:
		d.Cause = CauseBusy
		d.Reason = "locked by another transaction (a concurrent replay or purge): replay it again if it is still listed"
	case r.IDPending && d.Route != "":
		d.Cause = CauseIDPending
		d.Reason = fmt.Sprintf("a copy of message %d is already pending for route %q", d.ID, d.Route)
	case r.IDPending:
		d.Cause = CauseIDPending
		d.Reason = fmt.Sprintf("message %d is already pending in the outbox", d.ID)
	case r.KeyHolder != nil:
		d.Cause, d.HeldBy = CauseDedupKeyPending, *r.KeyHolder
		d.Reason = fmt.Sprintf("dedup key %q is held by pending message %s", key, *r.KeyHolder)
	case r.RunHolder != nil:
		d.Cause = CauseDedupKeyInRun
		d.Reason = fmt.Sprintf("dedup key %q went to dead letter %d, replayed in the same run", key, *r.RunHolder)
	case d.DedupKey != nil:
		// The holder committed after the replay's snapshot was taken.
		d.Cause = CauseDedupKeyPending
		d.Reason = fmt.Sprintf("dedup key %q is held by a message written during the replay", key)
	default:
		// Another unique index of the outbox refused it.
		d.Cause = CauseConflict
		d.Reason = "a pending message written during the replay conflicts with it"
	}
	if d.Outcome == ReplaySkipped && (d.Cause == CauseDedupKeyPending || d.Cause == CauseDedupKeyInRun) {
		d.Reason += ": purge it if that is the same operation, or replay it once the key is free or without its dedup key"
	}
	return d
}
