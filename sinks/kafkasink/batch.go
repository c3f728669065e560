package kafkasink

import (
	"encoding/binary"
	"hash/crc32"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go/protocol"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// The idempotent producer writes its own record batches: kafka-go's
// RecordSet encoder (protocol/record_v2.go, writeToVersion2) always writes
// -1 as producer id, producer epoch and base sequence, and nothing in
// kafka-go sets them. kafka-go's rawproduce request carries batches
// encoded elsewhere, byte for byte; appendBatch is that elsewhere. Apart
// from the three producer fields, its output is the bytes kafka-go's
// encoder writes for the same records (TestBatchMatchesKafkaGo): no
// compression, CreateTime timestamps, record attributes 0.

// producerFields are the idempotent producer's fields of a record batch.
// noProducer is what a batch without an idempotent producer carries.
type producerFields struct {
	id    int64
	epoch int16
	seq   int32 // the base sequence: the first record's
}

var noProducer = producerFields{id: -1, epoch: -1, seq: -1}

// Offsets in a record batch v2 (after the int32 size that precedes it in
// a produce request).
const (
	batchLengthAt = 8  // int32: the batch's length after this field
	batchCRCAt    = 17 // uint32: CRC-32C of everything from attributes on
	batchAttrsAt  = 21 // int16: attributes, where the CRC starts
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendBatch appends to dst the record batch (magic 2) of the messages
// msgs[idx...], in that order, each stamped by stamp, preceded by its
// int32 size as a produce request's partition carries it.
func appendBatch(dst []byte, msgs []sinks.Message, idx []int, stamp func(*sinks.Message) time.Time, p producerFields) []byte {
	size := 4 + recordBatchOverhead
	for _, i := range idx {
		size += recordSize(&msgs[i]) // an upper bound: one allocation
	}
	dst = slices.Grow(dst, size)
	start := len(dst)
	dst = binary.BigEndian.AppendUint32(dst, 0) // size, set below
	batch := len(dst)
	dst = binary.BigEndian.AppendUint64(dst, 0)                  // base offset
	dst = binary.BigEndian.AppendUint32(dst, 0)                  // length, set below
	dst = binary.BigEndian.AppendUint32(dst, 0xffffffff)         // partition leader epoch: -1
	dst = append(dst, 2)                                         // magic
	dst = binary.BigEndian.AppendUint32(dst, 0)                  // crc, set below
	dst = binary.BigEndian.AppendUint16(dst, 0)                  // attributes: no compression, not transactional
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(idx)-1)) // last offset delta
	stamps := batch + 27
	dst = binary.BigEndian.AppendUint64(dst, 0) // first timestamp, set below
	dst = binary.BigEndian.AppendUint64(dst, 0) // max timestamp, set below
	dst = binary.BigEndian.AppendUint64(dst, uint64(p.id))
	dst = binary.BigEndian.AppendUint16(dst, uint16(p.epoch))
	dst = binary.BigEndian.AppendUint32(dst, uint32(p.seq))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(idx)))

	var first, maxTS int64
	var body []byte
	for n, i := range idx {
		m := &msgs[i]
		ts := stamp(m).UnixMilli()
		if n == 0 {
			first, maxTS = ts, ts
		}
		maxTS = max(maxTS, ts)
		body = appendRecordBody(body[:0], m, ts-first, int64(n))
		dst = binary.AppendVarint(dst, int64(len(body)))
		dst = append(dst, body...)
	}
	binary.BigEndian.PutUint64(dst[stamps:], uint64(first))
	binary.BigEndian.PutUint64(dst[stamps+8:], uint64(maxTS))
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-batch))
	binary.BigEndian.PutUint32(dst[batch+batchLengthAt:], uint32(len(dst)-batch-12))
	binary.BigEndian.PutUint32(dst[batch+batchCRCAt:], crc32.Checksum(dst[batch+batchAttrsAt:], castagnoli))
	return dst
}

// appendRecordBody appends record m without its length: attributes,
// timestamp and offset deltas, key, value, headers. It writes what
// record (the kafka-go path) describes: a null key for a message without
// one, a value that is never null, the headers of recordHeaders.
func appendRecordBody(dst []byte, m *sinks.Message, tsDelta, offsetDelta int64) []byte {
	dst = append(dst, 0) // record attributes, unused
	dst = binary.AppendVarint(dst, tsDelta)
	dst = binary.AppendVarint(dst, offsetDelta)
	if m.Key == "" {
		dst = binary.AppendVarint(dst, -1)
	} else {
		dst = binary.AppendVarint(dst, int64(len(m.Key)))
		dst = append(dst, m.Key...)
	}
	dst = binary.AppendVarint(dst, int64(len(m.Payload)))
	dst = append(dst, m.Payload...)
	hs := recordHeaders(m)
	dst = binary.AppendVarint(dst, int64(len(hs)))
	for _, h := range hs {
		dst = binary.AppendVarint(dst, int64(len(h.Key)))
		dst = append(dst, h.Key...)
		if h.Value == nil {
			dst = binary.AppendVarint(dst, -1)
			continue
		}
		dst = binary.AppendVarint(dst, int64(len(h.Value)))
		dst = append(dst, h.Value...)
	}
	return dst
}

// nextSeq is the sequence after n records from seq. Sequences are int32
// and wrap to 0 after math.MaxInt32, as the brokers count them (Kafka's
// DefaultRecordBatch.incrementSequence).
func nextSeq(seq int32, n int) int32 {
	return int32((int64(seq) + int64(n)) % (1 << 31))
}

// recordHeaders are m's record headers: the message id, the position, then
// the application headers sorted by name, without the two names the relay
// owns.
func recordHeaders(m *sinks.Message) []protocol.Header {
	hs := make([]protocol.Header, 0, 2+len(m.Headers))
	hs = append(hs,
		protocol.Header{Key: HeaderMessageID, Value: []byte(m.ID)},
		protocol.Header{Key: HeaderSeq, Value: strconv.AppendInt(nil, m.Seq, 10)})
	for _, k := range sortedKeys(m.Headers) {
		if k == HeaderMessageID || k == HeaderSeq {
			continue
		}
		hs = append(hs, protocol.Header{Key: k, Value: []byte(m.Headers[k])})
	}
	return hs
}
