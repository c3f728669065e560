package relay_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
)

// The relay names its outbox in every message's outbox-producer header,
// so that a consumer of several outboxes orders each key per producer:
// by default the cluster's system identifier, the database and the
// schema; a name of the configuration's; none with ProducerNone. A name
// the application wrote itself, in any case, is left alone.
func TestProducerNamesEveryMessage(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, producer string
		want           func(e *env) string
	}{
		{"default", "", func(e *env) string {
			var db, id string
			require.NoError(t, e.pool.QueryRow(context.Background(),
				"SELECT current_database(), system_identifier::text FROM pg_control_system()").Scan(&db, &id))
			return id + "/" + url.PathEscape(db) + "/" + url.PathEscape(e.schema)
		}},
		{"configured", "orders", func(*env) string { return "orders" }},
		{"none", relay.ProducerNone, func(*env) string { return "" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			e.write(msg("orders", "k", "bare"),
				outbox.Message{Topic: "orders", Key: "k", Payload: []byte("typed"), Headers: map[string]string{"type": "Placed"}},
				outbox.Message{Topic: "orders", Key: "k", Payload: []byte("own"), Headers: map[string]string{"Outbox-Producer": "app"}})
			cfg := e.config()
			cfg.Producer = c.producer
			e.start(cfg, e.sink)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, e.sink.WaitFor(ctx, 3))
			want := c.want(e)
			got := map[string]map[string]string{}
			for _, m := range e.sink.Delivered() {
				got[string(m.Payload)] = m.Headers
			}
			named := func(h map[string]string) map[string]string {
				if want != "" {
					h[sinks.HeaderProducer] = want
				}
				return h
			}
			require.Equal(t, named(map[string]string{}), nonNil(got["bare"]))
			require.Equal(t, named(map[string]string{"type": "Placed"}), got["typed"])
			require.Equal(t, map[string]string{"Outbox-Producer": "app"}, got["own"], "the application's name wins")
		})
	}
}

func nonNil(h map[string]string) map[string]string {
	if h == nil {
		return map[string]string{}
	}
	return h
}

func TestProducerValidated(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"bad\nname", " padded", "ünicode", string(make([]byte, 256))} {
		err := relay.Config{Producer: p}.WithDefaults().Validate()
		require.ErrorContains(t, err, "outbox: producer:", "%q", p)
	}
	for _, p := range []string{"", relay.ProducerNone, "orders", "7713292241186691262/orders/outbox", "billing service"} {
		require.NoError(t, relay.Config{Producer: p}.WithDefaults().Validate(), "%q", p)
	}
}
