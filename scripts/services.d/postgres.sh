#!/usr/bin/env bash
# PostgreSQL for hutch's production profile and tests: a private cluster (Debian's `postgresql`
# binaries, not the system's main cluster) on loopback, with a `hutch` role and database.
#   postgres.sh start     # idempotent: install the package if missing, initdb once, start, wait
#                         # until it accepts connections; prints HUTCH_STORE=postgresql://… on stdout
#   postgres.sh stop      # fast shutdown (HUTCH_PG_STOP_MODE=immediate: as after a crash)
#   postgres.sh restart | status | pid
# Settings (environment): HUTCH_PG_PORT (15432), HUTCH_SERVICES_DIR (state).
# The role may create databases (tests make one per run). Logs: $HUTCH_SERVICES_DIR/postgres-PORT/postgres.log.
set -euo pipefail

PORT=${HUTCH_PG_PORT:-15432}
if [[ $EUID -eq 0 ]]; then
  STATE=${HUTCH_SERVICES_DIR:-/var/lib/hutch/services}
else
  STATE=${HUTCH_SERVICES_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/hutch/services}
fi
DIR="$STATE/postgres-$PORT"
DATA="$DIR/data"

say() { echo "postgres: $*" >&2; }

# PostgreSQL refuses to run as root: as root, the cluster belongs to the `postgres` user.
as_owner() {
  if [[ $EUID -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

install() {
  if ! ls -d /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    say "installing Debian's postgresql package"
    local sudo=; [[ $EUID -ne 0 ]] && sudo=sudo
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql >&2
  fi
  PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
}

running_pid() {
  [[ -f "$DATA/postmaster.pid" ]] || return 1
  local pid; pid=$(head -n 1 "$DATA/postmaster.pid")
  # A pidfile left by a power loss may name a pid some other program now holds.
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q postgres || return 1
  echo "$pid"
}

answers() { "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 2; }

psql_admin() { as_owner "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$DIR/run" -p "$PORT" -U postgres -d postgres "$@"; }

print_settings() { echo "HUTCH_STORE=postgresql://hutch:$(cat "$DIR/password")@127.0.0.1:$PORT/hutch"; }

init() {
  mkdir -p "$DIR/run"
  chmod 755 "$STATE" "$DIR"
  [[ -f "$DIR/password" ]] || (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(16))' >"$DIR/password")
  if [[ $EUID -eq 0 ]]; then chown postgres:postgres "$DIR/run"; fi
  if [[ ! -f "$DATA/PG_VERSION" ]]; then
    say "initialising a private cluster in $DATA"
    mkdir -p "$DATA"
    if [[ $EUID -eq 0 ]]; then chown postgres:postgres "$DATA"; fi
    as_owner "$PGBIN/initdb" -D "$DATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
      -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 || { cat "$DIR/initdb.log" >&2; exit 1; }
    as_owner tee -a "$DATA/postgresql.conf" >/dev/null <<CONF
# hutch (scripts/services.d/postgres.sh)
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DIR/run'
max_connections = 200
shared_buffers = 256MB
log_min_messages = warning
log_line_prefix = '%m [%p] '
CONF
  fi
}

ensure_role() {
  local pw; pw=$(cat "$DIR/password")
  psql_admin <<SQL
SELECT 'CREATE ROLE hutch LOGIN CREATEDB' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'hutch')\gexec
ALTER ROLE hutch WITH LOGIN CREATEDB PASSWORD '$pw';
SELECT 'CREATE DATABASE hutch OWNER hutch' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'hutch')\gexec
SQL
}

start() {
  install
  if pid=$(running_pid) && answers; then
    say "already running (pid $pid) on 127.0.0.1:$PORT"
    print_settings; return 0
  fi
  if ! running_pid >/dev/null && answers; then
    say "port $PORT answers but is not the cluster this script started ($DATA); set HUTCH_PG_PORT"
    exit 1
  fi
  init
  if ! running_pid >/dev/null; then
    say "starting on 127.0.0.1:$PORT (log $DIR/postgres.log)"
    touch "$DIR/postgres.log"; [[ $EUID -eq 0 ]] && chown postgres:postgres "$DIR/postgres.log"
    as_owner "$PGBIN/pg_ctl" -D "$DATA" -l "$DIR/postgres.log" -s -w -t 60 start >&2 \
      || { tail -n 30 "$DIR/postgres.log" >&2; exit 1; }
  fi
  local deadline=$((SECONDS + 60))
  until answers; do
    ((SECONDS < deadline)) || { say "not accepting connections; see $DIR/postgres.log"; exit 1; }
    sleep 0.2
  done
  ensure_role
  say "ready on 127.0.0.1:$PORT (pid $(running_pid))"
  print_settings
}

stop() {
  install
  if ! running_pid >/dev/null; then say "not running"; return 0; fi
  say "stopping"
  as_owner "$PGBIN/pg_ctl" -D "$DATA" -s -m "${HUTCH_PG_STOP_MODE:-fast}" -w -t 60 stop >&2
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  status) install; if pid=$(running_pid) && answers; then say "running (pid $pid) on 127.0.0.1:$PORT"; print_settings; else say "not running"; exit 3; fi ;;
  pid) running_pid ;;
  *) echo "usage: $0 start|stop|restart|status|pid" >&2; exit 2 ;;
esac
