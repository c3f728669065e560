package amqptest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outbox-relay/outbox-relay/internal/testproc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestServer runs a throwaway node through what the broker tests do to
// it: a persistent message in a durable queue survives stop_app and
// start_app, connections are refused in between, rabbitmqctl reaches the
// node, and nothing of it is left once its test has ended.
func TestServer(t *testing.T) {
	t.Parallel()
	var dir string
	t.Run("lifecycle", func(t *testing.T) {
		b := Server(t)
		dir = b.proc.Dir
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		conn, err := amqp.Dial(b.URL())
		require.NoError(t, err)
		ch, err := conn.Channel()
		require.NoError(t, err)
		_, err = ch.QueueDeclare("kept", true, false, false, false, nil)
		require.NoError(t, err)
		require.NoError(t, ch.Confirm(false))
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "kept", true, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("survives")})
		require.NoError(t, err)
		ok, err := dc.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok, "nacked")

		out, err := b.Ctl(ctx, "eval", "vm_memory_monitor:get_vm_memory_high_watermark().")
		require.NoError(t, err)
		require.NotEmpty(t, strings.TrimSpace(out))

		require.NoError(t, b.StopApp(ctx))
		<-conn.NotifyClose(make(chan *amqp.Error, 1))
		_, err = amqp.Dial(b.URL())
		require.Error(t, err, "connected while the application was stopped")
		require.NoError(t, b.StartApp(ctx))

		conn, err = amqp.Dial(b.URL())
		require.NoError(t, err)
		defer conn.Close()
		ch, err = conn.Channel()
		require.NoError(t, err)
		d, ok, err := ch.Get("kept", true)
		require.NoError(t, err)
		require.True(t, ok, "the durable queue lost its message")
		require.Equal(t, "survives", string(d.Body))
	})
	_, err := os.Stat(dir)
	require.True(t, os.IsNotExist(err), "node directory %s left behind: %v", dir, err)
	require.Empty(t, testproc.ProcessesIn(dir), "node processes left behind")
}
