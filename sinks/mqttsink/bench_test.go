package mqttsink

import (
	"context"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/outbox-relay/outbox-relay/internal/testkit"
	"github.com/outbox-relay/outbox-relay/sinks/sinktest"
)

// BenchmarkSend is one Send of 500 messages of 200 bytes over 100 keys
// into the benchmark's own Mosquitto (straight, no proxy), against the
// same 500 messages published with QoS 1 by a raw paho client on one
// connection, all at once (no order per key) and waited for, with the
// same user properties. The raw client is the yardstick: the sink holds
// each key to one message in flight, the raw client does not. The ratio
// of the two, measured in the same run, is logged (-v).
func BenchmarkSend(b *testing.B) {
	br := broker(b)
	ctx := context.Background()
	var sinkRate, rawRate float64
	b.Run("sink", func(b *testing.B) {
		e := setup(b, br, direct(), withConfig(func(c *Config) { c.Topic = "{topic}" }))
		batch := sinktest.Batch(e.topic("bench"), 500, 100, 200)
		for b.Loop() {
			if err := e.sink.Send(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
		sinkRate = float64(b.N*len(batch)) / b.Elapsed().Seconds()
		b.ReportMetric(sinkRate, "msg/s")
	})
	b.Run("raw-paho", func(b *testing.B) {
		u, err := url.Parse(br.URL())
		if err != nil {
			b.Fatal(err)
		}
		cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
			ServerUrls: []*url.URL{u}, KeepAlive: 30, CleanStartOnInitialConnection: true,
			ClientConfig: paho.ClientConfig{ClientID: testkit.RandName("raw")},
		})
		if err != nil {
			b.Fatal(err)
		}
		defer func() {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_ = cm.Disconnect(dctx)
		}()
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := cm.AwaitConnection(actx); err != nil {
			b.Fatal(err)
		}
		batch := sinktest.Batch(testkit.RandName("t")+"/bench", 500, 100, 200)
		pubs := make([]*paho.Publish, len(batch))
		for i, m := range batch {
			pubs[i] = &paho.Publish{QoS: 1, Topic: m.Topic, Payload: m.Payload, Properties: &paho.PublishProperties{
				User: paho.UserProperties{{Key: PropID, Value: m.ID}, {Key: PropSeq, Value: strconv.FormatInt(m.Seq, 10)}, {Key: PropKey, Value: m.Key}}}}
		}
		for b.Loop() {
			var wg sync.WaitGroup
			errs := make(chan error, len(pubs))
			for _, p := range pubs {
				wg.Go(func() {
					if _, err := cm.Publish(ctx, p); err != nil {
						errs <- err
					}
				})
			}
			wg.Wait()
			select {
			case err := <-errs:
				b.Fatal(err)
			default:
			}
		}
		rawRate = float64(b.N*len(batch)) / b.Elapsed().Seconds()
		b.ReportMetric(rawRate, "msg/s")
	})
	if sinkRate > 0 && rawRate > 0 {
		b.Logf("sink %.0f msg/s, raw paho %.0f msg/s: ratio %.2f", sinkRate, rawRate, sinkRate/rawRate)
	}
}
