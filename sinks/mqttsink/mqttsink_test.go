package mqttsink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"

	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	b := broker(t)
	sinktest.Run(t, sinktest.Harness{
		Features: sinktest.Features{Poison: true, Transient: true, Restart: true, Outage: true,
			Why: map[string]string{"Partitions": "an MQTT topic has no partitions"}},
		Setup: func(t *testing.T) *sinktest.Env {
			e := setup(t, b)
			return &sinktest.Env{
				Sink:  e.sink,
				Topic: e.topic,
				Read: func(ctx context.Context, n int) ([]sinktest.Delivered, error) {
					ps, err := e.sub.Read(ctx, n)
					out := make([]sinktest.Delivered, len(ps))
					for i, p := range ps {
						out[i] = delivered(p)
					}
					return out, err
				},
				// The broker's ACL denies the topic: PUBACK 0x87.
				Poison: func(topic string) sinks.Message {
					m := sinktest.Msg(topic, "", 0, []byte("poison"))
					m.Headers = map[string]string{"x-test-route": deniedPrefix}
					return m
				},
				// The proxy refuses connections: the broker is unreachable.
				BreakTransient: e.proxy.Break,
				// The sink's connection is cut (through the proxy).
				Restart: e.proxy.Restart,
				Down:    e.proxy.Down,
				Up:      e.proxy.Up,
			}
		},
	})
}

// TestPubackErrorIsPermanent: a topic the broker's ACL denies comes back
// in a PUBACK with 0x87 (not authorized), permanent for that message; the
// later message of its key is not attempted, other keys flow.
func TestPubackErrorIsPermanent(t *testing.T) {
	t.Parallel()
	e := setup(t, broker(t), withConfig(func(c *Config) { c.Topic = "{topic}" }))
	ok := e.topic("ok")
	batch := []sinks.Message{
		sinktest.Msg(ok, "a", 1, []byte("1")),
		sinktest.Msg(deniedPrefix+e.prefix, "b", 2, []byte("2")),
		sinktest.Msg(ok, "b", 3, []byte("3")),
		sinktest.Msg(ok, "", 4, []byte("4")),
	}
	err := e.sink.Send(context.Background(), batch)
	be := &sinks.BatchError{}
	require.ErrorAs(t, err, &be)
	require.NoError(t, be.Errs[0])
	require.True(t, sinks.IsPermanent(be.Errs[1]), "%v", be.Errs[1])
	var pe *PubackError
	require.ErrorAs(t, be.Errs[1], &pe)
	require.Equal(t, byte(0x87), pe.ReasonCode)
	require.Contains(t, be.Errs[1].Error(), "not authorized")
	require.ErrorIs(t, be.Errs[2], sinks.ErrNotAttempted)
	require.NoError(t, be.Errs[3])
	got, err := e.sub.Read(context.Background(), 2)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{batch[0].ID, batch[3].ID}, []string{delivered(got[0]).ID, delivered(got[1]).ID})
}

// TestPubackClassification: every PUBACK error code of MQTT 5 (3.4.2.1),
// and the server-wide codes of CONNACK and DISCONNECT that a broker may
// send in a PUBACK too: 0x87, 0x90, 0x95 and 0x99 are the message's and
// permanent; 0x97, 0x88, 0x89 and 0x8B say the broker takes nothing now
// (the relay's breaker opens on them across keys); the others are
// retriable failures of the message.
func TestPubackClassification(t *testing.T) {
	t.Parallel()
	const permanent, unavailable, retriable = "permanent", "unavailable", "retriable"
	for rc, want := range map[byte]string{
		0x80: retriable, 0x83: retriable, 0x87: permanent, 0x90: permanent, 0x91: retriable,
		0x97: unavailable, 0x99: permanent, // the PUBACK list
		0x88: unavailable, 0x89: unavailable, 0x8B: unavailable, 0x95: permanent,
	} {
		pe := &PubackError{ReasonCode: rc}
		err := pe.classified()
		got := retriable
		switch {
		case sinks.IsPermanent(err):
			got = permanent
		case errors.Is(err, sinks.ErrUnavailable):
			got = unavailable
		}
		require.Equal(t, want, got, "0x%02X: %v", rc, err)
		require.Equal(t, want == permanent, pe.Permanent(), "0x%02X", rc)
		require.Equal(t, want == unavailable, pe.Unavailable(), "0x%02X", rc)
		require.ErrorAs(t, err, &pe)
		require.NotContains(t, err.Error(), "unknown", "0x%02X has a name", rc)
	}
	require.ErrorIs(t, (&PubackError{ReasonCode: 0x95}).classified(), ErrTooLarge)
}

// TestTooLargeIsPermanent: a message over the broker's Maximum Packet
// Size (2 MiB in the test broker's CONNACK) is refused before sending,
// with the sizes; one just under it is delivered.
func TestTooLargeIsPermanent(t *testing.T) {
	t.Parallel()
	e := setup(t, broker(t))
	ctx := context.Background()
	topic := e.topic("big")
	require.NoError(t, e.sink.Send(ctx, []sinks.Message{sinktest.Msg(topic, "w", 1, []byte("warm"))}))
	fits := sinktest.Msg(topic, "c", 4, nil)
	p, err := e.sink.prepare(fits, 0)
	require.NoError(t, err)
	fits.Payload = make([]byte, 2097152-packetSize(p)-8) // room for a longer seq
	batch := []sinks.Message{
		sinktest.Msg(topic, "a", 2, make([]byte, 2097152)),
		sinktest.Msg(topic, "a", 3, []byte("after")),
		fits,
	}
	err = e.sink.Send(ctx, batch)
	e0 := sinks.Outcome(err, 0, 3)
	require.True(t, sinks.IsPermanent(e0), "%v", e0)
	require.ErrorIs(t, e0, ErrTooLarge)
	require.Contains(t, e0.Error(), "Maximum Packet Size of 2097152")
	require.ErrorIs(t, sinks.Outcome(err, 1, 3), sinks.ErrNotAttempted)
	require.NoError(t, sinks.Outcome(err, 2, 3))
	got, err := e.sub.Read(ctx, 2)
	require.NoError(t, err)
	require.Equal(t, fits.ID, delivered(got[1]).ID)
}

// TestPacketSize: packetSize is the PUBLISH packet's encoded length.
func TestPacketSize(t *testing.T) {
	t.Parallel()
	s := &Sink{}
	for _, n := range []int{0, 100, 200, 20000, 3000000} {
		m := sinktest.Msg("a/b", "key", 12345, make([]byte, n))
		m.Headers = map[string]string{"x": "y", "content-type": "application/json"}
		p, err := s.prepare(m, 0)
		require.NoError(t, err)
		pb := p.Packet()
		pb.PacketID = 1
		var buf bytes.Buffer
		_, err = pb.WriteTo(&buf)
		require.NoError(t, err)
		require.Equal(t, buf.Len(), packetSize(p), "payload %d", n)
	}
}

// TestBadTopicIsPermanent: a topic that renders empty or with a wildcard
// is refused before sending.
func TestBadTopicIsPermanent(t *testing.T) {
	t.Parallel()
	e := setup(t, broker(t), withConfig(func(c *Config) { c.Topic = "{topic}" }))
	batch := []sinks.Message{
		sinktest.Msg("", "", 1, []byte("1")),
		sinktest.Msg(e.topic("+"), "", 2, []byte("2")),
		sinktest.Msg(e.topic("#"), "", 3, []byte("3")),
		sinktest.Msg(e.topic("fine"), "", 4, []byte("4")),
	}
	err := e.sink.Send(context.Background(), batch)
	for i := range 3 {
		ei := sinks.Outcome(err, i, 4)
		require.True(t, sinks.IsPermanent(ei), "message %d: %v", i, ei)
		require.ErrorIs(t, ei, ErrBadTopic)
	}
	require.NoError(t, sinks.Outcome(err, 3, 4))
}

// TestProperties: headers go as user properties beside outbox-id,
// outbox-seq and outbox-key (which replace application headers of those
// names); content-type goes as the Content Type property; the payload as
// it is.
func TestProperties(t *testing.T) {
	t.Parallel()
	e := setup(t, broker(t))
	m := sinktest.Msg(e.topic("props"), "k1", 42, []byte{0, 1, 2, 0xff})
	m.Headers = map[string]string{"trace": "abc", "Content-Type": "application/json", PropID: "forged", "ünï": "cödé"}
	require.NoError(t, e.sink.Send(context.Background(), []sinks.Message{m}))
	got, err := e.sub.Read(context.Background(), 1)
	require.NoError(t, err)
	p := got[0]
	require.Equal(t, m.Payload, p.Payload)
	require.Equal(t, "application/json", p.Properties.ContentType)
	props := map[string][]string{}
	for _, u := range p.Properties.User {
		props[u.Key] = append(props[u.Key], u.Value)
	}
	require.Equal(t, map[string][]string{"trace": {"abc"}, "ünï": {"cödé"}, PropID: {m.ID}, PropSeq: {"42"}, PropKey: {"k1"}}, props)
}

// TestUnreachableIsNotAttempted: while the broker cannot be reached, a
// Send reports every message not attempted (the relay spends no
// attempts); once it is back, the same messages go out.
func TestUnreachableIsNotAttempted(t *testing.T) {
	t.Parallel()
	e := setup(t, broker(t), withConfig(func(c *Config) { c.PublishTimeout = 300 * time.Millisecond }))
	ctx := context.Background()
	topic := e.topic("down")
	require.NoError(t, e.sink.Send(ctx, sinktest.Batch(topic, 1, 1, 10)))
	restore := e.proxy.Break()
	testkit.Eventually(t, 5*time.Second, 5*time.Millisecond, func() (bool, string) {
		return e.sink.Healthy(ctx) != nil, "the sink still reports a connection"
	})
	batch := sinktest.Batch(topic, 20, 4, 10)
	err := e.sink.Send(ctx, batch)
	require.Error(t, err)
	for i := range batch {
		ei := sinks.Outcome(err, i, len(batch))
		require.ErrorIs(t, ei, sinks.ErrNotAttempted, "message %d", i)
	}
	require.ErrorIs(t, err, ErrNotConnected)
	restore()
	testkit.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		err := e.sink.Send(ctx, batch)
		return err == nil, fmt.Sprint(err)
	})
}

// TestCheckStartRefused: a broker that refuses the credentials fails
// CheckStart with its reason; a reachable one passes at once.
func TestCheckStartRefused(t *testing.T) {
	t.Parallel()
	b := throwaway.Mosquitto(t, "allow_anonymous false") // and no password file: every client refused
	ctx := context.Background()
	s, err := New(Config{URL: "mqtt://nobody:wrong@" + b.Addr(), ReconnectInitial: 20 * time.Millisecond, ReconnectMax: 50 * time.Millisecond}, nil)
	require.NoError(t, err)
	defer s.Close(ctx)
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err = s.CheckStart(cctx)
	require.Error(t, err)
	require.Contains(t, err.Error(), "refuses the connection")
	e := setup(t, broker(t))
	require.NoError(t, e.sink.CheckStart(ctx))
}

// TestHungBrokerIsUnavailable: a broker that keeps the connection open
// and answers nothing (the proxy holds every byte) leaves the messages
// of a Send without their PUBACK at the publish timeout: unavailable, so
// the relay's breaker spends no attempts when it happens across keys.
// Once the broker answers again, the same messages go out.
func TestHungBrokerIsUnavailable(t *testing.T) {
	t.Parallel()
	e := setup(t, broker(t), withConfig(func(c *Config) { c.PublishTimeout = 500 * time.Millisecond }))
	ctx := context.Background()
	topic := e.topic("hung")
	require.NoError(t, e.sink.Send(ctx, sinktest.Batch(topic, 1, 1, 10)))
	resume := e.proxy.Hold()
	batch := sinktest.Batch(topic, 8, 4, 10)
	err := e.sink.Send(ctx, batch)
	resume()
	require.Error(t, err)
	hung := 0
	for i := range batch {
		oe := sinks.Outcome(err, i, len(batch))
		if oe == nil || errors.Is(oe, sinks.ErrNotAttempted) {
			continue // a key's later message, not sent after its first failed
		}
		require.ErrorIs(t, oe, sinks.ErrUnavailable, "message %d", i)
		require.ErrorIs(t, oe, ErrNoPuback, "message %d", i)
		hung++
	}
	require.Positive(t, hung, "no message waited for its PUBACK")
	testkit.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		err := e.sink.Send(ctx, batch)
		return err == nil, fmt.Sprint(err)
	})
}
