// Package sinktest is the conformance suite every sinks.Sink must pass
// against a real backend before the relay may use it.
//
// The suite checks the contract written on sinks.Sink: one message and
// batches arrive with their stable id, position (Seq), key, headers and
// exact payload bytes;
// messages sharing a key arrive in Seq order; an empty batch delivers
// nothing; a cancelled context returns promptly with a retriable error;
// concurrent Sends are safe; Close is idempotent and later Sends fail with
// sinks.ErrClosed; per-message outcomes land on the right index of a
// *sinks.BatchError, a poison message is Permanent and stops only its own
// key (later messages of that key are sinks.ErrNotAttempted); a broken
// backend yields retriable errors and Sends recover once it is back; a
// destination that is down is reported as an outage (sinks.NotSent or
// sinks.ErrUnavailable on every message), not as failures of the messages,
// so that the relay counts no attempt and opens its outage breaker; and,
// for partitioned backends, one key always lands on one partition.
//
// It lives outside the sink packages so that every backend is held to the
// same checks, and it is an ordinary (non _test) package so that sink tests
// can import it. It has no broker dependencies.
//
// # Adopting the suite in a new sink
//
// In the sink's package, add a test that builds a Harness and calls Run:
//
//	func TestConformance(t *testing.T) {
//		t.Parallel()
//		sinktest.Run(t, sinktest.Harness{
//			Features: sinktest.Features{
//				Partitions: true, Poison: true, Transient: true, Restart: true,
//				Outage: true,
//			},
//			Setup: func(t *testing.T) *sinktest.Env {
//				// Connect to the real backend (skip, or fail under CI=true,
//				// when it is unreachable), create an isolated destination
//				// (a fresh topic, queue or HTTP route), build the sink and
//				// a real consumer, and register cleanup with t.Cleanup.
//				return &sinktest.Env{Sink: s, Topic: ..., Read: ..., ...}
//			},
//		})
//	}
//
// Setup is called once per subtest, often in parallel, so every Env must be
// isolated from the others: a message sent through one Env must never be
// read through another. Read must come from a real consumer of the backend
// (a Kafka consumer, an AMQP basic.consume, the body an HTTP server
// received), not from the sink's own bookkeeping, because the point is to
// see what a consumer sees. Read returns messages in arrival order and may
// return duplicates (delivery is at least once); the suite deduplicates on
// Delivered.ID. Read must not consume more than n messages, because the
// suite reads exactly as many as it still expects.
//
// Set a Features flag to false when the backend cannot support the check,
// and say why in Features.Why under the flag's name ("Partitions",
// "Poison", "Transient", "Restart", "Outage"): the reason is printed in t.Skip, and
// Run fails when it is missing, so that a skipped check is always a
// decision somebody wrote down.
//
// The Transient, Restart and Outage subtests run one after the other and never
// alongside the other subtests of the same Run, since breaking,
// restarting or stopping a backend may affect every destination on it.
// All other subtests call t.Parallel.
//
// # Outages
//
// The Outage subtest takes the destination down with Env.Down (stop the
// throwaway server, the broker or the receiver, or close a proxy in front
// of it so that connections are refused), sends a batch over several keys
// and keyless messages with a context of OutageTimeout, and requires
// every message's outcome to say "the destination is down": retriable,
// and either marked sinks.NotSent (nothing left the relay: a refused
// connection, an unresolvable host, no connection before the context
// ended) or wrapping sinks.ErrUnavailable (sent without an answer, or the
// destination answered that it is unavailable). A later message of a key
// whose earlier message failed may instead be the bare
// sinks.ErrNotAttempted. A plain retriable error fails the check: the
// relay would count an attempt for every message of the batch and back
// each row off, instead of leaving the batch untouched and probing the
// destination until it is back. After Env.Up, Sends must deliver the
// batch again (possibly after a few retriable failures).
//
// The large-payload check sends LargePayloadSize bytes, 1 MiB less 64 KiB,
// so that the message and its headers fit under Kafka's default 1 MiB
// message limit (message.max.bytes, and kafka-go's Writer.BatchBytes): the
// suite checks that big payloads arrive intact, not that a backend accepts
// more than its documented default.
package sinktest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// Delivered is one message as read back from the backend by a real consumer.
type Delivered struct {
	ID        string // the stable message id as the backend carries it
	Seq       int64  // the message's position (sinks.Message.Seq) as the backend carries it
	Topic     string // logical topic (as the sink's Topic() mapping returned it)
	Key       string // "" when none
	Payload   []byte
	Headers   map[string]string // application headers; may contain extra sink headers, the suite checks the app headers are a subset
	Partition int               // -1 when the backend has no partitions
}

// Features says which optional parts of the suite a backend supports.
type Features struct {
	Partitions bool // Delivered.Partition is meaningful; suite checks same key => same partition
	Poison     bool // Env.Poison is set
	Transient  bool // Env.BreakTransient is set
	Restart    bool // Env.Restart is set
	Outage     bool // Env.Down and Env.Up are set
	// Dedup says the backend drops a message whose id it already stored
	// (NATS JetStream's duplicate window): StableIDOnRetry then checks
	// that the resend succeeds and is not stored a second time, instead
	// of reading it again.
	Dedup bool
	// MaxPayload, when not 0, is the largest payload the backend takes
	// (SQS: a message of 256 KiB with its attributes, base64-encoded):
	// PayloadBytesExact sends a payload of this size instead of
	// LargePayloadSize. Why["MaxPayload"] must say why.
	MaxPayload int
	// NoEmptyPayload says the backend refuses an empty payload (an SQS
	// message body has at least one character): PayloadBytesExact leaves
	// the empty one out. Why["NoEmptyPayload"] must say why.
	NoEmptyPayload bool
	// Why explains each false feature (printed in t.Skip).
	Why map[string]string
}

// Env is one isolated destination on the backend plus the sink under test.
type Env struct {
	Sink sinks.Sink
	// Topic returns a topic name routed to this Env's isolated destination.
	Topic func(suffix string) string
	// Read returns the next n messages that arrived at the backend, in arrival order, failing after ctx ends.
	Read func(ctx context.Context, n int) ([]Delivered, error)
	// Poison returns a message (on the given topic) that the backend can never accept; Send must report it Permanent.
	//
	// Each call must return a new message with a fresh ID. The suite sets
	// Key when the returned Key is empty and always sets Seq, so the
	// poison must not depend on either.
	Poison func(topic string) sinks.Message
	// BreakTransient makes the backend fail deliveries with a retriable error until restore is called.
	BreakTransient func() (restore func())
	// Restart drops the sink's connections or restarts the backend; later Sends must recover (possibly after a few failed, retriable attempts).
	Restart func() error
	// Down takes the destination down as a whole (the server stopped, its
	// port refusing connections) until Up; see the package doc, Outages.
	Down func() error
	// Up brings the destination back after Down; the suite also calls it
	// when the test ends, so a second call must be harmless.
	Up func() error
}

// Harness adapts one sink to the suite.
type Harness struct {
	Features Features
	// Setup gives each subtest a fresh Env on an isolated destination; register cleanup with t.Cleanup.
	Setup func(t *testing.T) *Env
}

// Timeouts used by the suite. They are generous because they only bound a
// failing run; a passing run never waits for them.
const (
	// ReadTimeout bounds how long a subtest waits for messages to arrive.
	ReadTimeout = 30 * time.Second
	// PromptTimeout bounds how long Send with a cancelled context and Close
	// may take before the suite calls them hung.
	PromptTimeout = 10 * time.Second
	// RecoverTimeout bounds how long Sends may keep failing after the
	// backend was restored or restarted.
	RecoverTimeout = 45 * time.Second
	// OutageTimeout bounds the Send made while the destination is down: a
	// sink may wait for a connection until its context ends, and must then
	// report the outage.
	OutageTimeout = 3 * time.Second
	// LargePayloadSize is the size of the large payload (see package doc).
	LargePayloadSize = 1<<20 - 64<<10
)

// Run runs the conformance suite as subtests of t.
func Run(t *testing.T, h Harness) {
	t.Helper()
	require.NotNil(t, h.Setup, "sinktest: Harness.Setup is nil")
	for _, f := range []struct {
		name string
		on   bool
	}{{"Partitions", h.Features.Partitions}, {"Poison", h.Features.Poison}, {"Transient", h.Features.Transient}, {"Restart", h.Features.Restart}, {"Outage", h.Features.Outage}} {
		if !f.on && strings.TrimSpace(h.Features.Why[f.name]) == "" {
			t.Fatalf("sinktest: Features.%s is false but Features.Why[%q] is empty: write down why the backend cannot support it", f.name, f.name)
		}
	}
	for _, f := range []struct {
		name string
		on   bool
	}{{"MaxPayload", h.Features.MaxPayload != 0}, {"NoEmptyPayload", h.Features.NoEmptyPayload}} {
		if f.on && strings.TrimSpace(h.Features.Why[f.name]) == "" {
			t.Fatalf("sinktest: Features.%s is set but Features.Why[%q] is empty: write down why the backend needs it", f.name, f.name)
		}
	}

	parallel := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"SendOne", testSendOne},
		{"BatchOrderPerKey", testBatchOrderPerKey},
		{"WideBatchPerKey", testWideBatchPerKey},
		{"HeadersSurvive", testHeadersSurvive},
		{"PayloadBytesExact", testPayloadBytesExact},
		{"EmptyBatch", testEmptyBatch},
		{"CancelledContext", testCancelledContext},
		{"ConcurrentSend", testConcurrentSend},
		{"StableIDOnRetry", testStableIDOnRetry},
		{"CloseIdempotent", testCloseIdempotent},
		{"PartialFailureIndex", testPartialFailureIndex},
		{"PerKeyStop", testPerKeyStop},
		{"SameKeySamePartition", testSameKeySamePartition},
	}
	for _, tc := range parallel {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, h)
		})
	}
	// These run before the parallel subtests above resume (Go pauses
	// parallel subtests until the parent's body returns), so a backend-wide
	// fault never overlaps another subtest of this Run.
	t.Run("TransientThenRecover", func(t *testing.T) { testTransient(t, h) })
	t.Run("RecoverAfterRestart", func(t *testing.T) { testRestart(t, h) })
	t.Run("OutageNotAttempted", func(t *testing.T) { testOutage(t, h) })
}

// Msg returns a message with a fresh random UUID as ID, CreatedAt now and
// Attempt 1. Headers are nil; set them on the result when needed.
func Msg(topic, key string, seq int64, payload []byte) sinks.Message {
	return sinks.Message{
		ID:        NewID(),
		Seq:       seq,
		Topic:     topic,
		Key:       key,
		Payload:   payload,
		CreatedAt: time.Now().UTC(),
		Attempt:   1,
	}
}

// Batch returns n messages for topic with positions 1 to n, spread over
// keys keys ("k0", "k1", …, message i under key i mod keys; no key when
// keys is 0), each with a payload of size bytes that starts with
// "payload-i-" (cut to size) and is zero after it.
func Batch(topic string, n, keys, size int) []sinks.Message {
	out := make([]sinks.Message, n)
	for i := range out {
		key := ""
		if keys > 0 {
			key = fmt.Sprintf("k%d", i%keys)
		}
		payload := make([]byte, size)
		copy(payload, fmt.Sprintf("payload-%d-", i))
		out[i] = Msg(topic, key, int64(i+1), payload)
	}
	return out
}

// NewID returns a random version 4 UUID in its canonical text form.
func NewID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("sinktest: crypto/rand failed: " + err.Error()) // never happens on supported platforms
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// --- subtests ---

func testSendOne(t *testing.T, h Harness) {
	env, ctx := setup(t, h)
	m := Msg(env.Topic("one"), "k1", 1, []byte(`{"hello":"world"}`))
	m.Headers = map[string]string{"content-type": "application/json"}
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{m}))
	got := collect(ctx, t, env, known(m), m.ID)
	checkMessage(t, first(got, m.ID), m)
}

func testBatchOrderPerKey(t *testing.T, h Harness) {
	env, ctx := setup(t, h)
	topic := env.Topic("batch")
	msgs := make([]sinks.Message, 100)
	for i := range msgs {
		// Keys interleave so that each key's messages are spread through
		// the batch, the case a sink that groups by key can get wrong.
		msgs[i] = Msg(topic, fmt.Sprintf("key-%d", i%10), int64(i+1), fmt.Appendf(nil, `{"n":%d}`, i))
	}
	require.NoError(t, env.Sink.Send(ctx, msgs))
	got := collect(ctx, t, env, known(msgs...), ids(msgs)...)
	for _, m := range msgs {
		checkMessage(t, first(got, m.ID), m)
	}
	checkOrderPerKey(t, got, known(msgs...))
}

// testWideBatchPerKey sends a batch shaped the way the relay's claim
// shapes one: hundreds of keys interleaved in write order, a few messages
// each, some without a key and, when the backend has a poison, one key
// poisoned in the middle. However much of it the sink runs concurrently,
// each key must arrive in Seq order, and the poisoned key must stop at
// the poison (its later messages ErrNotAttempted and never delivered)
// while every other key goes through.
func testWideBatchPerKey(t *testing.T, h Harness) {
	env, ctx := setup(t, h)
	topic := env.Topic("wide")
	const n, keys = 400, 150
	msgs := make([]sinks.Message, 0, n+1)
	for i := range n {
		key := fmt.Sprintf("w-%d", i*7%keys)
		if i%25 == 24 {
			key = ""
		}
		msgs = append(msgs, Msg(topic, key, 0, fmt.Appendf(nil, `{"n":%d}`, i)))
	}
	poisonAt, victim := -1, msgs[n/2].Key
	if h.Features.Poison {
		require.NotNil(t, env.Poison, "Features.Poison is true but Env.Poison is nil")
		p := env.Poison(topic)
		p.Key = victim
		poisonAt = n / 2
		msgs = slices.Insert(msgs, poisonAt, p)
	}
	for i := range msgs {
		msgs[i].Seq = int64(i + 1)
	}
	err := env.Sink.Send(ctx, msgs)
	var delivered, held []string
	if poisonAt < 0 {
		require.NoError(t, err)
		delivered = ids(msgs)
	} else {
		be := requireBatchError(t, err, len(msgs))
		for i, m := range msgs {
			switch {
			case i == poisonAt:
				require.True(t, sinks.IsPermanent(be.Errs[i]), "index %d (poison) must fail permanently, got %v", i, be.Errs[i])
			case m.Key == victim && i > poisonAt:
				require.ErrorIs(t, be.Errs[i], sinks.ErrNotAttempted, "index %d has the poison's key and comes after it: it must not be attempted", i)
				held = append(held, m.ID)
			default:
				require.NoError(t, be.Errs[i], "index %d (key %q) does not share the poison's key", i, m.Key)
				delivered = append(delivered, m.ID)
			}
		}
	}
	k := known(msgs...)
	got := collect(ctx, t, env, k, delivered...)
	for _, d := range delivered {
		checkMessage(t, first(got, d), k[d])
	}
	checkOrderPerKey(t, got, k)
	if poisonAt >= 0 {
		got = append(got, markerAfter(ctx, t, env, k, topic, victim, int64(len(msgs)+1))...)
		requireAbsent(t, got, msgs[poisonAt].ID, "the poison message was delivered although Send reported it failed")
		for _, id := range held {
			requireAbsent(t, got, id, "a message reported ErrNotAttempted was delivered")
		}
	}
}

func testHeadersSurvive(t *testing.T, h Harness) {
	env, ctx := setup(t, h)
	m := Msg(env.Topic("headers"), "k1", 1, []byte("h"))
	m.Headers = map[string]string{
		"content-type": "application/json",
		"x-tenant":     "acme",
		"x-unicode":    "Grüße, 世界 🚀 ñ",
		"traceparent":  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"x-spaces":     "a b  c",
	}
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{m}))
	got := collect(ctx, t, env, known(m), m.ID)
	checkMessage(t, first(got, m.ID), m)
}

func testPayloadBytesExact(t *testing.T, h Harness) {
	env, ctx := setup(t, h)
	topic := env.Topic("payload")
	size := LargePayloadSize
	if h.Features.MaxPayload != 0 {
		size = h.Features.MaxPayload
	}
	large := make([]byte, size)
	_, err := rand.Read(large)
	require.NoError(t, err)
	small := []sinks.Message{
		Msg(topic, "bin", 1, []byte{0, 1, 2, 0, 0, 255, 0}),
		Msg(topic, "utf8", 2, []byte{'a', 0xff, 0xfe, 0xc3, 0x28, 'z'}),
		Msg(topic, "", 3, []byte{}), // empty payload, and no key
		Msg(topic, "json", 4, []byte(`{"order": 42, "items": ["a", "b"], "note": "<&>"}`)),
		Msg(topic, "json", 5, []byte("{\n  \"pretty\": true\n}\n")),
		Msg(topic, "json", 6, []byte(`"just a string"`)),
	}
	if h.Features.NoEmptyPayload {
		small = slices.DeleteFunc(small, func(m sinks.Message) bool { return len(m.Payload) == 0 })
	}
	require.NoError(t, env.Sink.Send(ctx, small), "small payloads")
	big := Msg(topic, "large", 7, large)
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{big}), "large payload (%d bytes)", len(large))
	all := append(slices.Clone(small), big)
	got := collect(ctx, t, env, known(all...), ids(all)...)
	for _, m := range all {
		checkMessage(t, first(got, m.ID), m)
	}
}

func testEmptyBatch(t *testing.T, h Harness) {
	env, ctx := setup(t, h)
	require.NoError(t, env.Sink.Send(ctx, nil), "Send(nil)")
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{}), "Send(empty slice)")
	// Nothing may have arrived: the first message read must be the marker.
	marker := Msg(env.Topic("empty"), "k1", 1, []byte("marker"))
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{marker}))
	got, err := env.Read(ctx, 1)
	require.NoError(t, err, "reading the marker sent after the empty batches")
	require.Len(t, got, 1)
	require.Equal(t, marker.ID, got[0].ID, "an empty batch delivered something")
}

func testCancelledContext(t *testing.T, h Harness) {
	env, ctx := setup(t, h)
	topic := env.Topic("cancel")
	// Establish the connection first so that the cancelled Send is not
	// merely failing on a cold start.
	warm := Msg(topic, "k1", 1, []byte("warm"))
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{warm}))
	collect(ctx, t, env, known(warm), warm.ID)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	msgs := []sinks.Message{Msg(topic, "k1", 2, []byte("a")), Msg(topic, "k2", 3, []byte("b"))}
	err := within(t, PromptTimeout, "Send with a cancelled context", func() error {
		return env.Sink.Send(cctx, msgs)
	})
	require.Error(t, err, "Send with a cancelled context must fail: no message may be assumed delivered")
	for i := range msgs {
		e := sinks.Outcome(err, i, len(msgs))
		require.Error(t, e, "message %d: Send with a cancelled context reported it delivered", i)
		require.False(t, sinks.IsPermanent(e), "message %d: a cancelled context is not a permanent failure: %v", i, e)
	}
}

func testConcurrentSend(t *testing.T, h Harness) {
	env, ctx := setup(t, h)
	topic := env.Topic("concurrent")
	const goroutines, batches, perBatch = 8, 5, 5
	all := make([][]sinks.Message, goroutines)
	for g := range goroutines {
		for b := range batches {
			batch := make([]sinks.Message, perBatch)
			for i := range batch {
				seq := int64(g*1000 + b*perBatch + i + 1)
				batch[i] = Msg(topic, fmt.Sprintf("g%d", g), seq, fmt.Appendf(nil, "g%d-%d", g, seq))
			}
			all[g] = append(all[g], batch...)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*batches)
	for g := range goroutines {
		wg.Go(func() {
			for b := range batches {
				if err := env.Sink.Send(ctx, all[g][b*perBatch:(b+1)*perBatch]); err != nil {
					errs <- fmt.Errorf("goroutine %d batch %d: %w", g, b, err)
					return // later batches of this key must not overtake the failed one
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	flat := slices.Concat(all...)
	got := collect(ctx, t, env, known(flat...), ids(flat)...)
	for _, m := range flat {
		checkMessage(t, first(got, m.ID), m)
	}
	checkOrderPerKey(t, got, known(flat...))
}

func testStableIDOnRetry(t *testing.T, h Harness) {
	env, ctx := setup(t, h)
	m := Msg(env.Topic("stableid"), "k1", 1, []byte("same"))
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{m}))
	collect(ctx, t, env, known(m), m.ID)
	// The relay resends the same row after a crash or an ambiguous
	// failure; the consumer must see the same id to drop the duplicate.
	again := m
	again.Attempt = 2
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{again}))
	if h.Features.Dedup {
		got := markerAfter(ctx, t, env, known(m), m.Topic, m.Key, 2)
		requireAbsent(t, got, m.ID, "Features.Dedup is true, yet the resent message was stored again")
		return
	}
	got, err := env.Read(ctx, 1)
	require.NoError(t, err, "reading the resent message")
	require.Len(t, got, 1)
	require.Equal(t, m.ID, got[0].ID, "a resent message must carry the same id")
	checkMessage(t, got[0], m)
}

func testCloseIdempotent(t *testing.T, h Harness) {
	env, ctx := setup(t, h)
	m := Msg(env.Topic("close"), "k1", 1, []byte("before close"))
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{m}))
	for i := 1; i <= 2; i++ {
		err := within(t, PromptTimeout, fmt.Sprintf("Close #%d", i), func() error {
			cctx, cancel := context.WithTimeout(ctx, PromptTimeout)
			defer cancel()
			return env.Sink.Close(cctx)
		})
		require.NoError(t, err, "Close #%d", i)
	}
	err := within(t, PromptTimeout, "Send after Close", func() error {
		return env.Sink.Send(ctx, []sinks.Message{Msg(m.Topic, "k1", 2, []byte("after close"))})
	})
	require.ErrorIs(t, err, sinks.ErrClosed, "Send after Close")
	require.False(t, sinks.IsPermanent(err), "ErrClosed must not be permanent (another relay instance will deliver the message)")
	collect(ctx, t, env, known(m), m.ID)
}

func testPartialFailureIndex(t *testing.T, h Harness) {
	if skip(t, h, "Poison") {
		return
	}
	env, ctx := setup(t, h)
	require.NotNil(t, env.Poison, "Features.Poison is true but Env.Poison is nil")
	topic := env.Topic("partial")
	poison := poisonMsg(env, topic, 2)
	good1 := Msg(topic, otherKey(poison.Key, "good-1"), 1, []byte("good 1"))
	good2 := Msg(topic, otherKey(poison.Key, "good-2"), 3, []byte("good 2"))
	msgs := []sinks.Message{good1, poison, good2}
	err := env.Sink.Send(ctx, msgs)
	be := requireBatchError(t, err, len(msgs))
	require.NoError(t, be.Errs[0], "index 0 (good) must be delivered")
	require.Error(t, be.Errs[1], "index 1 (poison) must fail")
	require.True(t, sinks.IsPermanent(be.Errs[1]), "index 1 (poison) must be permanent, got %v", be.Errs[1])
	require.NoError(t, be.Errs[2], "index 2 (good, other key) must be delivered")

	k := known(good1, poison, good2)
	got := collect(ctx, t, env, k, good1.ID, good2.ID)
	checkMessage(t, first(got, good1.ID), good1)
	checkMessage(t, first(got, good2.ID), good2)
	got = append(got, markerAfter(ctx, t, env, k, topic, poison.Key, 4)...)
	requireAbsent(t, got, poison.ID, "the poison message was delivered although Send reported it failed")
}

func testPerKeyStop(t *testing.T, h Harness) {
	if skip(t, h, "Poison") {
		return
	}
	env, ctx := setup(t, h)
	require.NotNil(t, env.Poison, "Features.Poison is true but Env.Poison is nil")
	topic := env.Topic("perkeystop")
	poison := poisonMsg(env, topic, 1)
	after := Msg(topic, poison.Key, 2, []byte("after poison, same key"))
	msgs := []sinks.Message{poison, after}
	be := requireBatchError(t, env.Sink.Send(ctx, msgs), len(msgs))
	require.Error(t, be.Errs[0], "index 0 (poison) must fail")
	require.True(t, sinks.IsPermanent(be.Errs[0]), "index 0 (poison) must be permanent, got %v", be.Errs[0])
	require.ErrorIs(t, be.Errs[1], sinks.ErrNotAttempted, "index 1 has the poison's key and comes after it: it must not be attempted")
	require.False(t, sinks.IsPermanent(be.Errs[1]), "a not-attempted message must not be permanent")

	got := markerAfter(ctx, t, env, known(poison, after), topic, poison.Key, 3)
	requireAbsent(t, got, poison.ID, "the poison message was delivered although Send reported it failed")
	requireAbsent(t, got, after.ID, "a message reported ErrNotAttempted was delivered")
}

func testSameKeySamePartition(t *testing.T, h Harness) {
	if skip(t, h, "Partitions") {
		return
	}
	env, ctx := setup(t, h)
	topic := env.Topic("partitions")
	var msgs []sinks.Message
	for i := range 60 {
		msgs = append(msgs, Msg(topic, fmt.Sprintf("pk-%d", i%12), int64(i+1), fmt.Appendf(nil, "%d", i)))
	}
	// Two Sends, so that a sink that picks partitions per batch (rather
	// than per key) is caught.
	require.NoError(t, env.Sink.Send(ctx, msgs[:30]))
	require.NoError(t, env.Sink.Send(ctx, msgs[30:]))
	got := collect(ctx, t, env, known(msgs...), ids(msgs)...)
	byKey := map[string]int{}
	partitions := map[int]bool{}
	for _, d := range got {
		require.GreaterOrEqual(t, d.Partition, 0, "message %s: Features.Partitions is true but Partition is %d", d.ID, d.Partition)
		partitions[d.Partition] = true
		if p, ok := byKey[d.Key]; ok {
			require.Equal(t, p, d.Partition, "key %q arrived on partitions %d and %d", d.Key, p, d.Partition)
		} else {
			byKey[d.Key] = d.Partition
		}
	}
	t.Logf("12 keys landed on %d partition(s)", len(partitions))
	checkOrderPerKey(t, got, known(msgs...))
}

func testTransient(t *testing.T, h Harness) {
	if skip(t, h, "Transient") {
		return
	}
	env, ctx := setup(t, h)
	require.NotNil(t, env.BreakTransient, "Features.Transient is true but Env.BreakTransient is nil")
	topic := env.Topic("transient")
	warm := Msg(topic, "t0", 1, []byte("warm"))
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{warm}))
	collect(ctx, t, env, known(warm), warm.ID)

	restore := env.BreakTransient()
	var once sync.Once
	restoreOnce := func() { once.Do(restore) }
	t.Cleanup(restoreOnce) // the backend comes back even when the test fails early

	msgs := []sinks.Message{Msg(topic, "t1", 2, []byte("a")), Msg(topic, "t2", 3, []byte("b"))}
	sctx, cancel := context.WithTimeout(ctx, ReadTimeout)
	err := env.Sink.Send(sctx, msgs)
	cancel()
	require.Error(t, err, "Send must fail while the backend is broken")
	for i := range msgs {
		e := sinks.Outcome(err, i, len(msgs))
		require.Error(t, e, "message %d reported delivered while the backend is broken", i)
		require.False(t, sinks.IsPermanent(e), "message %d: a transient failure was reported permanent: %v", i, e)
	}
	restoreOnce()
	sendUntilDelivered(ctx, t, env, msgs)
	got := collect(ctx, t, env, known(warm, msgs[0], msgs[1]), ids(msgs)...)
	for _, m := range msgs {
		checkMessage(t, first(got, m.ID), m)
	}
}

func testRestart(t *testing.T, h Harness) {
	if skip(t, h, "Restart") {
		return
	}
	env, ctx := setup(t, h)
	require.NotNil(t, env.Restart, "Features.Restart is true but Env.Restart is nil")
	topic := env.Topic("restart")
	before := Msg(topic, "r1", 1, []byte("before restart"))
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{before}))
	collect(ctx, t, env, known(before), before.ID)

	require.NoError(t, env.Restart(), "Env.Restart")
	msgs := []sinks.Message{Msg(topic, "r1", 2, []byte("after restart 1")), Msg(topic, "r2", 3, []byte("after restart 2"))}
	sendUntilDelivered(ctx, t, env, msgs)
	got := collect(ctx, t, env, known(before, msgs[0], msgs[1]), ids(msgs)...)
	for _, m := range msgs {
		checkMessage(t, first(got, m.ID), m)
	}
	checkOrderPerKey(t, got, known(before, msgs[0], msgs[1]))
}

// testOutage checks that a sink reports a destination that is down as an
// outage (see the package doc, Outages) and delivers once it is back.
func testOutage(t *testing.T, h Harness) {
	if skip(t, h, "Outage") {
		return
	}
	env, ctx := setup(t, h)
	require.NotNil(t, env.Down, "Features.Outage is true but Env.Down is nil")
	require.NotNil(t, env.Up, "Features.Outage is true but Env.Up is nil")
	topic := env.Topic("outage")
	// The sink is connected when the destination goes down, as a running
	// relay's is.
	warm := Msg(topic, "o1", 1, []byte("before the outage"))
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{warm}))
	collect(ctx, t, env, known(warm), warm.ID)

	require.NoError(t, env.Down(), "Env.Down")
	var once sync.Once
	var upErr error
	up := func() error { once.Do(func() { upErr = env.Up() }); return upErr }
	t.Cleanup(func() { _ = up() }) // the destination comes back even when the test fails early

	msgs := []sinks.Message{
		Msg(topic, "o1", 2, []byte("o1 a")),
		Msg(topic, "o2", 3, []byte("o2 a")),
		Msg(topic, "", 4, []byte("keyless a")),
		Msg(topic, "o1", 5, []byte("o1 b")),
		Msg(topic, "o3", 6, []byte("o3 a")),
		Msg(topic, "o2", 7, []byte("o2 b")),
		Msg(topic, "", 8, []byte("keyless b")),
	}
	err := within(t, OutageTimeout+PromptTimeout, "Send while the destination is down", func() error {
		sctx, cancel := context.WithTimeout(ctx, OutageTimeout)
		defer cancel()
		return env.Sink.Send(sctx, msgs)
	})
	require.Error(t, err, "Send must fail while the destination is down")
	failedKey := map[string]bool{}
	for i, m := range msgs {
		e := sinks.Outcome(err, i, len(msgs))
		require.Error(t, e, "message %d reported delivered while the destination is down", i)
		require.False(t, sinks.IsPermanent(e), "message %d: an outage was reported permanent: %v", i, e)
		switch {
		case sinks.IsNotSent(e), errors.Is(e, sinks.ErrUnavailable):
		case m.Key != "" && failedKey[m.Key] && errors.Is(e, sinks.ErrNotAttempted):
		default:
			t.Fatalf("message %d (key %q): the destination is down, yet its failure does not say so: "+
				"mark it sinks.NotSent (nothing was sent) or wrap sinks.ErrUnavailable (sent without an answer, or the destination said it is unavailable); got %T: %v", i, m.Key, e, e)
		}
		failedKey[m.Key] = true
	}

	require.NoError(t, up(), "Env.Up")
	sendUntilDelivered(ctx, t, env, msgs)
	k := known(append([]sinks.Message{warm}, msgs...)...)
	got := collect(ctx, t, env, k, ids(msgs)...)
	for _, m := range msgs {
		checkMessage(t, first(got, m.ID), m)
	}
	checkOrderPerKey(t, got, k)
}

// --- helpers ---

// setup returns a fresh Env and a context that bounds the subtest.
func setup(t *testing.T, h Harness) (*Env, context.Context) {
	t.Helper()
	env := h.Setup(t)
	require.NotNil(t, env, "Harness.Setup returned nil")
	require.NotNil(t, env.Sink, "Env.Sink is nil")
	require.NotNil(t, env.Topic, "Env.Topic is nil")
	require.NotNil(t, env.Read, "Env.Read is nil")
	// RecoverTimeout + ReadTimeout covers the longest subtest; a hung
	// backend fails the subtest instead of the whole go test timeout.
	ctx, cancel := context.WithTimeout(t.Context(), RecoverTimeout+2*ReadTimeout)
	t.Cleanup(cancel)
	return env, ctx
}

// skip skips t when the feature is off, printing the harness's reason.
func skip(t *testing.T, h Harness, feature string) bool {
	t.Helper()
	on := map[string]bool{
		"Partitions": h.Features.Partitions,
		"Poison":     h.Features.Poison,
		"Transient":  h.Features.Transient,
		"Restart":    h.Features.Restart,
		"Outage":     h.Features.Outage,
	}[feature]
	if !on {
		t.Skipf("sinktest: backend does not support %s: %s", feature, h.Features.Why[feature])
		return true
	}
	return false
}

// within runs f and fails t when it does not return within d (a hung Send
// or Close). The goroutine is left behind in that case: the test has failed.
func within(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		t.Fatalf("%s did not return within %s", what, d)
		return nil
	}
}

func known(msgs ...sinks.Message) map[string]sinks.Message {
	k := make(map[string]sinks.Message, len(msgs))
	for _, m := range msgs {
		k[m.ID] = m
	}
	return k
}

func ids(msgs []sinks.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

// collect reads until every id in want has arrived at least once and returns
// everything read, in arrival order, duplicates included. It never asks Read
// for more messages than are still missing, so it cannot block on messages
// that were never sent. A message whose id is not in k fails the test: an
// isolated Env only carries what this subtest sent, so an unknown id means
// the backend lost or rewrote the stable id.
func collect(ctx context.Context, t *testing.T, env *Env, k map[string]sinks.Message, want ...string) []Delivered {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, ReadTimeout)
	defer cancel()
	missing := make(map[string]bool, len(want))
	for _, id := range want {
		missing[id] = true
	}
	var got []Delivered
	for len(missing) > 0 {
		batch, err := env.Read(rctx, len(missing))
		if err != nil {
			t.Fatalf("sinktest: read back %d of %d expected messages (%d reads incl. duplicates): %v", len(want)-len(missing), len(want), len(got), err)
		}
		if len(batch) > len(missing) {
			t.Fatalf("sinktest: Env.Read returned %d messages when asked for %d", len(batch), len(missing))
		}
		for _, d := range batch {
			if d.ID == "" {
				t.Fatalf("sinktest: a message arrived without an id (topic %q key %q): the backend must carry the stable id", d.Topic, d.Key)
			}
			if _, ok := k[d.ID]; !ok {
				t.Fatalf("sinktest: a message with unknown id %q arrived (topic %q key %q): ids must survive unchanged and Envs must be isolated", d.ID, d.Topic, d.Key)
			}
			delete(missing, d.ID)
			got = append(got, d)
		}
	}
	return got
}

// first returns the first delivery of id in got.
func first(got []Delivered, id string) Delivered {
	for _, d := range got {
		if d.ID == id {
			return d
		}
	}
	panic("sinktest: first called for an id that was not collected: " + id)
}

// checkMessage compares what arrived with what was sent.
func checkMessage(t *testing.T, d Delivered, m sinks.Message) {
	t.Helper()
	require.Equal(t, m.ID, d.ID, "id")
	require.Equal(t, m.Seq, d.Seq, "message %s: position (Seq): every sink must carry it for consumers to order a key's messages", m.ID)
	require.Equal(t, m.Topic, d.Topic, "message %s: topic", m.ID)
	require.Equal(t, m.Key, d.Key, "message %s: key", m.ID)
	if !bytes.Equal(m.Payload, d.Payload) {
		t.Fatalf("message %s: payload differs: sent %d bytes %s, got %d bytes %s", m.ID, len(m.Payload), preview(m.Payload), len(d.Payload), preview(d.Payload))
	}
	for name, want := range m.Headers {
		got, ok := d.Headers[name]
		require.True(t, ok, "message %s: header %q missing (arrived: %v)", m.ID, name, slices.Sorted(maps.Keys(d.Headers)))
		require.Equal(t, want, got, "message %s: header %q", m.ID, name)
	}
}

func preview(b []byte) string {
	if len(b) > 32 {
		return fmt.Sprintf("%q...", b[:32])
	}
	return fmt.Sprintf("%q", b)
}

// checkOrderPerKey checks that, for every non-empty key, first deliveries
// arrived in Seq order. Redeliveries may repeat an earlier message (at least
// once); what matters is that no message overtook an earlier one of its key.
func checkOrderPerKey(t *testing.T, got []Delivered, k map[string]sinks.Message) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]sinks.Message{}
	for _, d := range got {
		if seen[d.ID] {
			continue
		}
		seen[d.ID] = true
		m := k[d.ID]
		if m.Key == "" {
			continue
		}
		if prev, ok := last[m.Key]; ok && prev.Seq > m.Seq {
			t.Fatalf("key %q: seq %d (id %s) arrived before seq %d (id %s)", m.Key, m.Seq, m.ID, prev.Seq, prev.ID)
		}
		last[m.Key] = m
	}
}

func requireBatchError(t *testing.T, err error, n int) *sinks.BatchError {
	t.Helper()
	require.Error(t, err, "Send must report the failed message")
	var be *sinks.BatchError
	require.True(t, errors.As(err, &be), "Send must return a *sinks.BatchError when only some messages fail, got %T: %v", err, err)
	require.Len(t, be.Errs, n, "BatchError.Errs must have one entry per message sent")
	return be
}

func requireAbsent(t *testing.T, got []Delivered, id, msg string) {
	t.Helper()
	for _, d := range got {
		if d.ID == id {
			t.Fatalf("%s (id %s)", msg, id)
		}
	}
}

// poisonMsg asks the harness for a poison message and gives it a key.
func poisonMsg(env *Env, topic string, seq int64) sinks.Message {
	p := env.Poison(topic)
	if p.Key == "" {
		p.Key = "poison-" + NewID()[:8]
	}
	p.Seq = seq
	return p
}

func otherKey(avoid, key string) string {
	if key == avoid {
		return key + "-other"
	}
	return key
}

// markerAfter sends a fresh message with key (which is the key of messages
// that must not have been delivered) and reads until it arrives. Because
// same-key messages share a partition and arrive in order, anything wrongly
// delivered earlier with that key shows up in the result before the marker.
func markerAfter(ctx context.Context, t *testing.T, env *Env, k map[string]sinks.Message, topic, key string, seq int64) []Delivered {
	t.Helper()
	marker := Msg(topic, key, seq, []byte("marker"))
	require.NoError(t, env.Sink.Send(ctx, []sinks.Message{marker}), "sending a marker with key %q after the failure", key)
	k = maps.Clone(k)
	k[marker.ID] = marker
	return collect(ctx, t, env, k, marker.ID)
}

// sendUntilDelivered resends the messages not yet delivered, the way the
// relay does, until all are delivered or RecoverTimeout passes. Every
// failure on the way must be retriable.
func sendUntilDelivered(ctx context.Context, t *testing.T, env *Env, msgs []sinks.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, RecoverTimeout)
	defer cancel()
	pending := slices.Clone(msgs)
	delay := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		err := env.Sink.Send(sctx, pending)
		scancel()
		if err == nil {
			return
		}
		var still []sinks.Message
		for i, m := range pending {
			e := sinks.Outcome(err, i, len(pending))
			if e == nil {
				continue
			}
			if sinks.IsPermanent(e) {
				t.Fatalf("attempt %d: message %d (%s) failed permanently while the backend recovers: %v", attempt, i, m.ID, e)
			}
			m.Attempt++
			still = append(still, m)
		}
		pending = still
		t.Logf("attempt %d: %d message(s) not yet delivered: %v", attempt, len(pending), err)
		if len(pending) == 0 {
			return
		}
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			t.Fatalf("sends did not recover within %s; last error: %v", RecoverTimeout, err)
		case <-timer.C:
		}
		delay = min(2*delay, time.Second)
	}
}
