package kafkasink

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/protocol"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// batchMessages covers what a record can carry: a key or none, an empty,
// a null and a binary payload, application headers (sorted, the relay's
// names dropped, an empty value), an empty id, timestamps going back and
// forth and before the first one.
func batchMessages() ([]sinks.Message, func(*sinks.Message) time.Time) {
	msgs := []sinks.Message{
		msg("t", "k", 1, "first"),
		msg("t", "", 2, ""),
		msg("t", "k2", 3, ""),
		msg("t", "k", 4, strings.Repeat("x", 300)),
		msg("t", "k", 5, "last"),
	}
	msgs[1].Payload = nil
	msgs[2].Payload = []byte{0, 0xff, 0x10}
	msgs[3].Headers = map[string]string{"z": "1", "a": "", HeaderMessageID: "forged", HeaderSeq: "9", "m": "é"}
	msgs[4].ID = ""
	base := time.Date(2026, 3, 1, 12, 0, 0, 123_456_789, time.UTC)
	offsets := []time.Duration{0, 5 * time.Millisecond, -3 * time.Second, time.Hour, 1500 * time.Microsecond}
	stamps := map[string]time.Time{}
	for i := range msgs {
		stamps[msgs[i].ID] = base.Add(offsets[i])
	}
	return msgs, func(m *sinks.Message) time.Time { return stamps[m.ID] }
}

// kafkaGoBatch is the record batch kafka-go's encoder writes for the same
// messages, preceded by its size, as in a produce request.
func kafkaGoBatch(t *testing.T, msgs []sinks.Message, stamp func(*sinks.Message) time.Time) []byte {
	t.Helper()
	records := make([]protocol.Record, len(msgs))
	for i := range msgs {
		records[i] = record(&msgs[i], stamp(&msgs[i]))
	}
	var buf bytes.Buffer
	rs := protocol.RecordSet{Version: 2, Records: protocol.NewRecordReader(records...)}
	_, err := rs.WriteTo(&buf)
	require.NoError(t, err)
	return buf.Bytes()
}

func allIdx(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// Without a producer, the sink's record batch is kafka-go's, byte for
// byte; with one, only the producer fields (and so the CRC) differ, and a
// third decoder (franz-go's) reads them back.
func TestBatchMatchesKafkaGo(t *testing.T) {
	t.Parallel()
	msgs, stamp := batchMessages()
	want := kafkaGoBatch(t, msgs, stamp)
	require.Equal(t, want, appendBatch(nil, msgs, allIdx(len(msgs)), stamp, noProducer))
	require.Equal(t, append([]byte("prefix"), want...), appendBatch([]byte("prefix"), msgs, allIdx(len(msgs)), stamp, noProducer), "appends")

	got := appendBatch(nil, msgs, allIdx(len(msgs)), stamp, producerFields{id: 1<<40 + 7, epoch: 3, seq: 2_000_000_000})
	var b kmsg.RecordBatch
	require.NoError(t, b.ReadFrom(got[4:]))
	require.Equal(t, int64(1<<40+7), b.ProducerID)
	require.Equal(t, int16(3), b.ProducerEpoch)
	require.Equal(t, int32(2_000_000_000), b.FirstSequence)
	require.Equal(t, int32(len(msgs)), b.NumRecords)
	require.Equal(t, int32(len(got)-4-12), b.Length)
	require.Equal(t, int32(crc32.Checksum(got[4+batchAttrsAt:], crc32.MakeTable(crc32.Castagnoli))), b.CRC)

	// Put kafka-go's fields back: the rest is identical.
	patched := bytes.Clone(got)
	binary.BigEndian.PutUint64(patched[4+43:], ^uint64(0))
	binary.BigEndian.PutUint16(patched[4+51:], 0xffff)
	binary.BigEndian.PutUint32(patched[4+53:], 0xffffffff)
	binary.BigEndian.PutUint32(patched[4+batchCRCAt:], crc32.Checksum(patched[4+batchAttrsAt:], crc32.MakeTable(crc32.Castagnoli)))
	require.Equal(t, want, patched)

	// A subset, in the order of idx.
	sub := []sinks.Message{msgs[3], msgs[0]}
	require.Equal(t, kafkaGoBatch(t, sub, stamp), appendBatch(nil, msgs, []int{3, 0}, stamp, noProducer))
}
