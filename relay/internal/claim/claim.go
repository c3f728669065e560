// Package claim holds what the engine's components say about a claimed
// batch: its rows, and the answer that defers a message to its
// destination's recovery.
package claim

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// Row is one claimed row.
type Row struct {
	Msg      sinks.Message
	Attempts int
	CTID     pgtype.TID
	Lane     int16
	// Oversize is the message's size when it is over MaxMessageBytes: the
	// claim did not read its content (Msg has none), and it is never
	// sent. 0 otherwise.
	Oversize int64
}

// Deferred marks a message whose destination is down or paused: not
// sent (or its failure is the destination's), no attempt counted; its
// row waits until Until.
type Deferred struct {
	Dest  string
	Until time.Time
	Cause error
}

func (e *Deferred) Error() string {
	return fmt.Sprintf("outbox: destination %s unavailable; waiting for it: %v", e.Dest, e.Cause)
}

func (e *Deferred) Unwrap() error { return e.Cause }

// DeferredBy returns the deferral err carries, nil when none.
func DeferredBy(err error) *Deferred {
	var de *Deferred
	if errors.As(err, &de) {
		return de
	}
	return nil
}
