package faults

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/schemas"
	"github.com/aws/smithy-go/transport/http/protocol/awsquery"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit/pgtest"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
)

// TestSQSOutage stops a throwaway goaws (its port refuses connections)
// under the relay binary for outageLength() while applications keep
// writing, then brings it back on the same port with its queues: nothing
// is lost, per-key order holds on the FIFO queue, and no attempt is
// counted while the endpoint is unreachable (the sink reports a refused
// connection as not attempted), beyond the requests on the wire when it
// went away.
func TestSQSOutage(t *testing.T) {
	t.Parallel()
	srv := throwaway.StartGoAWS(t)
	ctx, cancel := context.WithTimeout(context.Background(), runBound())
	defer cancel()
	ac, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion("us-east-1"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
	require.NoError(t, err)
	client := sqs.NewFromConfig(ac, func(o *sqs.Options) {
		o.BaseEndpoint = aws.String(srv.Endpoint())
		o.Protocol = awsquery.New(schemas.AmazonSQS)
	})
	_, err = client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("orders.fifo"), Attributes: map[string]string{"FifoQueue": "true"}})
	require.NoError(t, err)

	sinkURL := "sqs://?" + url.Values{"queue_url": {srv.QueueURL("{topic}.fifo")}, "endpoint": {srv.Endpoint()},
		"region": {"us-east-1"}, "protocol": {"query"}, "access_key_id": {"test"}, "secret_access_key": {"test"},
		"publish_timeout": {"5s"}}.Encode()
	endpointOutage(t, sinkURL, srv.Stop, srv.Start, func([]string) []delivery { return receiveAll(t, srv, "orders.fifo") })
}

// TestSNSOutage is TestSQSOutage for the SNS sink: it publishes to a
// topic with an SQS queue subscribed with raw message delivery, and reads
// the queue. goaws has no FIFO topics, so per-key order is checked on
// what the sink published in order to a standard topic (goaws delivers to
// the queue in publish order).
func TestSNSOutage(t *testing.T) {
	t.Parallel()
	srv := throwaway.StartGoAWS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ac, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion("us-east-1"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
	require.NoError(t, err)
	client := sqs.NewFromConfig(ac, func(o *sqs.Options) {
		o.BaseEndpoint = aws.String(srv.Endpoint())
		o.Protocol = awsquery.New(schemas.AmazonSQS)
	})
	topics := sns.NewFromConfig(ac, func(o *sns.Options) { o.BaseEndpoint = aws.String(srv.Endpoint()) })
	_, err = topics.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String("orders")})
	require.NoError(t, err)
	_, err = client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("orders")})
	require.NoError(t, err)
	_, err = topics.Subscribe(ctx, &sns.SubscribeInput{TopicArn: aws.String(srv.TopicARN("orders")), Protocol: aws.String("sqs"),
		Endpoint: aws.String(srv.QueueURL("orders")), Attributes: map[string]string{"RawMessageDelivery": "true"}})
	require.NoError(t, err)
	sinkURL := "sns://?" + url.Values{"topic_arn": {srv.TopicARN("{topic}")}, "endpoint": {srv.Endpoint()},
		"region": {"us-east-1"}, "access_key_id": {"test"}, "secret_access_key": {"test"}, "publish_timeout": {"5s"}}.Encode()
	endpointOutage(t, sinkURL, srv.Stop, srv.Start, func([]string) []delivery { return receiveAll(t, srv, "orders") })
}

// receiveAll takes every message of queue name, in queue order, in one
// request (throwaway.GoAWS.TakeAll: a 10-minute outage's backlog is
// hundreds of thousands of messages).
func receiveAll(t *testing.T, srv *throwaway.GoAWS, name string) []delivery {
	t.Helper()
	ms, err := srv.TakeAll(name)
	require.NoError(t, err)
	got := make([]delivery, 0, len(ms))
	for _, m := range ms {
		got = append(got, delivery{ID: m.Attributes["outbox-id"], Payload: m.Body})
	}
	return got
}

// endpointOutage runs the relay binary with sinkURL while a steady writer
// writes to topic "orders", takes the endpoint down (down: its port
// refuses connections) for outageLength() and brings it back (up), then
// reads what arrived (read, given the payloads written, for a read-back
// that waits for them): nothing lost, per-key order kept, no attempt
// counted while the endpoint refused connections.
func endpointOutage(t *testing.T, sinkURL string, down, up func(), read func(written []string) []delivery) {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	cfg := outageConfig
	p := startRelay(t, pgtest.URL(), schema, "--sink", sinkURL,
		"--batch-size", fmt.Sprint(cfg.BatchSize), "--max-attempts", fmt.Sprint(cfg.MaxAttempts),
		"--retry-initial", cfg.RetryInitial.String(), "--retry-multiplier", fmt.Sprint(cfg.RetryMultiplier),
		"--retry-max", cfg.RetryMax.String(), "--retry-jitter", fmt.Sprint(cfg.RetryJitter))
	w := startSteadyWriter(t, pool, schema, map[string]string{"type": "OrderPlaced"})
	p.publishedMore(100) // steady state first, as outageRun
	down()
	downAt := time.Now()
	// The requests on the wire when the server went away count an attempt;
	// nothing after them may. They are over once the applications have
	// written for a while (about 2s) behind the endpoint's back.
	const onTheWire = 2 * time.Second
	w.writeMore(t, int(onTheWire.Seconds()*steadyRate), nil)
	before := attempted(t, pool, schema)
	w.writeMore(t, outageWrites()-int(onTheWire.Seconds()*steadyRate), nil)
	after := attempted(t, pool, schema)
	backlog := count(t, pool, schema, "messages")
	up()
	upAt := time.Now()
	p.publishedMore(100) // the writer goes on until the relay delivers again
	written := w.stop()
	// A bound, not a measure; the drain time is logged below. goaws
	// holds the whole run's messages in memory, and its own sweep walked
	// every deduplication id once per message under its one lock, so
	// that after a 40 s outage its batches took longer than the 5 s
	// publish timeout (12,781 rows still pending after 3 minutes); goawsd
	// sweeps in linear time instead (goawsd/visibility.go), and the same
	// outage drained in 6.5 s.
	eventually(t, max(3*time.Minute, drainBound()), 50*time.Millisecond, func() (bool, string) {
		left := count(t, pool, schema, "messages")
		return left == 0, fmt.Sprintf("%d pending", left)
	})
	drained := time.Since(upAt)
	require.Empty(t, deadLetters(t, pool, schema), "an outage must not dead-letter anything")

	got := read(written)
	dups := checkAllDelivered(t, written, got)
	checkKeyOrder(t, got)
	t.Logf("endpoint down %s (backlog %d): rows with an attempt counted %d after the first %s, %d at its end; "+
		"%d written, %d received (%d duplicates), the outbox empty %s after it came back; relay WARN lines: %d",
		upAt.Sub(downAt).Round(time.Millisecond), backlog, before, onTheWire, after, len(written), len(got), dups,
		drained.Round(time.Millisecond), p.logs.Count(`"level":"WARN"`))
	require.Greater(t, backlog, 100, "the backlog grows while the endpoint is down")
	require.Equal(t, before, after, "attempts counted while the endpoint refused connections")
}
