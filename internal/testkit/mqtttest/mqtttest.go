// Package mqtttest subscribes to an MQTT 5 broker for tests: a paho client
// that keeps what arrives, in arrival order, and the story of its
// connections.
package mqtttest

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
)

// Options shape a Subscriber's session and connections.
type Options struct {
	// SessionExpiry is how long (seconds) the broker keeps the session
	// after a connection ends: with one, the subscriber keeps its
	// subscription and the messages it has not acknowledged across its
	// reconnections, and across a restart of a broker with persistence.
	// 0: the session ends with each connection.
	SessionExpiry uint32
	// KeepAlive is paho's keep alive, in seconds; 0 sends no pings.
	KeepAlive uint16
	// Reconnect is the pause between connection attempts. Default 50 ms.
	Reconnect time.Duration
}

// Subscriber is a paho client subscribed with QoS 1 to one filter. Its
// client id is new, and it never asks for a clean start: it subscribes
// whenever the broker has no session for it. (Mosquitto 2.0 does not save
// across its restart the session of a client connected with clean start:
// seen with 2.0.11, session present false after the restart, and the
// messages published before the subscriber subscribed again were lost to
// it.)
type Subscriber struct {
	// ID is the client id.
	ID string

	mu     sync.Mutex
	got    []*paho.Publish
	next   int           // where Read goes on
	more   chan struct{} // signalled on each arrival
	events []string      // connections up (with session present or not) and down
	failed int           // connection attempts that failed since the last event
}

// Subscribe connects to brokerURL, subscribes to filter and returns once
// the broker confirmed the subscription (the test fails after 15 s).
// The client disconnects when the test ends.
func Subscribe(tb testing.TB, brokerURL, filter string, o Options) *Subscriber {
	tb.Helper()
	u, err := url.Parse(brokerURL)
	require.NoError(tb, err)
	if o.Reconnect <= 0 {
		o.Reconnect = 50 * time.Millisecond
	}
	s := &Subscriber{ID: testkit.RandName("sub"), more: make(chan struct{}, 1)}
	subscribed := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls:            []*url.URL{u},
		KeepAlive:             o.KeepAlive,
		SessionExpiryInterval: o.SessionExpiry,
		ReconnectBackoff:      func(int) time.Duration { return o.Reconnect },
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
		OnConnectError:   func(error) { s.refused() },
		ClientConfig: paho.ClientConfig{
			ClientID:      s.ID,
			OnClientError: func(err error) { s.event("client error: %v", err) },
			OnServerDisconnect: func(d *paho.Disconnect) {
				s.event("DISCONNECT from the server, reason %d", d.ReasonCode)
			},
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				s.mu.Lock()
				s.got = append(s.got, pr.Packet)
				s.mu.Unlock()
				select {
				case s.more <- struct{}{}:
				default:
				}
				return true, nil
			}},
		},
	})
	require.NoError(tb, err)
	tb.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer dcancel()
		_ = cm.Disconnect(dctx)
		cancel()
		<-cm.Done()
	})
	select {
	case err := <-subscribed:
		require.NoError(tb, err, "subscribe to %s", filter)
	case <-time.After(15 * time.Second):
		tb.Fatalf("subscriber: not subscribed to %s on %s after 15s; its connections: %s", filter, brokerURL, s.History())
	}
	return s
}

// Read returns the next n messages that arrived, waiting for them until
// ctx ends.
func (s *Subscriber) Read(ctx context.Context, n int) ([]*paho.Publish, error) {
	for {
		s.mu.Lock()
		if len(s.got)-s.next >= n {
			out := s.got[s.next : s.next+n]
			s.next += n
			s.mu.Unlock()
			return out, nil
		}
		have := len(s.got) - s.next
		s.mu.Unlock()
		select {
		case <-s.more:
		case <-ctx.Done():
			return nil, fmt.Errorf("read %d of %d messages: %w", have, n, ctx.Err())
		}
	}
}

// All returns every message that arrived so far.
func (s *Subscriber) All() []*paho.Publish {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*paho.Publish(nil), s.got...)
}

// History tells the subscriber's connections: when each came up (with
// the session present or not) and went down, and how many attempts
// failed in between, for a test's log.
func (s *Subscriber) History() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.events, "; ")
}

// UserProperty returns the value of p's user property key ("" when it
// has none).
func UserProperty(p *paho.Publish, key string) string {
	if p.Properties == nil {
		return ""
	}
	for _, up := range p.Properties.User {
		if up.Key == key {
			return up.Value
		}
	}
	return ""
}

// refused counts a failed connection attempt; the next event reports how
// many there were.
func (s *Subscriber) refused() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failed++
}

func (s *Subscriber) event(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed > 0 {
		s.events = append(s.events, fmt.Sprintf("%d connection attempts failed", s.failed))
		s.failed = 0
	}
	s.events = append(s.events, fmt.Sprintf("%s after %d messages: %s", time.Now().Format("15:04:05.000"), len(s.got), fmt.Sprintf(format, args...)))
}
