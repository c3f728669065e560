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

	"github.com/outbox-relay/outbox-relay/internal/testkit/testproc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestServer checks the helper's own contract: the node takes
// persistent messages with confirms, rabbitmqctl reaches it, and nothing of
// it (directory, processes) is left once its test has ended. Stopping and
// starting the application is exercised by TestBrokerRestart
// (sinks/amqpsink) and TestAMQPOutage (internal/suites/faults).
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
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		_, err = ch.QueueDeclare("kept", true, false, false, false, nil)
		require.NoError(t, err)
		require.NoError(t, ch.Confirm(false))
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "kept", true, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("kept")})
		require.NoError(t, err)
		acked, err := dc.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, acked, "nacked")

		out, err := b.Ctl(ctx, "list_queues", "--quiet", "--no-table-headers", "name", "messages")
		require.NoError(t, err)
		require.Equal(t, "kept\t1", strings.TrimSpace(out))
	})
	if dir == "" {
		return // the node did not start: nothing to check
	}
	_, err := os.Stat(dir)
	require.True(t, os.IsNotExist(err), "node directory %s left behind: %v", dir, err)
	require.Empty(t, testproc.ProcessesIn(dir), "node processes left behind")
}
