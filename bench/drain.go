package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-relay/outbox-relay/migrations"
)

// drainSink is one sink the drain workload empties the backlog into.
type drainSink struct {
	name  string
	n     int           // backlog size
	keys  int           // distinct keys (default cfg.keys)
	limit time.Duration // longest run; a slower one is rated on what it delivered (default 10m)
	setup func(ctx context.Context, run int) (url string, check func() string, cleanup func(), err error)
	note  string
}

// drains measures the raw-SQL limit and the relay's backlog drain into
// each sink, interleaving them run by run so drift in the machine hits all
// rows alike.
func (b *bench) drains(ctx context.Context) error {
	cfg := b.cfg
	recv, err := newReceiver()
	if err != nil {
		return err
	}
	defer recv.close()

	var sinksToRun []drainSink
	if cfg.want("drain") {
		sinksToRun = append(sinksToRun,
			drainSink{name: "discard", n: cfg.n, setup: func(context.Context, int) (string, func() string, func(), error) {
				return "discard", nil, func() {}, nil
			}},
			drainSink{name: "http", n: cfg.httpN, note: fmt.Sprintf("in-process net/http receiver, 200 OK; one POST per message; max_concurrency=%d", httpConcurrency), setup: func(ctx context.Context, run int) (string, func() string, func(), error) {
				recv.reset(0)
				check := func() string {
					if !recv.waitCount(ctx, int64(cfg.httpN), 10*time.Second) {
						return fmt.Sprintf("receiver got %d of %d", recv.count.Load(), cfg.httpN)
					}
					if v := recv.orderViolations(); v > 0 {
						return fmt.Sprintf("%d per-key order violations", v)
					}
					return ""
				}
				return fmt.Sprintf("%s?max_concurrency=%d", recv.URL, httpConcurrency), check, func() {}, nil
			}},
			drainSink{name: "kafka", n: cfg.n, note: "kfake (1 broker, 16 partitions) in the bench process", setup: b.kafkaSetup},
		)
		sinksToRun = append(sinksToRun, drainSink{name: "discard, fan-out to 2 routes", n: cfg.scaleN,
			note: "routes `all` (*) and `copy` (*, fanout: true), both discard: the router copies each message to both; rate = messages/s, each delivered twice",
			setup: func(context.Context, int) (string, func() string, func(), error) {
				return configFile("routes:\n  - name: all\n    topics: [\"*\"]\n    sink: discard\n" +
					"  - name: copy\n    topics: [\"*\"]\n    sink: discard\n    fanout: true\n")
			}})
		for _, isolated := range []bool{false, true} {
			name, note, extra := "discard, 2 routes", "routes `bench` (bench) and `other` (other.*), both discard: each route reads the outbox itself", ""
			if isolated {
				name, note, extra = "discard, 2 routes, isolated", "the same routes with isolate-routes: the router copies each message to its route's copies, which the route claims", "isolate-routes: true\n"
			}
			sinksToRun = append(sinksToRun, drainSink{name: name, n: cfg.scaleN, note: note,
				setup: func(context.Context, int) (string, func() string, func(), error) {
					return configFile(extra + "routes:\n  - name: bench\n    topics: [bench]\n    sink: discard\n" +
						"  - name: other\n    topics: [\"other.*\"]\n    sink: discard\n")
				}})
		}
		sinksToRun = append(sinksToRun, drainSink{name: "discard, one hot key", n: cfg.hotN, keys: 1, limit: 60 * time.Second,
			note: "every message in one lane: one worker does all the work", setup: func(context.Context, int) (string, func() string, func(), error) {
				return "discard", nil, func() {}, nil
			}})
		if cfg.amqpURL != "off" {
			sinksToRun = append(sinksToRun, drainSink{name: "amqp", n: cfg.amqpN, note: "RabbitMQ on loopback, durable queue, publisher confirms", setup: b.amqpSetup})
		}
	}

	raw := &row{Group: "drain", Name: "raw SQL claim+delete (yardstick)", Messages: cfg.n, PayloadBytes: cfg.payload,
		Keys: cfg.keys, Batch: cfg.batch, Workers: cfg.workers, Processes: 1, Mode: "pgx loop, synchronous_commit=off",
		Note: "DELETE … WHERE id IN (SELECT id … ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED) RETURNING id, topic, key, payload, headers; 2 connections"}
	rows := map[string]*row{}
	for _, s := range sinksToRun {
		if s.keys == 0 {
			s.keys = cfg.keys
		}
		rows[s.name] = &row{Group: "drain", Name: "relay → " + s.name, Messages: s.n, PayloadBytes: cfg.payload,
			Keys: s.keys, Batch: cfg.batch, Workers: cfg.workers, Processes: 1, Note: s.note}
	}
	// Each sink's own yardstick, run just before the relay's drain into it.
	yard := map[string]*row{}
	yardRun := map[string]func(run int) error{}
	for _, s := range sinksToRun {
		switch s.name {
		case "amqp":
			yard[s.name] = &row{Group: "drain", Name: "raw amqp091-go publisher (yardstick of amqp)", Messages: s.n, PayloadBytes: cfg.payload,
				Keys: cfg.keys, Batch: amqpRound, Mode: "in-process",
				Note: fmt.Sprintf("one channel, confirm mode, persistent, mandatory, rounds of %d publishes whose confirms are awaited together; same exchange and durable queue as the relay's drain", amqpRound)}
			yardRun[s.name] = func(run int) error { return b.rawAMQPRun(ctx, yard["amqp"], run) }
		case "http":
			yard[s.name] = &row{Group: "drain", Name: "raw net/http client (yardstick of http)", Messages: s.n, PayloadBytes: cfg.payload,
				Keys: cfg.keys, Mode: "in-process",
				Note: fmt.Sprintf("%d requests in flight (the sink's max_concurrency), same receiver, no order", httpConcurrency)}
			yardRun[s.name] = func(int) error { return b.rawHTTPRun(ctx, yard["http"], recv) }
		case "kafka":
			yard[s.name] = &row{Group: "drain", Name: "plain unordered pipeline → kafka (yardstick of kafka)", Messages: s.n, PayloadBytes: cfg.payload,
				Keys: cfg.keys, Batch: cfg.batch, Workers: cfg.workers, Processes: 1, Mode: "in-process, synchronous_commit=off",
				Note: "per connection: BEGIN; DELETE … id IN (SELECT … ORDER BY id LIMIT batch FOR UPDATE SKIP LOCKED) RETURNING …; the relay's Kafka sink, one Send; COMMIT. No lanes, no order; same kfake setup"}
			yardRun[s.name] = func(run int) error { return b.unorderedKafkaRun(ctx, yard["kafka"], run) }
		}
		if y := yard[s.name]; y != nil {
			rows[s.name].Yardstick = y.Name
		}
	}
	for run := 0; run < cfg.runs; run++ {
		if err := b.rawRun(ctx, raw); err != nil {
			return fmt.Errorf("raw SQL: %w", err)
		}
		for _, s := range sinksToRun {
			if f := yardRun[s.name]; f != nil {
				if err := f(run); err != nil {
					b.log.Warn("yardstick failed", "sink", s.name, "error", err)
					yard[s.name].addNote("run %d failed: %v", run+1, shorten(err.Error()))
				}
			}
			if err := b.drainRun(ctx, rows[s.name], s, run); err != nil {
				b.log.Warn("drain failed", "sink", s.name, "error", err)
				rows[s.name].addNote("run %d failed: %v", run+1, shorten(err.Error()))
			}
		}
	}
	raw.finish()
	b.rep.RawRate = raw.Rate
	if len(raw.Rates) > 0 {
		b.rep.RawBest = slices.Max(raw.Rates)
	}
	b.rep.add(raw)
	for _, s := range sinksToRun {
		r := rows[s.name]
		r.finish()
		if y := yard[s.name]; y != nil {
			y.finish()
			b.rep.add(y)
			if y.Rate > 0 {
				r.YardRatio = r.Rate / y.Rate
			}
		}
		if d := rows["discard"]; strings.HasPrefix(s.name, "discard, fan-out") && d != nil && d.Rate > 0 {
			r.Yardstick, r.YardRatio = d.Name, r.Rate/d.Rate
		}
		b.rep.add(r)
	}
	return nil
}

func shorten(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// rawRun is one run of the yardstick: the tightest claim+delete loop, in
// as many connections as the relay has workers.
func (b *bench) rawRun(ctx context.Context, r *row) error {
	schema, err := b.newSchema(ctx, "raw")
	if err != nil {
		return err
	}
	defer b.dropSchema(ctx, schema)
	if err := b.loadBacklog(ctx, schema, b.cfg.n, b.cfg.keys); err != nil {
		return err
	}
	pc, err := pgxpool.ParseConfig(b.cfg.databaseURL)
	if err != nil {
		return err
	}
	pc.MaxConns = int32(b.cfg.workers)
	pc.MinConns = int32(b.cfg.workers)
	pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()
	q := rawClaimSQL(schema, b.cfg.batch)
	// Connect (and prepare) before the clock starts.
	conns := make([]*pgxpool.Conn, b.cfg.workers)
	for i := range conns {
		if conns[i], err = pool.Acquire(ctx); err != nil {
			return err
		}
		defer conns[i].Release()
	}
	if note := b.awaitHorizon(ctx); note != "" {
		r.addNote("run %d: %s", len(r.Rates)+1, note)
	}
	var total int64
	var mu sync.Mutex
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(conns))
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var (
				id      int64
				topic   string
				key     *string
				payload []byte
				headers []byte
				got     int64
			)
			for {
				rows, err := c.Query(ctx, q)
				if err != nil {
					errs <- err
					return
				}
				tag, err := pgx.ForEachRow(rows, []any{&id, &topic, &key, &payload, &headers}, func() error { return nil })
				if err != nil {
					errs <- err
					return
				}
				got += tag.RowsAffected()
				if tag.RowsAffected() == 0 {
					break
				}
			}
			mu.Lock()
			total += got
			mu.Unlock()
		}()
	}
	wg.Wait()
	el := time.Since(start)
	close(errs)
	for err := range errs {
		return err
	}
	if left, err := b.countMessages(ctx, schema); err != nil || left != 0 || total != int64(b.cfg.n) {
		return fmt.Errorf("raw loop left %d rows, received %d (err %v)", left, total, err)
	}
	r.addRun(float64(b.cfg.n)/el.Seconds(), 0)
	b.log.Info("raw SQL", "rate", int(float64(b.cfg.n)/el.Seconds()), "took", el.Round(time.Millisecond))
	return nil
}

func (b *bench) drainRun(ctx context.Context, r *row, s drainSink, run int) error {
	schema, err := b.newSchema(ctx, "drain_"+s.name)
	if err != nil {
		return err
	}
	defer b.dropSchema(ctx, schema)
	keys := s.keys
	if keys == 0 {
		keys = b.cfg.keys
	}
	if err := b.loadBacklog(ctx, schema, s.n, keys); err != nil {
		return err
	}
	url, check, cleanup, err := s.setup(ctx, run)
	if err != nil {
		return err
	}
	defer cleanup()
	if note := b.awaitHorizon(ctx); note != "" {
		r.addNote("run %d: %s", run+1, note)
	}
	limit := s.limit
	if limit == 0 {
		limit = 10 * time.Minute
	}
	res, err := b.drain(ctx, schema, url, limit)
	delivered := s.n
	if errors.Is(err, errTimeLimit) {
		left, cerr := b.countMessages(ctx, schema)
		if cerr != nil {
			return cerr
		}
		delivered = s.n - int(left)
		res.elapsed = limit
		r.addNote("run %d: stopped after %s with %d of %d delivered, rated on those", run+1, limit, delivered, s.n)
	} else if err != nil {
		return err
	} else if left, err := b.countMessages(ctx, schema); err != nil || left != 0 {
		return fmt.Errorf("outbox not empty after the relay exited: %d left (%v)", left, err)
	}
	if dead, _ := b.countDead(ctx, schema); dead > 0 {
		r.addNote("run %d: %d dead letters", run+1, dead)
	}
	if check != nil {
		if msg := check(); msg != "" {
			r.addNote("run %d: %s", run+1, msg)
			r.OrderOK = "FAILED"
		} else if s.name == "http" && r.OrderOK == "" {
			r.OrderOK = "ok"
		}
	}
	r.Mode = res.mode
	rate := float64(delivered) / res.elapsed.Seconds()
	r.addRun(rate, res.rssMiB)
	b.log.Info("drain", "sink", s.name, "mode", res.mode, "rate", int(rate), "took", res.elapsed.Round(time.Millisecond), "peak_rss_mib", int(res.rssMiB))
	return nil
}

// kafkaSetup starts a fresh kfake cluster for one run.
func (b *bench) kafkaSetup(_ context.Context, _ int) (string, func() string, func(), error) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(16, "bench"))
	if err != nil {
		return "", nil, nil, err
	}
	return "kafka://" + c.ListenAddrs()[0], nil, c.Close, nil
}

// amqpSetup declares an exchange and a bound durable queue for one run;
// the check reads the queue depth, the cleanup deletes both.
func (b *bench) amqpSetup(ctx context.Context, run int) (string, func() string, func(), error) {
	conn, err := amqp.Dial(b.cfg.amqpURL)
	if err != nil {
		return "", nil, nil, fmt.Errorf("rabbitmq at %s: %w", b.cfg.amqpURL, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return "", nil, nil, err
	}
	name := fmt.Sprintf("obbench.%d.%d", os.Getpid(), run)
	fail := func(err error) (string, func() string, func(), error) {
		conn.Close()
		return "", nil, nil, err
	}
	if err := ch.ExchangeDeclare(name, "direct", false, true, false, false, nil); err != nil {
		return fail(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		return fail(err)
	}
	if err := ch.QueueBind(name, "bench", name, false, nil); err != nil {
		return fail(err)
	}
	check := func() string {
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			return "queue check: " + err.Error()
		}
		if q.Messages != b.cfg.amqpN {
			return fmt.Sprintf("queue holds %d of %d messages", q.Messages, b.cfg.amqpN)
		}
		return ""
	}
	cleanup := func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = ch.ExchangeDelete(name, false, false)
		conn.Close()
	}
	u := b.cfg.amqpURL
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + "exchange=" + name, check, cleanup, nil
}

// rawClaimSQL is the raw-SQL yardstick's statement on schema's outbox:
// delete up to limit rows in id order, skipping locked ones, and return
// them. No lanes, no order per key, no retries.
func rawClaimSQL(schema string, limit int) string {
	s := migrations.Ident(schema)
	return fmt.Sprintf(`DELETE FROM %[1]s.messages WHERE id IN (
    SELECT id FROM %[1]s.messages ORDER BY id LIMIT %[2]d FOR UPDATE SKIP LOCKED)
RETURNING id, topic, key, payload, headers`, s, limit)
}

// configFile writes a relay config file of the given content for one
// drain run: the sink argument that runs the relay with it, and the
// cleanup that removes it.
func configFile(content string) (string, func() string, func(), error) {
	f, err := os.CreateTemp("", "bench-routes-*.yaml")
	if err != nil {
		return "", nil, nil, err
	}
	_, err = f.WriteString(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return "config:" + f.Name(), nil, func() { os.Remove(f.Name()) }, err
}
