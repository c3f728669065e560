package relay_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// Issue 34: the "deliveries failing" warning counts what happened to the
// messages, in numbers that agree: one message failed and was retried,
// three of its key were held back untried; its error is the message's
// own, not the batch's "4 of 4 messages failed".
func TestFailingLogCountsAgree(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sink.SetFail(func(m sinks.Message) error {
		if string(m.Payload) == "first" {
			return errors.New("receiver says 503")
		}
		return nil
	})
	e.write(msg("t", "k", "first"), msg("t", "k", "2"), msg("t", "k", "3"), msg("t", "k", "4"))
	var logs testkit.SyncBuffer
	cfg := e.config()
	cfg.Workers = 1
	cfg.RetryInitial, cfg.RetryMax = time.Minute, time.Minute // one failure, then quiet
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	e.start(cfg, e.sink)
	eventually(t, 20*time.Second, func() bool { return strings.Contains(logs.String(), "deliveries failing") }, "no warning: %s", logs.String())
	require.Regexp(t, `msg="deliveries failing" relay_id=\S+ failed=1 retried=1 dead_lettered=0 held_back=3 error="receiver says 503"\n`, logs.String())
}
