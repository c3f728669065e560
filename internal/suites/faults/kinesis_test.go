package faults

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
)

// TestKinesisOutage is TestSQSOutage for the Kinesis sink: a throwaway
// kinesalite (its records in LevelDB on disk) is killed under the relay
// binary for outageLength() while applications keep writing, then started
// again on the same port with its stream and records: nothing is lost,
// per-key order holds (a key's records are read back from its shard in
// order), and no attempt is counted while the port refused connections.
// Records are raw, with the writer's header dropped (drop_headers).
func TestKinesisOutage(t *testing.T) {
	t.Parallel()
	srv := throwaway.Kinesalite(t)
	ctx, cancel := context.WithTimeout(context.Background(), runBound())
	defer cancel()
	ac, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion("us-east-1"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
	require.NoError(t, err)
	client := kinesis.NewFromConfig(ac, func(o *kinesis.Options) { o.BaseEndpoint = aws.String(srv.URL()) })
	_, err = client.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String("orders"), ShardCount: aws.Int32(4)})
	require.NoError(t, err)
	testkit.Eventually(t, 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		out, err := client.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String("orders")})
		if err != nil {
			return false, err.Error()
		}
		return out.StreamDescriptionSummary.StreamStatus == types.StreamStatusActive, string(out.StreamDescriptionSummary.StreamStatus)
	})
	sinkURL := "kinesis://?" + url.Values{"stream": {"{topic}"}, "endpoint": {srv.URL()}, "drop_headers": {"true"},
		"region": {"us-east-1"}, "access_key_id": {"test"}, "secret_access_key": {"test"}, "publish_timeout": {"5s"}}.Encode()
	endpointOutage(t, sinkURL, srv.Kill, srv.Start, func([]string) []delivery { return readStream(t, client, "orders") })
}

// readStream reads every record of the stream, shard after shard, each
// shard from its start in its order.
func readStream(t *testing.T, client *kinesis.Client, stream string) []delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), drainBound()) // a 10-minute outage's backlog is 240,000 records
	defer cancel()
	shards, err := client.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(stream)})
	require.NoError(t, err)
	var got []delivery
	for _, s := range shards.Shards {
		it, err := client.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(stream), ShardId: s.ShardId,
			ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		require.NoError(t, err)
		iter := it.ShardIterator
		for iter != nil {
			out, err := client.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: iter, Limit: aws.Int32(10000)})
			require.NoError(t, err)
			for _, r := range out.Records {
				got = append(got, delivery{Key: aws.ToString(r.PartitionKey), Payload: string(r.Data)})
			}
			if len(out.Records) == 0 {
				break // an open shard's iterator never ends: empty means read to its end
			}
			iter = out.NextShardIterator
		}
	}
	return got
}
