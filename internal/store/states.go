package store

// The states of a message, defined once. A row of the outbox (messages) or
// of a fan-out route's copies (deliveries) is in exactly one of:
//
//   - ready: deliverable now; the claim takes it (unless an earlier
//     message of its key is held back, see Held).
//   - retrying: it failed at least once and waits for its next attempt
//     (attempts > 0, available_at in the future).
//   - delayed: written with a delivery time that has not come yet
//     (attempts = 0, available_at in the future).
//
// Pending is the three together: every message not yet delivered. Dead is
// a row of dead_letters: the relay gave up on it and an operator may replay
// or purge it.
//
// A route with the hold policy leaves a dead-lettered message with a key
// in its table, parked (Parked): available_at 'infinity', so that it
// holds back the later messages of its key exactly as a retry does, until
// an operator replays or purges its dead letter. A parked row is a dead
// letter, not a pending message: it is in none of the three states.
//
// A failed message keeps attempts > 0 and a non-NULL available_at until it
// is delivered or dead, so "has failed and is not done" (Failed) is the
// count operators and metrics show as retrying whether or not its next
// attempt is due; the partial indexes on available_at IS NOT NULL serve
// both Failed and Waiting.
//
// Each function returns a condition on the row alias a.

// Ready is true of a row that can be delivered now.
func Ready(a string) string {
	return "(" + a + ".available_at IS NULL OR " + a + ".available_at <= now())"
}

// Waiting is true of a row held back until its available_at: a retry or
// a delayed delivery.
func Waiting(a string) string {
	return "(" + a + ".available_at IS NOT NULL AND " + a + ".available_at > now())"
}

// Failed is true of a row that failed at least once and is neither
// delivered nor dead: the "retrying" of status and metrics.
func Failed(a string) string {
	return "(" + a + ".available_at IS NOT NULL AND " + a + ".attempts > 0 AND " + a + ".held_since IS NULL)"
}

// Parked is true of a dead-lettered row kept in place to hold its key (the
// hold policy).
func Parked(a string) string {
	return "(" + a + ".held_since IS NOT NULL)"
}

// ParkedUntil is the available_at of a parked row: never due, so the
// claim's check for a waiting earlier message of the key (Waiting) holds
// the key back.
const ParkedUntil = "'infinity'::timestamptz"

// Delayed is true of a row written with a delivery time still to come.
func Delayed(a string) string {
	return "(" + a + ".attempts = 0 AND " + Waiting(a) + " AND " + a + ".held_since IS NULL)"
}

// Queued is the "ready" of status and metrics: deliverable now and never
// failed. Queued, Failed and Delayed partition the pending rows (a failed
// message counts as retrying until it is delivered or dead, even once its
// next attempt is due, when Ready is true of it too).
func Queued(a string) string {
	return "(" + Ready(a) + " AND NOT " + Failed(a) + ")"
}
