package settle

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/relay/internal/claim"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/topic"
)

// fixedRetry retries after wait until a message has failed limit times.
type fixedRetry struct {
	wait  time.Duration
	limit int
}

func (p fixedRetry) Retry(failures int, _ error) (time.Duration, bool) {
	return p.wait, failures < p.limit
}

var (
	errDown = errors.New("connection refused")
	errBad  = sinks.Permanent(errors.New("400 bad request"))
	errNA   = sinks.ErrNotAttempted
)

// TestDecide runs the settle decision on batches and answers, without a
// database: each message's verdict, in batch order, is D (delivered), D!
// (delivered out of order), U (untouched), R<wait> (retried) or
// X<reason> (dead-lettered; X+ when the dead letter holds its key).
func TestDecide(t *testing.T) {
	skip := Rules{Retry: fixedRetry{wait: 5 * time.Second, limit: 3}}
	hold := Rules{Retry: skip.Retry, Hold: true}
	type msg struct {
		key      string
		attempts int
		answer   error
	}
	for _, tc := range []struct {
		name  string
		rules Rules
		batch []msg
		// whole: the sink's answer for the whole batch instead of a
		// BatchError of the answers (nil: build one).
		whole error
		want  string
	}{
		{"all delivered", skip, []msg{{"a", 0, nil}, {"b", 0, nil}, {"", 0, nil}}, nil, "D D D"},
		{"retriable holds its key back, not the others", skip,
			[]msg{{"a", 0, errDown}, {"a", 0, nil}, {"b", 0, nil}, {"a", 0, errDown}}, nil, "R5s D! D U"},
		{"later failures of a held key are untouched", skip,
			[]msg{{"a", 0, errDown}, {"a", 0, errDown}, {"a", 0, errNA}}, nil, "R5s U U"},
		{"permanent dead-letters and the key goes on (skip)", skip,
			[]msg{{"a", 0, errBad}, {"a", 0, nil}, {"a", 0, errDown}}, nil, "Xpermanent D R5s"},
		{"permanent holds the key (hold)", hold,
			[]msg{{"a", 0, errBad}, {"a", 0, nil}, {"a", 0, errDown}, {"b", 0, nil}}, nil, "X+permanent D! U D"},
		{"max attempts dead-letters", skip,
			[]msg{{"a", 2, errDown}, {"a", 1, errDown}, {"b", 1, errDown}}, nil, "Xmax_attempts R5s R5s"},
		{"max attempts holds the key (hold)", hold,
			[]msg{{"a", 2, errDown}, {"a", 0, errDown}}, nil, "X+max_attempts U"},
		{"not attempted holds its key back", skip,
			[]msg{{"a", 0, errNA}, {"a", 0, errDown}, {"b", 0, errNA}, {"", 0, errNA}}, nil, "U U U U"},
		{"keyless messages are never held", hold,
			[]msg{{"", 0, errDown}, {"", 0, errBad}, {"", 0, nil}}, nil, "R5s Xpermanent D"},
		{"an error for the whole batch fails each key's first message", skip,
			[]msg{{"a", 0, nil}, {"a", 0, nil}, {"b", 0, nil}, {"", 0, nil}}, errDown, "R5s U R5s R5s"},
		{"a batch error of another size counts as the whole batch's", skip,
			[]msg{{"a", 0, nil}, {"b", 0, nil}}, &sinks.BatchError{Errs: []error{nil}}, "R5s R5s"},
		{"a permanent error for the whole batch", skip,
			[]msg{{"a", 0, nil}, {"a", 0, nil}}, errBad, "Xpermanent Xpermanent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			batch := make([]claim.Row, len(tc.batch))
			be := sinks.NewBatchError(len(tc.batch))
			for i, m := range tc.batch {
				batch[i] = claim.Row{Attempts: m.attempts, Msg: sinks.Message{Seq: int64(i + 1), Key: m.key, ID: fmt.Sprint("m", i)}}
				be.Errs[i] = m.answer
			}
			var sendErr error = be
			if tc.whole != nil {
				sendErr = tc.whole
			}
			s := Decide(batch, sendErr, tc.rules)
			if got := verdicts(s, len(batch)); got != tc.want {
				t.Fatalf("verdicts %q, want %q", got, tc.want)
			}
			checkParallel(t, s)
		})
	}
}

// verdicts renders s in the notation of TestDecide. The rows of a batch
// built there have Seq = index+1.
func verdicts(s Settlement, n int) string {
	v := make([]string, n)
	for i := range v {
		v[i] = "U"
	}
	for _, id := range s.delivered {
		v[id-1] = "D"
	}
	for k, id := range s.retries.Seqs {
		v[id-1] = "R" + (time.Duration(s.retries.DelayMillis[k]) * time.Millisecond).String()
	}
	for k, id := range s.dead.Seqs {
		v[id-1] = "X" + s.dead.Reasons[k]
	}
	for _, nt := range s.notes {
		switch {
		case nt.outOfOrder:
			v[nt.at] += "!"
		case nt.holds:
			v[nt.at] = "X+" + v[nt.at][1:]
		}
	}
	untouched := 0
	for _, x := range v {
		if x == "U" {
			untouched++
		}
	}
	if untouched != s.untouched {
		return fmt.Sprintf("untouched counted %d, found %d: %s", s.untouched, untouched, strings.Join(v, " "))
	}
	return strings.Join(v, " ")
}

// checkParallel fails unless s's parallel slices agree and every failure
// is noted for the log with its error.
func checkParallel(t *testing.T, s Settlement) {
	t.Helper()
	if len(s.delivered) != len(s.deliveredTIDs) || len(s.retries.Seqs) != len(s.retries.DelayMillis) ||
		len(s.retries.Seqs) != len(s.retries.Errors) || len(s.dead.Seqs) != len(s.dead.Reasons) || len(s.dead.Seqs) != len(s.dead.Errors) {
		t.Fatalf("parallel slices disagree: %+v", s)
	}
	failed := 0
	for _, n := range s.notes {
		if !n.outOfOrder {
			failed++
			if n.err == nil {
				t.Fatalf("note without its error: %+v", n)
			}
		}
	}
	if failed != len(s.retries.Seqs)+len(s.dead.Seqs) {
		t.Fatalf("%d failures noted for %d retried and dead-lettered", failed, len(s.retries.Seqs)+len(s.dead.Seqs))
	}
}

// TestRoute: the router copies each message to every destination whose
// topics match, and dead-letters one no destination takes.
func TestRoute(t *testing.T) {
	// What relay.Config's fan-out destinations say: billing takes
	// orders.*, audit every topic but orders.draft.
	routes := func(t string) []string {
		var out []string
		if topic.Match("orders.*", t) {
			out = append(out, "billing")
		}
		if t != "orders.draft" {
			out = append(out, "audit")
		}
		return out
	}
	billingOnly := func(t string) []string {
		if topic.Match("orders.*", t) {
			return []string{"billing"}
		}
		return nil
	}
	batch := []claim.Row{
		{Msg: sinks.Message{Seq: 1, Topic: "orders.paid"}},
		{Msg: sinks.Message{Seq: 2, Topic: "orders.draft"}},
		{Msg: sinks.Message{Seq: 3, Topic: "users.created"}},
	}
	s := Route(batch, routes)
	got := fmt.Sprint(s.copies.Seqs, s.copies.Routes, s.delivered)
	if want := "[1 1 2 3] [billing audit billing audit] [1 2 3]"; got != want {
		t.Fatalf("copies %s, want %s", got, want)
	}
	s = Route(batch, billingOnly)
	if fmt.Sprint(s.delivered, s.dead.Seqs, s.dead.Reasons) != "[1 2] [3] [permanent]" || !strings.Contains(s.dead.Errors[0], `"users.created"`) {
		t.Fatalf("unroutable message: delivered %v, dead %v %v %q", s.delivered, s.dead.Seqs, s.dead.Reasons, s.dead.Errors)
	}
	checkParallel(t, s)
}
