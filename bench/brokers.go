package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// brokers measures the NATS JetStream and Redis Streams sinks against
// each server's raw ceiling, in the same run and alternating (raw, relay,
// raw, relay, ...): a raw nats.go async publisher (Nats-Msg-Id set, acks
// pipelined) and a raw go-redis pipeline of XADDs (one round trip per
// 500 messages, on as many connections as the relay has workers) push the
// same messages (200-byte payload, 1,000 keys) the relay drains from the
// outbox. The relay rows' notes give the ratio to the raw publisher.
//
// A first row drains the same backlog into the discard sink: the relay's
// own ceiling on this machine (claim and settle, no sink work), which no
// sink can beat. Each relay row's note gives the ratio to it as well, so
// that a low ratio to the raw publisher can be told apart from a slow
// sink.
func (b *bench) brokers(ctx context.Context) error {
	type target struct {
		name, note string
		raw        func(ctx context.Context, run int) (float64, error)
		setup      func(ctx context.Context, run int) (string, func() string, func(), error)
	}
	var targets []target
	if u := b.cfg.natsURL; u != "off" {
		targets = append(targets, target{name: "nats",
			note: "JetStream file stream on loopback, Nats-Msg-Id = message id, ordering=strict: acks pipelined in per-key rounds",
			raw:  b.natsRaw, setup: b.natsSetup},
			target{name: "nats_pipelined",
				note: "as above, ordering=pipelined: the whole batch in flight at once",
				raw:  b.natsRaw, setup: func(ctx context.Context, run int) (string, func() string, func(), error) {
					u, check, cleanup, err := b.natsSetup(ctx, run)
					return u + "&ordering=pipelined", check, cleanup, err
				}})
	}
	if u := b.cfg.redisURL; u != "off" {
		targets = append(targets, target{name: "redis",
			note: "one EVALSHA of XADDs per batch, loopback Redis",
			raw:  b.redisRaw, setup: b.redisSetup})
	}
	var ceiling float64
	if len(targets) > 0 {
		disc := &row{Group: "brokers", Name: "relay → discard (the relay's own ceiling)", Messages: b.cfg.brokerN,
			PayloadBytes: b.cfg.payload, Keys: b.cfg.keys, Batch: b.cfg.batch, Workers: b.cfg.workers, Processes: 1,
			Note: "the same backlog drained into the discard sink: claim and settle only"}
		for run := 0; run < b.cfg.runs; run++ {
			if err := b.drainRun(ctx, disc, drainSink{name: "discard", n: b.cfg.brokerN,
				setup: func(context.Context, int) (string, func() string, func(), error) {
					return "discard", nil, func() {}, nil
				}}, run); err != nil {
				b.log.Warn("drain failed", "sink", "discard", "error", err)
				disc.addNote("run %d failed: %v", run+1, shorten(err.Error()))
			}
		}
		disc.finish()
		ceiling = disc.Rate
		b.rep.add(disc)
	}
	for _, tg := range targets {
		raw := &row{Group: "brokers", Name: "raw " + tg.name + " publisher (yardstick)", Messages: b.cfg.brokerN,
			PayloadBytes: b.cfg.payload, Keys: b.cfg.keys, Batch: b.cfg.batch, Workers: b.cfg.workers, Processes: 1}
		rel := &row{Group: "brokers", Name: "relay → " + tg.name, Messages: b.cfg.brokerN, PayloadBytes: b.cfg.payload,
			Keys: b.cfg.keys, Batch: b.cfg.batch, Workers: b.cfg.workers, Processes: 1, Note: tg.note}
		switch {
		case strings.HasPrefix(tg.name, "nats"):
			raw.Note = "nats.go jetstream.PublishMsgAsync, max 4,096 pending, Nats-Msg-Id set, no database"
		case tg.name == "redis":
			raw.Note = fmt.Sprintf("go-redis pipelines of %d XADDs (fields id, key, payload), %d connections, no database", b.cfg.batch, b.cfg.workers)
		}
		var ratios []float64
		for run := 0; run < b.cfg.runs; run++ {
			rate, err := tg.raw(ctx, run)
			if err != nil {
				b.log.Warn("raw publisher failed", "sink", tg.name, "error", err)
				raw.addNote("run %d failed: %v", run+1, shorten(err.Error()))
				continue
			}
			raw.addRun(rate, 0)
			b.log.Info("raw publisher", "sink", tg.name, "rate", int(rate))
			before := len(rel.Rates)
			if err := b.drainRun(ctx, rel, drainSink{name: tg.name, n: b.cfg.brokerN, setup: tg.setup}, run); err != nil {
				b.log.Warn("drain failed", "sink", tg.name, "error", err)
				rel.addNote("run %d failed: %v", run+1, shorten(err.Error()))
				continue
			}
			if len(rel.Rates) > before {
				ratios = append(ratios, rel.Rates[len(rel.Rates)-1]/rate)
			}
		}
		raw.finish()
		rel.finish()
		if len(ratios) > 0 {
			slices.Sort(ratios)
			rel.addNote("%.2f × the raw publisher (median of %d A/B pairs; per pair %s)", ratios[len(ratios)/2], len(ratios), fmtRatios(ratios))
		}
		if ceiling > 0 && rel.Rate > 0 && raw.Rate > 0 {
			rel.addNote("%.2f × the relay's discard ceiling, which is itself %.2f × the raw publisher", rel.Rate/ceiling, ceiling/raw.Rate)
		}
		b.rep.add(raw)
		b.rep.add(rel)
	}
	return nil
}

func fmtRatios(rs []float64) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprintf("%.2f", r)
	}
	return strings.Join(s, ", ")
}

// benchMessages are the messages the raw publishers push: those of the
// outbox backlog (topic bench, keys key-0..key-999, 200-byte payloads).
func (b *bench) benchMessages() (ids, keys []string, payloads [][]byte) {
	n := b.cfg.brokerN
	ids, keys, payloads = make([]string, n), make([]string, n), make([][]byte, n)
	for i := range n {
		ids[i] = uuid.NewString()
		keys[i] = fmt.Sprintf("key-%d", (i+1)%b.cfg.keys)
		payloads[i] = payloadGo(int64(i+1), b.cfg.payload)
	}
	return ids, keys, payloads
}

func (b *bench) natsStream(ctx context.Context, run int, kind string) (*nats.Conn, jetstream.JetStream, string, error) {
	nc, err := nats.Connect(b.cfg.natsURL)
	if err != nil {
		return nil, nil, "", fmt.Errorf("nats at %s: %w", b.cfg.natsURL, err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		return nil, nil, "", err
	}
	name := fmt.Sprintf("OBBENCH_%d_%d_%s", os.Getpid(), run, kind)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{natsSubject(name)}, Storage: jetstream.FileStorage}); err != nil {
		nc.Close()
		return nil, nil, "", err
	}
	return nc, js, name, nil
}

// natsSubject is the subject of the bench's messages (topic "bench") in
// stream name.
func natsSubject(name string) string { return strings.ToLower(name) + ".bench" }

// natsSinkURL is the relay's NATS sink into stream name, a subject per
// topic.
func (b *bench) natsSinkURL(name string) string {
	return b.cfg.natsURL + "?stream=" + name + "&subject=" + strings.ToLower(name) + ".{topic}"
}

// natsRaw publishes the messages with a raw async publisher and returns
// its rate (publish start to the last ack).
func (b *bench) natsRaw(ctx context.Context, run int) (float64, error) {
	nc, js, name, err := b.natsStream(ctx, run, "raw")
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	defer func() { _ = js.DeleteStream(context.Background(), name) }()
	ids, keys, payloads := b.benchMessages()
	subject := natsSubject(name)
	start := time.Now()
	for i := range ids {
		m := &nats.Msg{Subject: subject, Data: payloads[i], Header: nats.Header{"Nats-Msg-Id": {ids[i]}, wire.Key: {keys[i]}}}
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
			return 0, err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		return 0, fmt.Errorf("acks not in after 2 minutes")
	}
	elapsed := time.Since(start)
	s, err := js.Stream(ctx, name)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	if int(info.State.Msgs) != len(ids) {
		return 0, fmt.Errorf("raw publisher: stream holds %d of %d", info.State.Msgs, len(ids))
	}
	return float64(len(ids)) / elapsed.Seconds(), nil
}

// natsSetup creates a stream for one relay drain; the check counts it.
func (b *bench) natsSetup(ctx context.Context, run int) (string, func() string, func(), error) {
	nc, js, name, err := b.natsStream(ctx, run, "relay")
	if err != nil {
		return "", nil, nil, err
	}
	check := func() string {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return err.Error()
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err.Error()
		}
		if int(info.State.Msgs) != b.cfg.brokerN {
			return fmt.Sprintf("stream holds %d of %d", info.State.Msgs, b.cfg.brokerN)
		}
		return ""
	}
	cleanup := func() { _ = js.DeleteStream(context.Background(), name); nc.Close() }
	return b.natsSinkURL(name), check, cleanup, nil
}

func (b *bench) redisClient() (*redis.Client, error) {
	opts, err := redis.ParseURL(b.cfg.redisURL)
	if err != nil {
		return nil, err
	}
	opts.DisableIdentity = true
	opts.PoolSize = b.cfg.workers + 2
	return redis.NewClient(opts), nil
}

// redisRaw pushes the messages as pipelines of XADDs, one batch per
// round trip, on as many connections as the relay has workers.
func (b *bench) redisRaw(ctx context.Context, run int) (float64, error) {
	rdb, err := b.redisClient()
	if err != nil {
		return 0, err
	}
	defer rdb.Close()
	key := fmt.Sprintf("obbench:%d:%d:raw", os.Getpid(), run)
	defer rdb.Del(context.Background(), key)
	ids, keys, payloads := b.benchMessages()
	next := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, b.cfg.workers)
	start := time.Now()
	for range b.cfg.workers {
		wg.Go(func() {
			for from := range next {
				p := rdb.Pipeline()
				for i := from; i < min(from+b.cfg.batch, len(ids)); i++ {
					p.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"id", ids[i], "key", keys[i], "payload", payloads[i]}})
				}
				if _, err := p.Exec(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for from := 0; from < len(ids); from += b.cfg.batch {
		next <- from
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	if n, err := rdb.XLen(ctx, key).Result(); err != nil || int(n) != len(ids) {
		return 0, fmt.Errorf("raw pipeline: stream holds %d of %d (%v)", n, len(ids), err)
	}
	return float64(len(ids)) / elapsed.Seconds(), nil
}

// redisSetup names a stream for one relay drain; the check counts it.
func (b *bench) redisSetup(ctx context.Context, run int) (string, func() string, func(), error) {
	rdb, err := b.redisClient()
	if err != nil {
		return "", nil, nil, err
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return "", nil, nil, fmt.Errorf("redis at %s: %w", b.cfg.redisURL, err)
	}
	key := fmt.Sprintf("obbench:%d:%d:relay", os.Getpid(), run)
	check := func() string {
		n, err := rdb.XLen(ctx, key).Result()
		if err != nil {
			return err.Error()
		}
		if int(n) != b.cfg.brokerN {
			return fmt.Sprintf("stream holds %d of %d", n, b.cfg.brokerN)
		}
		return ""
	}
	cleanup := func() { rdb.Del(context.Background(), key); rdb.Close() }
	sep := "?"
	if strings.Contains(b.cfg.redisURL, "?") {
		sep = "&"
	}
	return b.cfg.redisURL + sep + "stream=" + key, check, cleanup, nil
}
