package awsbatch

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/sinks"
)

// The relay's outbox-producer header travels as an attribute while one is
// left, and stays behind when the application's headers take them all:
// a message that fit before the relay named its producer still fits.
func TestProducerAttributeGivesWay(t *testing.T) {
	t.Parallel()
	invalid := errors.New("invalid")
	l := Layout{Service: "SQS", Invalid: invalid, MaxBytes: 256 << 10}
	m := sinks.Message{ID: "id", Seq: 7, Key: "k", Payload: []byte("x"), Headers: map[string]string{sinks.HeaderProducer: "orders/outbox"}}
	names := func(e *Entry) map[string]string {
		out := map[string]string{}
		for _, a := range e.Attrs {
			out[a.Name] = a.Value
		}
		return out
	}
	e, err := l.Build(0, m, "q")
	require.NoError(t, err)
	require.Equal(t, "orders/outbox", names(e)[sinks.HeaderProducer])

	// id, seq and key leave 7 attributes to the application.
	for i := range MaxAttributes - 3 {
		m.Headers[fmt.Sprintf("h%d", i)] = "v"
	}
	e, err = l.Build(0, m, "q")
	require.NoError(t, err)
	require.Len(t, e.Attrs, MaxAttributes)
	require.NotContains(t, names(e), sinks.HeaderProducer)
	require.Equal(t, "v", names(e)["h6"])

	m.Headers["h7"] = "v"
	_, err = l.Build(0, m, "q")
	require.ErrorIs(t, err, invalid, "the application's own headers over the limit are refused")
}
