#!/usr/bin/env bash
# Prints, as the last line on stdout, a DSN for gemrecon's PostgreSQL tests:
#
#   export GEMRECON_TEST_POSTGRES=$(bash .ci/postgres.sh | tail -n1)
#   go test -race ./sink/postgres/
#
# Uses a server already listening on 127.0.0.1:$PGPORT (default 5432) when it
# answers; otherwise installs Debian's postgresql package and starts a
# throwaway cluster (trust auth, loopback only) in $GEMRECON_PG_DIR (default
# /tmp/gemrecon-pg). Diagnostics go to stderr. Exits non-zero if impossible.
set -euo pipefail

HOST=127.0.0.1
PORT=${PGPORT:-5432}
DB=gemrecon_test
DATA=${GEMRECON_PG_DIR:-/tmp/gemrecon-pg}
WAIT=${GEMRECON_PG_WAIT:-30} # seconds to wait for a started server

log() { echo "postgres.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# as_root runs a command as root (directly, or through sudo).
as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
		die "need root to run: $* (no sudo)"; fi
}

# as_postgres runs a command as the postgres OS user (initdb refuses root).
as_postgres() {
	if [ "$(id -un)" = postgres ]; then "$@"; elif command -v runuser >/dev/null && [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"; else as_root su postgres -s /bin/sh -c "$(printf '%q ' "$@")"; fi
}

# ready reports whether a server accepts connections on HOST:PORT.
ready() {
	if command -v pg_isready >/dev/null; then
		pg_isready -q -h "$HOST" -p "$PORT" && return 0
		return 1
	fi
	command -v psql >/dev/null && psql -h "$HOST" -p "$PORT" -U postgres -d postgres -Atqc 'SELECT 1' >/dev/null 2>&1
}

# pick_user prints the first role that can log in without a password.
pick_user() {
	local u
	for u in postgres root "$(id -un)"; do
		if psql -h "$HOST" -p "$PORT" -U "$u" -d postgres -w -Atqc 'SELECT 1' >/dev/null 2>&1 ||
			psql -h "$HOST" -p "$PORT" -U "$u" -d test -w -Atqc 'SELECT 1' >/dev/null 2>&1; then
			echo "$u"
			return 0
		fi
	done
	return 1
}

# emit creates the test database if it can and prints the DSN.
emit() {
	local user db
	user=$(pick_user) || die "a server answers on $HOST:$PORT but no role among postgres, root, $(id -un) logs in without a password"
	db=$DB
	if ! psql -h "$HOST" -p "$PORT" -U "$user" -d postgres -w -Atqc "SELECT 1 FROM pg_database WHERE datname = '$DB'" 2>/dev/null | grep -q 1; then
		if ! psql -h "$HOST" -p "$PORT" -U "$user" -d postgres -w -qc "CREATE DATABASE $DB" >/dev/null 2>&1; then
			log "could not create database $DB; using database test"
			db=test
		fi
	fi
	echo "postgres://$user@$HOST:$PORT/$db?sslmode=disable"
}

if ready; then
	log "using the server already listening on $HOST:$PORT"
	emit
	exit 0
fi

# No server: install PostgreSQL if needed, then start a private cluster.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
	command -v apt-get >/dev/null || die "no server on $HOST:$PORT and no apt-get to install one; start PostgreSQL and set GEMRECON_TEST_POSTGRES"
	log "installing Debian's postgresql package"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)
[ -x "$BIN/initdb" ] || die "initdb not found under /usr/lib/postgresql"
VER=$(basename "$(dirname "$BIN")")

# The package may have started Debian's own cluster on our port; its TCP
# logins want passwords, so use it only if a role gets in without one, and
# otherwise stop it to make room for the trust-auth cluster below.
if ready; then
	if pick_user >/dev/null; then
		log "using the cluster the postgresql package started"
		emit
		exit 0
	fi
	log "stopping Debian's cluster $VER/main (password auth) to start a trust-auth one"
	as_root pg_ctlcluster --skip-systemctl-redirect "$VER" main stop >&2 || true
fi

if [ ! -f "$DATA/PG_VERSION" ]; then
	log "initialising a cluster in $DATA (trust auth, $HOST only)"
	as_root mkdir -p "$DATA"
	as_root chown postgres: "$DATA"
	as_postgres "$BIN/initdb" -D "$DATA" -A trust -U postgres >&2
fi
log "starting PostgreSQL from $DATA on $HOST:$PORT"
as_postgres "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t "$WAIT" \
	-o "-c listen_addresses=$HOST -p $PORT -k $DATA" start >&2 ||
	die "server did not start; see $DATA/server.log"

for _ in $(seq "$WAIT"); do
	if ready; then
		emit
		exit 0
	fi
	sleep 1
done
die "server started but $HOST:$PORT did not answer within ${WAIT}s; see $DATA/server.log"
