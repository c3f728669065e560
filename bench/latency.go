package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/sinks/wire"
)

// latencySpec is one steady-state load: rate commits per second for dur;
// rate 0 means as fast as latencyWriters writers can commit.
type latencySpec struct {
	rate  float64
	dur   time.Duration
	kafka bool // through Kafka (kfake) to a consumer, instead of HTTP
}

// latencyWriters is how many application connections commit messages.
const latencyWriters = 16

func (b *bench) latencies(ctx context.Context) error {
	recv, err := newReceiver()
	if err != nil {
		return err
	}
	defer recv.close()
	specs := append(append([]latencySpec(nil), b.cfg.latency...), latencySpec{rate: 0, dur: b.cfg.maxRateDur})
	for _, sp := range b.cfg.latency {
		k := sp
		k.kafka = true
		specs = append(specs, k)
	}
	for _, sp := range specs {
		name := fmt.Sprintf("%.0f tx/s, 1 message each, HTTP sink", sp.rate)
		if sp.rate == 0 {
			name = fmt.Sprintf("max rate: %d writers committing back to back, HTTP sink", latencyWriters)
		}
		if sp.kafka {
			name = fmt.Sprintf("%.0f tx/s, 1 message each, Kafka sink (kfake, 16 partitions; an independent franz-go consumer)", sp.rate)
		}
		r := &row{Group: "latency", Name: name, PayloadBytes: b.cfg.payload, Keys: b.cfg.keys,
			Batch: b.cfg.batch, Workers: b.cfg.workers, Processes: 1, TargetRate: sp.rate}
		var early []string
		for run := 0; run < b.cfg.runs; run++ {
			if err := b.latencyRun(ctx, recv, sp, r, &early); err != nil {
				b.log.Warn("latency run failed", "rate", sp.rate, "error", err)
				r.addNote("run %d failed: %v", run+1, shorten(err.Error()))
			}
		}
		r.finish()
		if len(early) > 0 {
			r.addNote("messages received before the writer saw its commit return (counted as 0 ms), per run: %s", strings.Join(early, ", "))
		}
		r.addNote("%s per run; writers: %d pgx connections, synchronous_commit on, outbox.Writer; relay binary, default settings", sp.dur, latencyWriters)
		b.rep.add(r)
	}
	return nil
}

func (b *bench) latencyRun(ctx context.Context, recv *receiver, sp latencySpec, r *row, early *[]string) error {
	schema, err := b.newSchema(ctx, "latency")
	if err != nil {
		return err
	}
	defer b.dropSchema(ctx, schema)

	capacity := 400_000
	if sp.rate > 0 {
		capacity = int(sp.rate*sp.dur.Seconds()) + 1
	}
	recv.reset(capacity)
	commits := make([]atomic.Int64, capacity)

	sinkURL := recv.URL
	if sp.kafka {
		url, stop, err := b.kafkaConsumer(ctx, recv)
		if err != nil {
			return err
		}
		defer stop()
		sinkURL = url
	}
	p, err := b.startRelay(ctx, schema, sinkURL, nil)
	if err != nil {
		return err
	}
	defer p.stop()
	if err := b.waitLanes(ctx, schema, 1, 15*time.Second); err != nil {
		return fmt.Errorf("%w; relay stderr: %s", err, p.stderr)
	}

	pc, err := pgxpool.ParseConfig(b.cfg.databaseURL)
	if err != nil {
		return err
	}
	pc.MaxConns, pc.MinConns = latencyWriters, latencyWriters
	pc.ConnConfig.RuntimeParams["application_name"] = "bench-writer"
	app, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer app.Close()
	w, err := outbox.NewWriter(outbox.WriterConfig{Schema: schema})
	if err != nil {
		return err
	}
	write := func(n int64) error {
		tx, err := app.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if err := w.Write(ctx, tx, outbox.Message{
			Topic: "bench", Key: fmt.Sprintf("key-%d", n%int64(b.cfg.keys)), Payload: payloadGo(n, b.cfg.payload),
		}); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	// Warm up the connections and the relay's HTTP connections; these
	// messages are numbered past capacity, so they are not measured.
	const warm = 50
	for i := range warm {
		if err := write(int64(capacity + i)); err != nil {
			return err
		}
	}
	if !recv.waitCount(ctx, warm, 10*time.Second) {
		return fmt.Errorf("warm-up messages not received; relay stderr: %s", p.stderr)
	}
	recv.resetOrder()

	var (
		next    atomic.Int64
		written atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		werr    error
	)
	fail := func(err error) { errOnce.Do(func() { werr = err }) }
	start := time.Now()
	deadline := start.Add(sp.dur)
	var period time.Duration
	if sp.rate > 0 {
		period = time.Duration(float64(time.Second) / sp.rate)
	}
	for range latencyWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(capacity) {
					return
				}
				if period > 0 {
					// Open loop: message i is due at start + i×period,
					// whether or not earlier commits were slow.
					due := start.Add(time.Duration(i) * period)
					if d := time.Until(due); d > 0 {
						time.Sleep(d)
					}
				} else if time.Now().After(deadline) {
					return
				}
				if err := write(i); err != nil {
					fail(err)
					return
				}
				commits[i].Store(time.Now().UnixNano())
				written.Add(1)
			}
		}()
	}
	wg.Wait()
	writeDur := time.Since(start)
	if werr != nil {
		return werr
	}
	n := written.Load()
	if !recv.waitCount(ctx, n, 60*time.Second) {
		return fmt.Errorf("receiver got %d of %d messages", recv.count.Load(), n)
	}
	var lat []float64
	var negative int
	for i := range capacity {
		c, a := commits[i].Load(), recv.arrivals[i].Load()
		if c == 0 || a == 0 {
			continue
		}
		d := float64(a-c) / 1e6
		if d < 0 {
			negative++
			d = 0
		}
		lat = append(lat, d)
	}
	if len(lat) != int(n) {
		return fmt.Errorf("matched %d latencies for %d messages", len(lat), n)
	}
	sort.Float64s(lat)
	res := []float64{percentile(lat, 50), percentile(lat, 95), percentile(lat, 99), lat[len(lat)-1]}
	r.Lat = append(r.Lat, res)
	r.Rates = append(r.Rates, float64(n)/writeDur.Seconds())
	r.Messages = int(n)
	if v := recv.orderViolations(); v > 0 {
		r.addNote("run: %d per-key order violations", v)
	}
	*early = append(*early, fmt.Sprint(negative))
	b.log.Info("latency", "rate", sp.rate, "achieved", int(float64(n)/writeDur.Seconds()), "messages", n,
		"p50_ms", res[0], "p95_ms", res[1], "p99_ms", res[2], "max_ms", res[3])
	return nil
}

// waitLanes waits until procs relays are registered and every one of the
// 256 lanes has a live owner, each relay holding its fair share.
func (b *bench) waitLanes(ctx context.Context, schema string, procs int, limit time.Duration) error {
	s := migrations.Ident(schema)
	q := `SELECT (SELECT count(*) FROM ` + s + `.relays),
       count(*) FILTER (WHERE owner IS NOT NULL AND lease_until > now()),
       coalesce((SELECT min(c) FROM (SELECT count(*) AS c FROM ` + s + `.lanes
                 WHERE owner IS NOT NULL AND lease_until > now() GROUP BY owner) x), 0),
       (SELECT count(DISTINCT owner) FROM ` + s + `.lanes WHERE owner IS NOT NULL AND lease_until > now())
FROM ` + s + `.lanes`
	deadline := time.Now().Add(limit)
	for {
		var relays, owned, minShare, owners int64
		if err := b.pool.QueryRow(ctx, q).Scan(&relays, &owned, &minShare, &owners); err != nil {
			return err
		}
		if relays == int64(procs) && owned == 256 && owners == int64(procs) && minShare >= int64(256/procs) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lanes not balanced after %s: %d relays, %d lanes owned by %d, smallest share %d", limit, relays, owned, owners, minShare)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kafkaConsumer starts a kfake cluster and a franz-go consumer of its
// "bench" topic that hands every record to recv, and returns the relay's
// sink URL and a stop function.
// natsConsumer makes a JetStream stream for the relay's NATS sink and
// records the messages of its subject as a core subscriber receives them
// (they reach it as the stream stores them, before the relay's ack).
func (b *bench) natsConsumer(ctx context.Context, recv *receiver) (string, func(), error) {
	nc, js, name, err := b.natsStream(ctx, 0, "live")
	if err != nil {
		return "", nil, err
	}
	sub, err := nc.Subscribe(natsSubject(name), func(m *nats.Msg) {
		recv.record(time.Now().UnixNano(), m.Header.Get(wire.Key), m.Data)
	})
	if err == nil {
		err = sub.SetPendingLimits(-1, -1)
	}
	if err != nil {
		_ = js.DeleteStream(context.Background(), name)
		nc.Close()
		return "", nil, err
	}
	return b.natsSinkURL(name), func() { _ = sub.Unsubscribe(); _ = js.DeleteStream(context.Background(), name); nc.Close() }, nil
}

func (b *bench) kafkaConsumer(ctx context.Context, recv *receiver) (string, func(), error) {
	url, _, cleanup, err := b.kafkaSetup(ctx, 0)
	if err != nil {
		return "", nil, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.TrimPrefix(url, "kafka://")), kgo.ConsumeTopics("bench"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(10*time.Millisecond))
	if err != nil {
		cleanup()
		return "", nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for cctx.Err() == nil {
			fs := cl.PollFetches(cctx)
			now := time.Now().UnixNano()
			fs.EachRecord(func(r *kgo.Record) { recv.record(now, string(r.Key), r.Value) })
		}
	}()
	return url, func() { cancel(); <-done; cl.Close(); cleanup() }, nil
}
