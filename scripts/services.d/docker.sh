#!/usr/bin/env bash
# A private Docker engine (Debian's docker.io) for the Workspace's `docker` backend and its tests.
#   docker.sh start     # idempotent: install docker.io if missing, start dockerd, wait until it
#                       # answers /_ping; prints DOCKER_HOST=unix://… on stdout
#   docker.sh stop      # SIGTERM (dockerd stops its containers), SIGKILL after 30 s
#   docker.sh restart | status | pid
# Settings (environment): HUTCH_DOCKER_SOCK (/run/hutch-docker/docker.sock), HUTCH_DOCKER_ROOT
# (its data root: $STATE/docker/data), HUTCH_SERVICES_DIR (state). Log: $STATE/docker/dockerd.log.
#
# This engine is hutch's, not the host's: its own socket, pid file, data and exec roots, so it
# neither needs nor disturbs a system docker. It changes no firewall rule: dockerd's default sets
# the iptables FORWARD policy to DROP when it starts, which cuts the local driver's sandbox
# networking on the same host (tests/isolation/test_local_network.py). So: --iptables=false,
# --ip6tables=false and no bridge at all (--bridge=none): its containers get network "none" (the
# Workspace asks for nothing else; its git clones run on the host into the bind mount), and
# this engine could not route a bridged container anyway. The data root stays on disk (unlike
# containerd's for nomad.sh): importing the 551 MB workspace:latest tree takes ~7 s once, a
# container starts in ~0.5 s from it, and images on a tmpfs would be re-imported after each boot.
set -euo pipefail

if [[ $EUID -eq 0 ]]; then
  STATE=${HUTCH_SERVICES_DIR:-/var/lib/hutch/services}/docker
else
  STATE=${HUTCH_SERVICES_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/hutch/services}/docker
fi
SOCK=${HUTCH_DOCKER_SOCK:-/run/hutch-docker/docker.sock}
RUN=$(dirname "$SOCK")
DATA=${HUTCH_DOCKER_ROOT:-$STATE/data}
PIDFILE="$STATE/dockerd.pid"
LOG="$STATE/dockerd.log"

say() { echo "docker: $*" >&2; }
die() { say "$*"; exit 1; }

[[ $EUID -eq 0 ]] || die "needs root (dockerd); run as root, or point DOCKER_HOST at an engine you have"

print_settings() { echo "DOCKER_HOST=unix://$SOCK"; }

# Only a live dockerd started with this pid file counts: after a power loss the pid in it
# may be free, a zombie, or some other program's.
running_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid; pid=$(cat "$PIDFILE")
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  local state; state=$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || return 1
  [[ -n "$state" && "$state" != Z && "$state" != X ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "dockerd" || return 1
  echo "$pid"
}

# GET /_ping over the socket with the standard library (no docker CLI or SDK needed here).
answers() {
  python3 - "$SOCK" <<'PY'
import http.client, socket, sys
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(2)
        self.sock.connect(sys.argv[1])
try:
    conn = Unix("localhost", timeout=2)
    conn.request("GET", "/_ping")
    sys.exit(0 if conn.getresponse().read() == b"OK" else 1)
except OSError:
    sys.exit(1)
PY
}

install() {
  command -v dockerd >/dev/null && return 0
  say "installing Debian's docker.io"
  # The package's maintainer scripts would start the system's docker service, with its default
  # firewall rules (see above): a policy-rc.d that says no keeps them from starting anything.
  local policy=/usr/sbin/policy-rc.d made=
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; made=1
  fi
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >&2 || {
    [[ -n $made ]] && rm -f "$policy"; die "installing docker.io failed"; }
  [[ -n $made ]] && rm -f "$policy"
  return 0
}

start() {
  if pid=$(running_pid) && answers; then
    say "already running (pid $pid) on $SOCK"
    print_settings; return 0
  fi
  if ! running_pid >/dev/null && answers; then
    die "$SOCK answers but is not the engine this script started ($PIDFILE); set HUTCH_DOCKER_SOCK"
  fi
  install
  local launched=
  if ! launched=$(running_pid); then
    mkdir -p "$STATE" "$DATA" "$RUN"
    # dockerd writes its pid file itself, and refuses to start over one naming a live process.
    rm -f "$PIDFILE"
    say "starting dockerd on $SOCK (data $DATA; log $LOG)"
    # setsid: the engine outlives this script and the caller's terminal or process group.
    setsid dockerd --host "unix://$SOCK" --pidfile "$PIDFILE" --data-root "$DATA" --exec-root "$RUN/exec" \
      --iptables=false --ip6tables=false --ip-masq=false --bridge=none --userland-proxy=false \
      --no-new-privileges --log-level warn >>"$LOG" 2>&1 </dev/null &
    launched=$!
  fi
  local deadline=$((SECONDS + ${HUTCH_DOCKER_START_TIMEOUT:-60}))
  until answers; do
    if ! kill -0 "$launched" 2>/dev/null; then
      say "dockerd exited; last lines of $LOG:"; tail -n 30 "$LOG" >&2 || true
      exit 1
    fi
    ((SECONDS < deadline)) || die "dockerd did not answer in time; see $LOG"
    sleep 0.2
  done
  say "ready on $SOCK (pid $(running_pid))"
  print_settings
}

stop() {
  local pid
  if ! pid=$(running_pid); then say "not running"; rm -f "$PIDFILE"; return 0; fi
  say "stopping (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then say "still running after 30 s; SIGKILL"; kill -KILL "$pid"; fi
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -f "$PIDFILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  status) if pid=$(running_pid) && answers; then say "running (pid $pid) on $SOCK"; print_settings; else say "not running"; exit 3; fi ;;
  pid) running_pid ;;
  *) echo "usage: $0 start|stop|restart|status|pid" >&2; exit 2 ;;
esac
