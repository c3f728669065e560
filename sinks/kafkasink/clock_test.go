package kafkasink

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/internal/testkit/kafkatest"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// timestampWindow makes kfake refuse, like a broker with
// log.message.timestamp.before.max.ms and after.max.ms set to window, every
// produce request holding a record batch whose first or largest timestamp
// is more than window away from the broker's clock: each partition of such
// a request is answered INVALID_TIMESTAMP and nothing is appended. Other
// requests are appended as usual. It returns a count of produce requests
// seen.
func timestampWindow(c *kfake.Cluster, window time.Duration) *atomic.Int64 {
	var seen atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		seen.Add(1)
		req := kreq.(*kmsg.ProduceRequest)
		now := time.Now()
		bad := false
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				var rb kmsg.RecordBatch
				if err := rb.ReadFrom(rp.Records); err != nil {
					return nil, fmt.Errorf("test broker: record batch: %w", err), true
				}
				for _, ms := range []int64{rb.FirstTimestamp, rb.MaxTimestamp} {
					if d := now.Sub(time.UnixMilli(ms)); d > window || d < -window {
						bad = true
					}
				}
			}
		}
		if !bad {
			return nil, nil, false
		}
		return kafkatest.Refuse(kreq, kerr.InvalidTimestamp.Code), nil, true
	})
	return &seen
}

// skew makes the sink's host clock read off by d.
func skew(s *Sink, d time.Duration) {
	s.now = func() time.Time { return time.Now().Add(d) }
}

// TestRelayClockSkewRecordTimestamp: a relay host whose clock is two hours
// slow must not get its records refused. The record timestamp is the
// message's creation time on the database clock (CreateTime), whatever the
// relay's clock says.
func TestRelayClockSkewRecordTimestamp(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	s := newSink(t, c)
	skew(s, -2*time.Hour)
	timestampWindow(c, time.Hour)
	cons := newConsumer(t, c.ListenAddrs(), "t")

	dbNow := time.Now()
	var msgs []sinks.Message
	for i := range 20 {
		m := msg("t", fmt.Sprintf("k%d", i%4), int64(i), fmt.Sprint(i))
		m.CreatedAt = dbNow.Add(time.Duration(i-30) * time.Second).Truncate(time.Millisecond)
		m.ClaimedAt = dbNow
		msgs = append(msgs, m)
	}
	err := s.Send(context.Background(), msgs)
	require.NoError(t, err, "permanent: %v", sinks.IsPermanent(sinks.Outcome(err, 0, len(msgs))))
	byID := map[string]sinks.Message{}
	for _, m := range msgs {
		byID[m.ID] = m
	}
	for _, r := range cons.mustRead(t, len(msgs)) {
		id, _ := header(r, HeaderMessageID)
		require.True(t, byID[id].CreatedAt.Equal(r.Timestamp), "record %s: timestamp %s, created %s", id, r.Timestamp, byID[id].CreatedAt)
	}
}

// TestInvalidTimestampIsRetriable: INVALID_TIMESTAMP says the clocks
// disagree, not that the message is bad. It must not dead-letter (it is
// retriable, like an authentication failure) and must not set off the
// search for a poison record by halves. The sink tries the batch once
// more with the send time (see TestOldMessagesFallBackToSendTime), and
// that is all.
func TestInvalidTimestampIsRetriable(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	s := newSink(t, c)
	fault := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.InvalidTimestamp, Count: -1})

	now := time.Now()
	var msgs []sinks.Message
	for i := range 64 {
		m := msg("t", fmt.Sprintf("k%d", i%8), int64(i), fmt.Sprint(i))
		m.CreatedAt, m.ClaimedAt = now, now
		msgs = append(msgs, m)
	}
	err := s.Send(context.Background(), msgs)
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	permanent := 0
	for _, e := range be.Errs {
		if sinks.IsPermanent(e) {
			permanent++
		}
	}
	t.Logf("%d produce requests for %d messages on one partition; %d of %d permanent", fault.Hits(), len(msgs), permanent, len(msgs))
	require.Zero(t, permanent, "INVALID_TIMESTAMP dead-letters the batch")
	require.LessOrEqual(t, fault.Hits(), 2, "one request and one re-stamped retry, no halving")
	for i, e := range be.Errs {
		require.ErrorIs(t, e, kafka.InvalidTimestamp, "msg %d", i)
	}

	fault.Remove()
	require.NoError(t, s.Send(context.Background(), msgs))
}

// TestOldMessagesFallBackToSendTime: a broker that refuses old timestamps
// (log.message.timestamp.before.max.ms) would refuse a backlog older than
// its window forever. The sink sends a batch refused for its creation
// times once more stamped with the send time on the database clock
// (ClaimedAt plus the time since Send began), which the broker accepts,
// even though the relay host's own clock is off.
func TestOldMessagesFallBackToSendTime(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	s := newSink(t, c)
	skew(s, -2*time.Hour)
	seen := timestampWindow(c, time.Hour)
	cons := newConsumer(t, c.ListenAddrs(), "t")

	dbNow := time.Now()
	var msgs []sinks.Message
	for i := range 10 {
		m := msg("t", "k", int64(i), fmt.Sprint(i))
		m.CreatedAt = dbNow.Add(-3 * time.Hour)
		m.ClaimedAt = dbNow
		msgs = append(msgs, m)
	}
	require.NoError(t, s.Send(context.Background(), msgs))
	require.Equal(t, int64(2), seen.Load(), "the refused request and the re-stamped one")
	for _, r := range cons.mustRead(t, len(msgs)) {
		require.WithinDuration(t, dbNow, r.Timestamp, 5*time.Second, "stamped with the database's send time")
	}
}
