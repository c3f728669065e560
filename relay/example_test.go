package relay_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/sinks"
	"github.com/outbox-relay/outbox-relay/sinks/kafkasink"
	"github.com/outbox-relay/outbox-relay/sinks/memory"
)

// Embedding the relay in an application: one route, published to Kafka,
// until SIGTERM; then it drains and returns.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cfg := relay.Config{Workers: 4}
	pool, err := relay.NewPool(ctx, relay.PoolConfig{URL: "postgres://app@db/app", Workers: cfg.Workers})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	kc, err := kafkasink.ParseURL("kafka://kafka-1:9092,kafka-2:9092")
	if err != nil {
		log.Fatal(err)
	}
	sink, err := kafkasink.New(kc, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close(context.Background())
	r, err := relay.New(pool, sink, cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Fan-out in a library: a router copies "orders.*" to two destination
// relays, each with its own sink, retries and dead letters. (The CLI's
// routes table builds exactly this from `fanout: true`.) One pool serves
// all three, sized by relay.Conns (their workers, three lane leases and
// the shared LISTEN) plus one for health checks.
func Example_fanOut() {
	ctx := context.Background()
	routerCfg := relay.Config{
		Route:  "~fanout",
		Topics: []string{"orders.*"},
		FanOut: []relay.Destination{
			{Route: "kafka", Topics: []string{"orders.*"}},
			{Route: "crm", Topics: []string{"orders.placed"}},
		},
		SharedListener: true,
	}
	kafkaCfg := relay.Config{Route: "kafka", Deliveries: true, SharedListener: true}
	crmCfg := relay.Config{Route: "crm", Deliveries: true, SharedListener: true}
	pool, err := relay.NewPool(ctx, relay.PoolConfig{URL: "postgres://app@db/app",
		MaxConns: relay.Conns(routerCfg, kafkaCfg, crmCfg) + 1})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	kafka, webhook := openSinks()
	router, err := relay.New(pool, nil, routerCfg)
	if err != nil {
		log.Fatal(err)
	}
	toKafka, err := relay.New(pool, kafka, kafkaCfg)
	if err != nil {
		log.Fatal(err)
	}
	toCRM, err := relay.New(pool, webhook, crmCfg)
	if err != nil {
		log.Fatal(err)
	}
	all := []*relay.Relay{router, toKafka, toCRM}
	go relay.Listen(ctx, pool, "outbox", nil, func() {
		for _, r := range all {
			r.Wake()
		}
	})
	for _, r := range all {
		go func() { _ = r.Run(ctx) }()
	}
	<-ctx.Done()
}

// openSinks stands for the application's own sink set-up (kafkasink.New,
// httpsink.New, ...).
func openSinks() (kafka, webhook sinks.Sink) { return memory.New(), memory.New() }
