# outbox-relay — `make help` lists the targets.
SHELL := /usr/bin/env bash
export PATH := /usr/local/go/bin:$(PATH)

DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
export DATABASE_URL
export TEST_DATABASE_URL ?= $(DATABASE_URL)
export TEST_AMQP_URL ?= amqp://guest:guest@127.0.0.1:5672/
export TEST_NATS_URL ?= nats://127.0.0.1:4222
export TEST_REDIS_URL ?= redis://127.0.0.1:6379/0

GO_TEST := go test -race -count=1 -timeout 30m
BIN := bin

# The release this tree is: CHANGELOG.md's newest version, the Helm chart's
# appVersion and the container image's tag (internal/suites/deploytest
# checks that they agree).
RELEASE := 0.1.0
# What `outbox-relay version` prints. VERSION: `git describe` (v0.1.0 on
# the release's tag, v0.1.0-3-gabc1234 three commits past it), or RELEASE
# where git finds no tag. COMMIT: the commit built, -dirty when the tree
# has changes (as Go's own build information says it).
VERSION ?= $(or $(shell git describe --tags --match 'v[0-9]*' 2>/dev/null),$(RELEASE))
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)$(if $(shell git --no-optional-locks status --porcelain 2>/dev/null | head -1),-dirty)
LDFLAGS := -X github.com/outbox-relay/outbox-relay/internal/app/cli.Version=$(VERSION) -X github.com/outbox-relay/outbox-relay/internal/app/cli.Commit=$(COMMIT)
IMAGE_TAG ?= $(patsubst v%,%,$(VERSION))

.PHONY: help build image demo test vet docs chaos faults bench fuzz services clean

help: ## list targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

# Static binaries, built as the Dockerfile builds them (and the test
# suites' relays: internal/testkit/relaybin).
build: ## build bin/outbox-relay and bin/outbox-demo, stamped with VERSION and COMMIT (outbox-relay version prints them)
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

image: ## build the container image outbox-relay:IMAGE_TAG (VERSION without its v: 0.1.0 on the release's tag) with docker
	docker build -t outbox-relay:$(IMAGE_TAG) --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) .

services: ## start (or install) Postgres, RabbitMQ, NATS and Redis, and the tools the tests need (docker-compose, promtool, pgbouncer, helm, chromium, goaws, kinesalite, mosquitto), without recommended packages; prints every change it makes
	scripts/services.sh postgres rabbitmq nats redis docker-compose promtool pgbouncer helm chromium goaws kinesalite mosquitto

demo: build ## end to end: migrate, write orders in transactions, relay them to stdout
	scripts/services.sh postgres
	scripts/demo.sh

docs: ## regenerate docs/cli.md (the command-line and configuration reference) from the commands
	go run ./internal/app/cli/gendoc

vet: ## go vet, the module and bench/
	go vet ./...
	cd bench && go vet .

# Tests that restart, stop or reconfigure a server do it to a throwaway
# instance of their own (internal/testkit/pgtest.Server, internal/testkit/amqptest.Server,
# internal/testkit/throwaway for nats-server and redis-server),
# so they run with the rest and the shared services are never disturbed.
test: services vet ## the whole test suite, with -race (what CI runs)
	$(GO_TEST) ./...

chaos: services build ## long chaos run (kills relays, restarts a throwaway Postgres)
	CHAOS_LONG=1 $(GO_TEST) -timeout 150m -run 'Chaos' -v ./internal/suites/chaos/

faults: services build ## long fault-injection runs (60 s outages, or FAULTS_OUTAGE=10m; 5M backlog)
	FAULTS_LONG=1 $(GO_TEST) -timeout 60m -v ./internal/suites/faults/

bench: services build ## benchmark suite (BENCH_QUICK=1 for a short run)
	cd bench && go run .

fuzz: ## run every fuzz target for FUZZTIME (default 20s)
	@for pkg in $$(go list ./...); do \
	  for f in $$(go test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$f"; go test -run '^$$' -fuzz "^$$f$$" -fuzztime $${FUZZTIME:-20s} $$pkg || exit 1; \
	  done; done

clean: ## remove build output
	rm -rf $(BIN)
