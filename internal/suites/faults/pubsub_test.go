package faults

import (
	"context"
	"net/url"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/tcpproxy"
)

// TestPubSubOutage runs the relay binary into an in-process Pub/Sub fake
// (pstest) through a proxy, and refuses the relay's connections (the
// proxy's port closed, as a server that is down) for outageLength() while
// applications keep writing: nothing is lost, per-key order holds (the
// key is the ordering key), and no attempt is counted while the endpoint
// refuses connections.
func TestPubSubOutage(t *testing.T) {
	t.Parallel()
	srv := pstest.NewServerWithAddress("127.0.0.1:0")
	t.Cleanup(func() { _ = srv.Close() })
	_, err := srv.GServer.CreateTopic(context.Background(), &pubsubpb.Topic{Name: "projects/outbox-faults/topics/orders"})
	require.NoError(t, err)
	proxy := tcpproxy.New(t, srv.Addr)
	var restore func()
	sinkURL := "pubsub://outbox-faults?" + url.Values{"endpoint": {proxy.Addr()}, "insecure": {"true"},
		"publish_timeout": {"5s"}}.Encode()
	endpointOutage(t, sinkURL, func() { restore = proxy.Break() }, func() { restore() }, func([]string) []delivery {
		var got []delivery
		for _, m := range srv.Messages() {
			got = append(got, delivery{ID: m.Attributes["outbox-id"], Key: m.OrderingKey, Payload: string(m.Data)})
		}
		return got
	})
}
