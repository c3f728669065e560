package natssink

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// createStreamEnv is a connection to the shared server for a test that
// lets the sink make its stream: a unique stream name and subject prefix,
// and the stream deleted when the test ends.
func createStreamEnv(t *testing.T) (js jetstream.JetStream, name, prefix string) {
	t.Helper()
	nc, err := nats.Connect(testkit.NATSURL(), nats.Timeout(2*time.Second))
	if err != nil {
		testkit.Unavailable(t, "service", "NATS not reachable at TEST_NATS_URL (%s): %v", testkit.NATSURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err = jetstream.New(nc)
	require.NoError(t, err)
	name, prefix = testkit.RandName("OUTBOXTEST_"), testkit.RandName("t")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Logf("cleanup: delete stream %s: %v", name, err)
		}
	})
	return js, name, prefix
}

func newCreateStreamSink(t *testing.T, cfg Config) *Sink {
	t.Helper()
	cfg.URL = testkit.NATSURL()
	cfg.PublishTimeout = 5 * time.Second
	s, err := New(cfg, slog.New(slog.NewTextHandler(testkit.LogWriter(t), nil)))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, s.Close(ctx))
	})
	return s
}

// TestCreateStream: with create_stream the sink makes the stream, with
// the configured subjects, duplicate window and file storage, before its
// first Send publishes (a Send right after New must not find "no stream"
// and dead-letter the first messages of a fresh deployment).
func TestCreateStream(t *testing.T) {
	t.Parallel()
	js, name, prefix := createStreamEnv(t)
	s := newCreateStreamSink(t, Config{Stream: name, CreateStream: true,
		StreamSubjects: prefix + ".a.>, " + prefix + ".b.>", DuplicateWindow: 90 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	batch := append(sinktest.Batch(prefix+".a.x", 3, 1, 10), sinktest.Batch(prefix+".b.y", 2, 1, 10)...)
	for i := range batch {
		batch[i].ID = testkit.RandName("id")
	}
	require.NoError(t, s.Send(ctx, batch))

	st, err := js.Stream(ctx, name)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{prefix + ".a.>", prefix + ".b.>"}, info.Config.Subjects)
	require.Equal(t, 90*time.Second, info.Config.Duplicates)
	require.Equal(t, jetstream.FileStorage, info.Config.Storage)
	require.EqualValues(t, len(batch), info.State.Msgs)

	// The window is the configured one: a resend is dropped.
	require.NoError(t, s.Send(ctx, batch[:1]))
	info, err = st.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, len(batch), info.State.Msgs)
}

// TestCreateStreamLeavesExistingStream: an existing stream is the
// operator's; create_stream does not change it.
func TestCreateStreamLeavesExistingStream(t *testing.T) {
	t.Parallel()
	js, name, prefix := createStreamEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"},
		Storage: jetstream.MemoryStorage, Duplicates: 30 * time.Second})
	require.NoError(t, err)
	s := newCreateStreamSink(t, Config{Stream: name, CreateStream: true, StreamSubjects: prefix + ".other.>"})
	require.NoError(t, s.Send(ctx, sinktest.Batch(prefix+".x", 2, 1, 10)))
	st, err := js.Stream(ctx, name)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{prefix + ".>"}, info.Config.Subjects)
	require.Equal(t, 30*time.Second, info.Config.Duplicates)
	require.Equal(t, jetstream.MemoryStorage, info.Config.Storage)
	require.EqualValues(t, 2, info.State.Msgs)
}

// TestCreateStreamOffByDefault: without create_stream a missing stream
// stays missing, and its messages are not sent: the destination is down
// until the stream exists (the relay counts no attempt for them).
func TestCreateStreamOffByDefault(t *testing.T) {
	t.Parallel()
	js, name, prefix := createStreamEnv(t)
	s := newCreateStreamSink(t, Config{Stream: name})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := s.Send(ctx, sinktest.Batch(prefix+".x", 1, 1, 10))
	var be *sinks.BatchError
	require.ErrorAs(t, err, &be)
	require.ErrorIs(t, be.Errs[0], ErrNoStream)
	require.True(t, sinks.IsNotSent(be.Errs[0]), "the sink's own stream missing: not sent, got %v", be.Errs[0])
	require.False(t, sinks.IsPermanent(be.Errs[0]), "the sink's own stream missing is no message's fault")
	_, err = js.Stream(ctx, name)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
}
