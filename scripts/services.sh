#!/usr/bin/env bash
# Make sure the local services the tests and the demo need are running:
# start them when installed but stopped, install them (Debian packages)
# when missing, and fail loudly when that is impossible.
#
#   scripts/services.sh postgres rabbitmq
set -euo pipefail

log() { echo "services: $*" >&2; }
die() { echo "services: ERROR: $*" >&2; exit 1; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

apt_updated=""
apt_install() {
	command -v apt-get >/dev/null || die "apt-get not found: install $* by hand"
	if [ -z "$apt_updated" ]; then
		$SUDO apt-get update -qq >&2 || die "apt-get update failed"
		apt_updated=1
	fi
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >&2 || die "apt-get install $* failed"
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

ensure_postgres() {
	if ! command -v pg_ctlcluster >/dev/null; then
		log "PostgreSQL not installed; installing the Debian package"
		apt_install postgresql postgresql-contrib
	fi
	local version
	version=$(ls /etc/postgresql | sort -V | tail -1)
	[ -n "$version" ] || die "no PostgreSQL cluster found under /etc/postgresql"
	local hba="/etc/postgresql/$version/main/pg_hba.conf"
	# The test suite connects as postgres over loopback without a password.
	if ! grep -qE '^host\s+all\s+all\s+127\.0\.0\.1/32\s+trust' "$hba"; then
		log "allowing trust auth on loopback in $hba (test machine)"
		$SUDO sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
		$SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main reload 2>/dev/null || true
	fi
	if ! pg_isready -q -h 127.0.0.1 -p 5432; then
		log "starting PostgreSQL $version"
		$SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main start || die "could not start PostgreSQL"
	fi
	wait_for PostgreSQL 5432 30
	for i in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
	pg_isready -q -h 127.0.0.1 -p 5432 || die "PostgreSQL is not accepting connections"
	if ! psql -h 127.0.0.1 -U postgres -d test -Atc 'select 1' >/dev/null 2>&1; then
		log "creating database test"
		psql -h 127.0.0.1 -U postgres -d postgres -c 'CREATE DATABASE test' >/dev/null || die "could not create database test"
	fi
}

ensure_rabbitmq() {
	if ! command -v rabbitmq-server >/dev/null; then
		log "RabbitMQ not installed; installing the Debian package"
		apt_install rabbitmq-server
	fi
	if ! port_open 5672; then
		log "starting RabbitMQ"
		$SUDO rabbitmq-server -detached >&2 || die "could not start RabbitMQ"
		wait_for RabbitMQ 5672 120
	fi
	$SUDO timeout 120 rabbitmqctl -q await_startup >/dev/null 2>&1 || die "RabbitMQ did not finish starting"
}

ensure_tool() { # command package
	command -v "$1" >/dev/null || { log "$1 missing; installing $2"; apt_install "$2"; }
}

for s in "$@"; do
	case "$s" in
	postgres) ensure_postgres ;;
	rabbitmq) ensure_rabbitmq ;;
	docker-compose) ensure_tool docker-compose docker-compose ;;
	*) die "unknown service $s" ;;
	esac
done
log "ready: $*"
