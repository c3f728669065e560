package relay_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outbox-relay/outbox-relay/migrations"
	"github.com/outbox-relay/outbox-relay/relay"
	"github.com/outbox-relay/outbox-relay/relay/relayprom"
	"github.com/outbox-relay/outbox-relay/sinks/kafkasink"
)

// Embedding the relay the way the daemon runs it: the schema migrated at
// start-up, Prometheus metrics (the daemon's own series, from relayprom),
// and liveness and readiness endpoints for the orchestrator.
func Example_operated() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cfg := relay.Config{Schema: "outbox", Workers: 4}
	pool, err := relay.NewPool(ctx, relay.PoolConfig{URL: "postgres://app@db/app", Workers: cfg.Workers})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// Idempotent and advisory-locked: every replica may call it. It needs
	// the schema owner's rights; a least-privilege relay role leaves this
	// to a deploy step (`outbox-relay migrate`).
	if _, err := migrations.Apply(ctx, pool, cfg.Schema); err != nil {
		log.Fatal(err)
	}

	kc, err := kafkasink.ParseURL("kafka://kafka-1:9092")
	if err != nil {
		log.Fatal(err)
	}
	sink, err := kafkasink.New(kc, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close(context.Background())

	reg := prometheus.NewRegistry()
	metrics := relayprom.New(reg, "v1.2.3")
	reg.MustRegister(relayprom.NewPoolCollector(pool))
	cfg.Hooks = metrics.Hooks("", "kafka")
	go metrics.WatchOutbox(ctx, pool, cfg.Schema, 15*time.Second, nil)

	r, err := relay.New(pool, sink, cfg)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		// Live fails when a worker is stuck: restart the process.
		if err := r.Live(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, req *http.Request) {
		// Ready fails while the relay drains, its lane lease is stale, or
		// the database, the schema or the sink is unusable: take it out of
		// rotation and alert; a restart would not help.
		if err := r.Ready(req.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
	srv := &http.Server{Addr: ":9090", Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Fatal(err)
		}
	}()
	defer srv.Shutdown(context.Background())

	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
