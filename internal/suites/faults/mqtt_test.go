package faults

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/internal/testkit/throwaway"
)

// TestMQTTOutage stops a throwaway Mosquitto (SIGTERM: it saves its
// sessions) under the relay binary for outageLength() while applications
// keep writing, then starts it again on the same port and data: nothing
// is lost at a subscriber (a QoS 1 subscription in a session that
// outlives the restart), per-key order holds, and no attempt is counted
// while the broker is unreachable (the sink reports a refused connection
// as not attempted), beyond the messages on the wire when it went away.
func TestMQTTOutage(t *testing.T) {
	t.Parallel()
	srv := throwaway.Mosquitto(t, "persistence true", "persistence_location "+t.TempDir()+"/",
		"max_queued_messages 0", "max_inflight_messages 0")
	sub := mqttSubscribe(t, srv.URL(), "orders")
	sinkURL := srv.URL() + "?" + url.Values{"reconnect_initial": {"100ms"}, "reconnect_max": {"500ms"}}.Encode()
	endpointOutage(t, sinkURL, srv.Stop, srv.Start, func() []delivery {
		// Everything the relay delivered has a PUBACK, so it is queued
		// for the subscriber; wait until the queue ran dry: nothing new
		// for 10 s (half a second without a delivery ended the wait
		// early on a loaded machine, the last 2,600 of a 10-minute
		// outage's messages still on their way).
		var got []delivery
		n, grew := -1, time.Now()
		eventually(t, drainBound(), 500*time.Millisecond, func() (bool, string) {
			got = sub.deliveries()
			if len(got) != n {
				n, grew = len(got), time.Now()
			}
			return time.Since(grew) > 10*time.Second, "the subscriber still receives"
		})
		return got
	})
}

// mqttSubscriber is a paho client subscribed with QoS 1 in a session
// that outlives its connections (an hour's expiry). Its client id is new,
// and it never asks for a clean start: Mosquitto 2.0 does not save across
// its restart the session of a client connected with clean start (seen
// with 2.0.11: session present false after the restart, and the messages
// published before the subscriber subscribed again were lost to it).
type mqttSubscriber struct {
	mu  sync.Mutex
	got []delivery
}

func mqttSubscribe(t *testing.T, brokerURL, filter string) *mqttSubscriber {
	t.Helper()
	u, err := url.Parse(brokerURL)
	require.NoError(t, err)
	s := &mqttSubscriber{}
	subscribed := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls:            []*url.URL{u},
		KeepAlive:             30,
		SessionExpiryInterval: 3600,
		ReconnectBackoff:      func(int) time.Duration { return 50 * time.Millisecond },
		ConnectTimeout:        2 * time.Second,
		OnConnectionUp: func(cm *autopaho.ConnectionManager, ca *paho.Connack) {
			if ca.SessionPresent {
				return
			}
			go func() {
				sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
				defer scancel()
				_, err := cm.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
				select {
				case subscribed <- err:
				default:
				}
			}()
		},
		ClientConfig: paho.ClientConfig{
			ClientID: testkit.RandName("sub"),
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				d := delivery{Topic: pr.Packet.Topic, Payload: string(pr.Packet.Payload)}
				if pr.Packet.Properties != nil {
					for _, up := range pr.Packet.Properties.User {
						switch up.Key {
						case "outbox-id":
							d.ID = up.Value
						case "outbox-key":
							d.Key = up.Value
						}
					}
				}
				s.mu.Lock()
				s.got = append(s.got, d)
				s.mu.Unlock()
				return true, nil
			}},
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer dcancel()
		_ = cm.Disconnect(dctx)
		cancel()
		<-cm.Done()
	})
	select {
	case err := <-subscribed:
		require.NoError(t, err, "subscribe to %s", filter)
	case <-time.After(15 * time.Second):
		t.Fatalf("subscriber: not subscribed to %s on %s after 15s", filter, brokerURL)
	}
	return s
}

func (s *mqttSubscriber) deliveries() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]delivery(nil), s.got...)
}
