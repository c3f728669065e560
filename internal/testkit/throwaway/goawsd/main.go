// Command goawsd runs goaws (an SQS and SNS server for tests) on a
// loopback port, for internal/testkit/throwaway.GoAWS. It is a module of its own
// so that goaws and what it depends on stay out of the relay's go.mod.
//
// goaws keeps queues and messages in memory, so a restarted process would
// have lost what it accepted: a fault test instead makes the server stop
// listening and come back, in this one process. SIGUSR1 closes the
// listener and every connection (clients are refused, as by a stopped
// server); SIGUSR2 listens again on the same port, with the same queues.
// Each state change is announced on stdout ("listening", "stopped").
// It also answers the batch calls goaws lacks or gets wrong (batch.go),
// and a whole queue's read-back for tests (take.go).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/Admiral-Piett/goaws/app"
	"github.com/Admiral-Piett/goaws/app/router"
	"github.com/sirupsen/logrus"
)

func main() {
	port := flag.Int("port", 4100, "loopback port to listen on")
	account := flag.String("account", "100010001000", "account id in queue URLs and ARNs")
	flag.Parse()

	logrus.SetOutput(io.Discard)
	// The fields LoadYamlConfig would set from a file; Region stays out of
	// the environment so that queue URLs are http://127.0.0.1:port/...,
	// not http://region.127.0.0.1:port/...
	app.CurrentEnvironment = app.Environment{
		Host:             "127.0.0.1",
		Port:             strconv.Itoa(*port),
		AccountID:        *account,
		EnableDuplicates: true, // FIFO deduplication by MessageDeduplicationId
		QueueAttributeDefaults: app.EnvQueueAttributes{
			VisibilityTimeout:  VisibilitySeconds,
			MaximumMessageSize: 262144,
		},
	}
	go sweep(time.Second, make(chan struct{}))

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(*port))
	handler := withBatches(router.New())
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	var srv *http.Server
	start := func() {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			log.Fatalf("goawsd: listen %s: %v", addr, err)
		}
		srv = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		go func(s *http.Server) {
			if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Fatalf("goawsd: %v", err)
			}
		}(srv)
		fmt.Println("listening")
	}
	start()
	for s := range sig {
		switch {
		case s == syscall.SIGUSR1 && srv != nil:
			_ = srv.Close()
			srv = nil
			fmt.Println("stopped")
		case s == syscall.SIGUSR2 && srv == nil:
			start()
		}
	}
}
