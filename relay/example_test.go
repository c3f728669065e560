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

// Several routes in one process: orders to Kafka, billing to a webhook
// with its own retry policy. Messages of other topics are dead-lettered
// with the reason `no route matches topic "…"` (the Set adds that
// route), where an operator sees them. One pool serves every route, sized
// as the daemon sizes it (runRoutes).
func ExampleNewSet() {
	kafka, webhook := openSinks()
	base := relay.Config{Workers: 4}
	billing := base
	billing.MaxAttempts = 50
	runRoutes(relay.SetConfig{Config: base, Routes: []relay.Route{
		{Name: "orders", Topics: []string{"orders.*"}, Sink: kafka},
		{Name: "billing", Topics: []string{"billing.*", "invoices.*"}, Sink: webhook, Config: &billing},
	}})
}

// Fan-out in a library: "orders.*" goes to Kafka, and "orders.placed"
// also to the CRM's webhook. Each destination has its own retries and
// dead letters; the Set adds the fan-out router that copies the messages
// for them (as the CLI's routes table does for `fanout: true`).
func Example_fanOut() {
	kafka, webhook := openSinks()
	runRoutes(relay.SetConfig{Routes: []relay.Route{
		{Name: "kafka", Topics: []string{"orders.*"}, Sink: kafka},
		{Name: "crm", Topics: []string{"orders.placed"}, Sink: webhook, FanOut: true},
	}})
}

// runRoutes runs the routes until SIGTERM, then drains them.
func runRoutes(sc relay.SetConfig) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	// Every relay the Set runs (routes, router, unrouted), each worker
	// with its pipeline full, plus one connection for health checks.
	cfgs, err := sc.Plan()
	if err != nil {
		log.Fatal(err)
	}
	pool, err := relay.NewPool(ctx, relay.PoolConfig{URL: "postgres://app@db/app",
		MaxConns: relay.Conns(cfgs...) + relay.PipelineConns(cfgs...) + 1})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	set, err := relay.NewSet(pool, sc)
	if err != nil {
		log.Fatal(err)
	}
	if err := set.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// openSinks stands for the application's own sink set-up (kafkasink.New,
// httpsink.New, ...).
func openSinks() (kafka, webhook sinks.Sink) { return memory.New(), memory.New() }
