package cli_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testkit"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/app/cli"
	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
)

// Issue 34: a relay whose RabbitMQ exchange does not exist, with the
// default declare_exchange (none), is not ready: /readyz answers 503
// with the reason, and the log says it, although the broker is reachable.
func TestReadyzSaysTheExchangeIsMissing(t *testing.T) {
	_, schema, _ := e2e(t)
	amqpURL := testkit.AMQPURL()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		pgtest.Unavailable(t, "rabbitmq at %s: %v", amqpURL, err)
	}
	_ = conn.Close()
	exchange := "missing-" + schema // unique, and never declared
	sinkURL := strings.TrimSuffix(amqpURL, "/") + "/?exchange=" + url.QueryEscape(exchange)
	addr := freeAddr(t)
	ctx, stop := context.WithCancel(context.Background())
	logs := &testkit.SyncBuffer{}
	exited := make(chan int, 1)
	go func() {
		exited <- cli.MainContext(ctx, []string{"run", "--sink", sinkURL, "--admin-addr", addr}, io.Discard, logs)
	}()
	defer func() {
		stop()
		require.Equal(t, 0, <-exited, logs.String())
	}()

	var status int
	var body string
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		status, body = resp.StatusCode, string(b)
		return status == http.StatusServiceUnavailable && strings.Contains(body, "exchange does not exist")
	}, 30*time.Second, 50*time.Millisecond, "readyz: %d %s; logs:\n%s", status, body, logs.String())
	require.Contains(t, body, exchange, "the reason names the exchange")
	require.Contains(t, body, "NOT_FOUND")
	require.Contains(t, logs.String(), "the exchange does not exist: nothing can be delivered", "the log says it")
}
