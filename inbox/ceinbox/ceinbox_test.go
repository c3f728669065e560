package ceinbox_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/inbox"
	"github.com/outbox-relay/outbox-relay/inbox/ceinbox"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/format"
)

// The relay's CloudEvents format, encoded for each binding, reads back as
// the message's id, key and position.
func TestFromTheRelaysCloudEvents(t *testing.T) {
	t.Parallel()
	m := sinks.Message{ID: "0190a4c2-7b1e-7c3a-9a53-2f1c2d3e4f50", Seq: 1093, Topic: "orders", Key: "order 42 €",
		Payload: []byte("{}"), CreatedAt: time.Now(), Headers: map[string]string{sinks.HeaderProducer: "orders/outbox"}}
	want := inbox.Message{ID: m.ID, Key: m.Key, Seq: 1093, Producer: "orders/outbox"}

	kf, err := format.CloudEvents(format.Options{Binding: format.BindingKafka})
	require.NoError(t, err)
	out, err := kf.Encode(m)
	require.NoError(t, err)
	got, err := ceinbox.Kafka(func(n string) string { return out.Headers[n] })
	require.NoError(t, err)
	require.Equal(t, want, got)

	hf, err := format.CloudEvents(format.Options{Binding: format.BindingHTTP})
	require.NoError(t, err)
	out, err = hf.Encode(m)
	require.NoError(t, err)
	h := http.Header{}
	for k, v := range out.Headers {
		h.Set(k, v)
	}
	got, err = ceinbox.HTTP(h)
	require.NoError(t, err)
	require.Equal(t, want, got)

	// subject stands in for a missing partitionkey; no id is an error.
	got, err = ceinbox.Message(func(a string) string { return map[string]string{"id": "x", "subject": "s"}[a] })
	require.NoError(t, err)
	require.Equal(t, inbox.Message{ID: "x", Key: "s"}, got)
	_, err = ceinbox.Message(func(string) string { return "" })
	require.ErrorIs(t, err, ceinbox.ErrNoID)
	_, err = ceinbox.Message(func(a string) string { return map[string]string{"id": "x", "outboxseq": "-3"}[a] })
	require.ErrorContains(t, err, "outboxseq")
}
