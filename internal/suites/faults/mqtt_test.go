package faults

import (
	"context"
	"fmt"
	"net/url"
	"strings"
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
	endpointOutage(t, sinkURL, srv.Stop, srv.Start, func(written []string) []delivery {
		// Everything the relay delivered has a PUBACK, so it is queued
		// for the subscriber; wait until the subscriber has every
		// message, or nothing new came for a minute (a 10-minute
		// outage's last messages are the tails of the keys with the
		// deepest backlog, and a loaded machine delivers them late).
		want := make(map[string]bool, len(written))
		for _, p := range written {
			want[p] = true
		}
		var got []delivery
		seen, n, grew := 0, -1, time.Now()
		eventually(t, drainBound(), 500*time.Millisecond, func() (bool, string) {
			got = sub.deliveries()
			for _, d := range got[seen:] {
				delete(want, d.Payload)
			}
			seen = len(got)
			if len(got) != n {
				n, grew = len(got), time.Now()
			}
			return len(want) == 0 || time.Since(grew) > time.Minute,
				fmt.Sprintf("%d messages not yet at the subscriber", len(want))
		})
		t.Logf("subscriber %s: its connections: %s", sub.id, sub.history())
		if len(want) > 0 {
			t.Logf("subscriber %s: %d of %d messages missing after a minute without a delivery; mosquitto's lines about it:\n%s",
				sub.id, len(want), len(written), srv.OutputLines(sub.id))
		}
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
	id string

	mu     sync.Mutex
	got    []delivery
	events []string // connections up (with session present or not) and down, for the test's log
	failed int      // connection attempts that failed since the last event
}

func mqttSubscribe(t *testing.T, brokerURL, filter string) *mqttSubscriber {
	t.Helper()
	u, err := url.Parse(brokerURL)
	require.NoError(t, err)
	s := &mqttSubscriber{id: testkit.RandName("sub")}
	subscribed := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls: []*url.URL{u},
		// No keep alive. With 30 s, in two of three 10-minute runs the
		// subscriber's connection dropped every 30 s of the drain (the
		// cadence of paho's PINGRESP check, 8 drops in each), and each
		// reconnect had Mosquitto resend what was not yet acknowledged
		// (1,513 and 3,966 duplicates). The broker's stop closes the
		// connection, which paho sees without pings.
		KeepAlive:             0,
		SessionExpiryInterval: 3600,
		ReconnectBackoff:      func(int) time.Duration { return 50 * time.Millisecond },
		ConnectTimeout:        2 * time.Second,
		OnConnectionUp: func(cm *autopaho.ConnectionManager, ca *paho.Connack) {
			s.event("up, session present %t", ca.SessionPresent)
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
		OnConnectionDown: func() bool { s.event("down"); return true },
		OnConnectError:   func(err error) { s.refused(err) },
		ClientConfig: paho.ClientConfig{
			ClientID:      s.id,
			OnClientError: func(err error) { s.event("client error: %v", err) },
			OnServerDisconnect: func(d *paho.Disconnect) {
				s.event("DISCONNECT from the server, reason %d", d.ReasonCode)
			},
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

// refused counts a failed connection attempt (one every 50 ms while the
// broker is down); the next event reports how many there were.
func (s *mqttSubscriber) refused(error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failed++
}

func (s *mqttSubscriber) event(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed > 0 {
		s.events = append(s.events, fmt.Sprintf("%d connection attempts failed", s.failed))
		s.failed = 0
	}
	s.events = append(s.events, time.Now().Format("15:04:05.000")+" after "+fmt.Sprint(len(s.got))+" messages: "+fmt.Sprintf(format, args...))
}

func (s *mqttSubscriber) history() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.events, "; ")
}

func (s *mqttSubscriber) deliveries() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]delivery(nil), s.got...)
}
