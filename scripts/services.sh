#!/usr/bin/env bash
# Make sure the local services the tests and the demo need are running:
# start them when installed but stopped, install them (Debian packages)
# when missing, and fail loudly when that is impossible. Every change it
# makes to the machine is printed, as the command it runs, before it runs.
# This list is complete (README.md and CONTRIBUTING.md repeat it for
# readers: CONTRIBUTING.md whole, README.md the package names; keep the
# three in step):
#
#   - apt-get update, once, before the first install;
#   - apt-get install --no-install-recommends (every install: no
#     recommended packages, so no container engine, no desktop) of, each
#     only when its command is missing:
#       postgresql postgresql-contrib  (the shared server; initdb and pg_ctl
#                                       for the tests' throwaway servers)
#       rabbitmq-server                (the shared broker; rabbitmq-server and
#                                       rabbitmqctl for throwaway nodes)
#       nats-server                    (JetStream; throwaway servers too)
#       redis-server                   (the shared server; throwaway servers)
#       docker-compose                 (Debian's Compose v1, Python: validates
#                                       docker-compose.yml with `config -q`;
#                                       no engine is installed or needed)
#       prometheus                     (for promtool, which tests the alert
#                                       rules and the dashboard's queries)
#       pgbouncer                      (the tests' throwaway PgBouncers in
#                                       front of the test database)
#       mosquitto                      (the MQTT sink's tests' throwaway
#                                       brokers)
#       chromium chromium-driver       (the console's browser tests)
#   - apt-get install nodejs npm when node or npm is missing, then
#     npm install --prefix ${XDG_CACHE_HOME:-~/.cache}/outbox-relay/kinesalite
#     kinesalite@KINESALITE_VERSION when that directory does not hold it
#     (kinesalite, the Kinesis server the Kinesis sink's tests start on
#     their own ports; its LevelDB store, leveldown, loads the prebuilt
#     binary its npm package ships, so nothing is compiled);
#   - go build of internal/testkit/throwaway/goawsd (goaws, the SQS and SNS
#     server the SQS and SNS sinks' tests start on their own ports), which
#     downloads its modules into the module cache and compiles it into the
#     build cache, so the tests' own build of it is quick;
#   - go install helm.sh/helm/v3/cmd/helm@HELM_VERSION into /usr/local/bin
#     when helm is missing, or when the helm found is a build of this
#     script's from before it set the default Kubernetes version (Debian has
#     no helm package; the chart's tests need it; building it takes a few
#     minutes once). The build sets Helm's default Kubernetes version to the
#     one of its client libraries, as Helm's own release builds do, so
#     `helm template` works without --kube-version;
#   - while installing prometheus, pgbouncer or mosquitto, a temporary
#     /usr/sbin/policy-rc.d that keeps the package's server from starting
#     (Prometheus would take port 9090, the relay's admin port), and
#     `systemctl disable --now` of it where systemd runs;
#   - two `trust` lines for 127.0.0.1 and ::1 at the top of the newest
#     cluster's pg_hba.conf, then a reload, when loopback is not trusted yet
#     (test machines only);
#   - starting PostgreSQL (pg_ctlcluster ... start), RabbitMQ
#     (rabbitmq-server -detached), NATS with JetStream on 127.0.0.1:4222
#     (nats-server -js, data in /var/lib/nats-server) or Redis on
#     127.0.0.1:6379 (redis-server --daemonize yes, no persistence) when
#     they are not listening;
#   - CREATE DATABASE test when it does not exist.
#
# A service that is already running is only checked: never restarted,
# stopped or reconfigured.
#
#   scripts/services.sh postgres rabbitmq nats redis docker-compose promtool pgbouncer helm chromium goaws kinesalite mosquitto
set -euo pipefail

log() { echo "services: $*" >&2; }
die() { echo "services: ERROR: $*" >&2; exit 1; }

SUDO=()
if [ "$(id -u)" != 0 ]; then SUDO=(sudo); fi

# run prints a command that changes the machine, then runs it.
run() {
	log "running: $*"
	"$@"
}

apt_updated=""
apt_install() {
	command -v apt-get >/dev/null || die "apt-get not found: install $* by hand"
	if [ -z "$apt_updated" ]; then
		run "${SUDO[@]}" apt-get update -qq >&2 || die "apt-get update failed"
		apt_updated=1
	fi
	# Recommended packages are never installed: Debian's docker-compose
	# recommends docker.io (with containerd, runc, iptables, apparmor), and
	# nothing here needs them.
	run "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 || die "apt-get install $* failed"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # name port seconds
	local i
	for ((i = 0; i < $3 * 10; i++)); do
		port_open "$2" && return 0
		sleep 0.1
	done
	die "$1 did not start listening on 127.0.0.1:$2 within $3s"
}

# has_initdb: the throwaway servers of internal/testkit/pgtest need initdb and pg_ctl.
has_initdb() {
	command -v initdb >/dev/null && return 0
	compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

ensure_postgres() {
	if ! command -v pg_ctlcluster >/dev/null || ! has_initdb; then
		log "PostgreSQL (server, pg_ctlcluster, initdb) not installed"
		apt_install postgresql postgresql-contrib
	fi
	local version
	version=$(ls /etc/postgresql | sort -V | tail -1)
	[ -n "$version" ] || die "no PostgreSQL cluster found under /etc/postgresql"
	local hba="/etc/postgresql/$version/main/pg_hba.conf"
	# The test suite connects as postgres over loopback without a password.
	if ! grep -qE '^host\s+all\s+all\s+127\.0\.0\.1/32\s+trust' "$hba"; then
		log "loopback is not trusted in $hba; adding at its top (test machines only):"
		log "  host all all 127.0.0.1/32 trust"
		log "  host all all ::1/128 trust"
		run "${SUDO[@]}" sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
		if pg_isready -q -h 127.0.0.1 -p 5432; then
			run "${SUDO[@]}" pg_ctlcluster --skip-systemctl-redirect "$version" main reload || die "could not reload PostgreSQL"
		fi
	fi
	if ! pg_isready -q -h 127.0.0.1 -p 5432; then
		log "PostgreSQL $version is not running"
		run "${SUDO[@]}" pg_ctlcluster --skip-systemctl-redirect "$version" main start || die "could not start PostgreSQL"
	fi
	wait_for PostgreSQL 5432 30
	for i in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
	pg_isready -q -h 127.0.0.1 -p 5432 || die "PostgreSQL is not accepting connections"
	if ! psql -h 127.0.0.1 -U postgres -d test -Atc 'select 1' >/dev/null 2>&1; then
		log "database test does not exist"
		run psql -h 127.0.0.1 -U postgres -d postgres -c 'CREATE DATABASE test' >/dev/null || die "could not create database test"
	fi
}

# has_rabbitmq: the throwaway nodes of internal/testkit/amqptest need rabbitmq-server
# and rabbitmqctl (Debian keeps the real scripts in /usr/lib/rabbitmq/bin).
has_rabbitmq() {
	[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && [ -x /usr/lib/rabbitmq/bin/rabbitmqctl ] && return 0
	command -v rabbitmq-server >/dev/null && command -v rabbitmqctl >/dev/null
}

ensure_rabbitmq() {
	if ! has_rabbitmq; then
		log "RabbitMQ (rabbitmq-server, rabbitmqctl) not installed"
		apt_install rabbitmq-server
	fi
	if ! port_open 5672; then
		log "RabbitMQ is not listening on 127.0.0.1:5672"
		run "${SUDO[@]}" rabbitmq-server -detached >&2 || die "could not start RabbitMQ"
		wait_for RabbitMQ 5672 120
	fi
	"${SUDO[@]}" timeout 120 rabbitmqctl -q await_startup >/dev/null 2>&1 || die "RabbitMQ did not finish starting"
}

# sbin_tool finds a server binary that Debian installs outside a normal
# user's PATH.
sbin_tool() {
	command -v "$1" 2>/dev/null && return 0
	local p
	for p in /usr/sbin/"$1" /usr/bin/"$1"; do
		[ -x "$p" ] && echo "$p" && return 0
	done
	return 1
}

ensure_nats() {
	if ! sbin_tool nats-server >/dev/null; then
		log "NATS (nats-server) not installed"
		apt_install nats-server
	fi
	if ! port_open 4222; then
		log "NATS is not listening on 127.0.0.1:4222"
		local bin
		bin=$(sbin_tool nats-server)
		run "${SUDO[@]}" mkdir -p /var/lib/nats-server
		run "${SUDO[@]}" start-stop-daemon --start --oknodo --background --exec "$bin" -- \
			-a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log || die "could not start NATS"
		wait_for NATS 4222 30
	fi
}

ensure_redis() {
	if ! sbin_tool redis-server >/dev/null; then
		log "Redis (redis-server) not installed"
		apt_install redis-server
	fi
	if ! port_open 6379; then
		log "Redis is not listening on 127.0.0.1:6379"
		run "${SUDO[@]}" mkdir -p /var/lib/redis /var/log/redis
		run "${SUDO[@]}" "$(sbin_tool redis-server)" --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
			--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log || die "could not start Redis"
		wait_for Redis 6379 30
	fi
}

ensure_tool() { # command package
	command -v "$1" >/dev/null && return 0
	log "$1 not installed"
	apt_install "$2"
}

# ensure_promtool installs promtool, which comes in Debian's prometheus
# package with a Prometheus server that must not start here.
ensure_promtool() {
	command -v promtool >/dev/null && return 0
	log "promtool not installed"
	install_without_service prometheus
}

# ensure_pgbouncer installs pgbouncer, which the tests run as throwaway
# instances of their own in front of the test database (internal/testkit/throwaway):
# the package's own server must not start.
ensure_pgbouncer() {
	command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] && return 0
	log "pgbouncer not installed"
	install_without_service pgbouncer
}

# ensure_mosquitto installs mosquitto, which the MQTT sink's tests run as
# throwaway brokers of their own (internal/testkit/throwaway): the
# package's own broker must not start (it would take port 1883).
ensure_mosquitto() {
	command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] && return 0
	log "mosquitto not installed"
	install_without_service mosquitto
}

# install_without_service installs a package whose service must not run
# here: a temporary /usr/sbin/policy-rc.d keeps it from starting during
# the install, and where systemd runs it is disabled afterwards.
install_without_service() { # package (its service has the same name)
	local policy=""
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		log "running: write /usr/sbin/policy-rc.d (exit 101: no service starts during the install)"
		printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
		"${SUDO[@]}" chmod 755 /usr/sbin/policy-rc.d
		policy=1
	fi
	apt_install "$1"
	if [ -n "$policy" ]; then
		run "${SUDO[@]}" rm -f /usr/sbin/policy-rc.d
	fi
	if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
		run "${SUDO[@]}" systemctl disable --now "$1" >&2 || true
	fi
}

# has_chromium: Debian's package installs /usr/bin/chromium; other
# distributions name it chromium-browser.
has_chromium() {
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null
}

# ensure_chromium installs the headless browser the console's browser tests
# drive (internal/app/console), with chromium-driver for tools that want it.
ensure_chromium() {
	has_chromium && return 0
	log "chromium not installed"
	apt_install chromium chromium-driver
}

HELM_VERSION=v3.19.0
# HELM_KUBE_MINOR is the Kubernetes minor version of HELM_VERSION's client
# libraries (k8s.io/client-go v0.34 in its go.mod): Helm's release builds
# set it as the default of `helm template` through -ldflags, and a plain
# `go install` leaves Helm's fallback, Kubernetes 1.20, which the chart's
# kubeVersion (>=1.25) refuses. Change both together.
HELM_KUBE_MINOR=34

# helm_default_kube_ok reports whether helm renders the chart with its
# default Kubernetes version (a helm built without the -ldflags does not).
helm_default_kube_ok() {
	local chart
	chart="$(dirname "$0")/../deploy/helm/outbox-relay"
	[ -d "$chart" ] || return 0
	! helm template r1 "$chart" 2>&1 | grep -q 'incompatible with Kubernetes'
}

# ensure_helm builds Helm from its Go module (Debian does not package it).
ensure_helm() {
	if command -v helm >/dev/null; then
		helm_default_kube_ok && return 0
		log "helm ($(command -v helm)) defaults to Kubernetes 1.20 (built without Helm's -ldflags); building $HELM_VERSION again"
	else
		log "helm not installed"
	fi
	command -v go >/dev/null || die "go not found: cannot build helm"
	local k ldflags=""
	for k in pkg/chartutil pkg/lint/rules; do
		ldflags+=" -X helm.sh/helm/v3/$k.k8sVersionMajor=1 -X helm.sh/helm/v3/$k.k8sVersionMinor=$HELM_KUBE_MINOR"
	done
	run "${SUDO[@]}" env GOBIN=/usr/local/bin GOFLAGS=-mod=mod "$(command -v go)" install -ldflags "${ldflags# }" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" ||
		die "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION failed"
}

# ensure_goaws downloads and compiles goawsd (a module of its own, so that
# goaws stays out of the relay's go.mod); the tests build it again from
# the caches into the temporary directory.
ensure_goaws() {
	command -v go >/dev/null || die "go not found: cannot build goawsd"
	local dir
	dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/internal/testkit/throwaway/goawsd"
	(cd "$dir" && run "$(command -v go)" build -o /dev/null .) || die "go build of $dir failed"
}

# KINESALITE_VERSION must match throwaway.KinesaliteVersion
# (internal/testkit/throwaway/kinesalite.go).
KINESALITE_VERSION=3.3.3

# ensure_kinesalite installs kinesalite from npm into the user's cache
# directory, where internal/testkit/throwaway looks for it.
ensure_kinesalite() {
	local dir="${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/kinesalite"
	if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
		log "node or npm not installed"
		apt_install nodejs npm
	fi
	if [ -f "$dir/node_modules/kinesalite/package.json" ] &&
		grep -q "\"version\": \"$KINESALITE_VERSION\"" "$dir/node_modules/kinesalite/package.json" &&
		(cd "$dir" && node -e 'require("leveldown")') >/dev/null 2>&1; then
		return 0
	fi
	log "kinesalite $KINESALITE_VERSION not installed in $dir"
	run mkdir -p "$dir"
	run npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "kinesalite@$KINESALITE_VERSION" >&2 ||
		die "npm install kinesalite@$KINESALITE_VERSION failed"
	(cd "$dir" && node -e 'require("leveldown")') || die "kinesalite's leveldown does not load in $dir"
}

for s in "$@"; do
	case "$s" in
	postgres) ensure_postgres ;;
	rabbitmq) ensure_rabbitmq ;;
	nats) ensure_nats ;;
	redis) ensure_redis ;;
	docker-compose) ensure_tool docker-compose docker-compose ;;
	promtool) ensure_promtool ;;
	pgbouncer) ensure_pgbouncer ;;
	mosquitto) ensure_mosquitto ;;
	helm) ensure_helm ;;
	goaws) ensure_goaws ;;
	kinesalite) ensure_kinesalite ;;
	chromium) ensure_chromium ;;
	*) die "unknown service $s" ;;
	esac
done
log "ready: $*"
