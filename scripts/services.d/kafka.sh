#!/usr/bin/env bash
# Apache Kafka for hutch's production profile and tests: one KRaft node (broker + controller)
# on loopback, its jars resolved from Maven Central by the machine's Maven, run on Java 17.
#   kafka.sh start     # idempotent: fetch jars (cached), format storage once, start, wait until
#                      # the broker answers a metadata request; prints HUTCH_EVENT_LOG=… on stdout
#   kafka.sh stop      # SIGTERM (controlled shutdown), SIGKILL after 30 s
#   kafka.sh restart | status | pid
# Settings (environment): HUTCH_KAFKA_PORT (19092; the controller listens on PORT+1),
# HUTCH_KAFKA_TOPIC (hutch-events), HUTCH_SERVICES_DIR (state), HUTCH_CACHE_DIR (jars),
# HUTCH_KAFKA_HEAP (512m). Logs: $HUTCH_SERVICES_DIR/kafka/logs/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/kafka/pom.xml")
PORT=${HUTCH_KAFKA_PORT:-19092}
CONTROLLER_PORT=$((PORT + 1))
TOPIC=${HUTCH_KAFKA_TOPIC:-hutch-events}
HEAP=${HUTCH_KAFKA_HEAP:-512m}
if [[ $EUID -eq 0 ]]; then
  STATE=${HUTCH_SERVICES_DIR:-/var/lib/hutch/services}
  CACHE=${HUTCH_CACHE_DIR:-/var/cache/hutch}
else
  STATE=${HUTCH_SERVICES_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/hutch/services}
  CACHE=${HUTCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hutch}
fi
DIR="$STATE/kafka-$PORT"
LIBS="$CACHE/kafka/$KAFKA_VERSION/libs"
PIDFILE="$DIR/kafka.pid"

say() { echo "kafka: $*" >&2; }

running_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid; pid=$(cat "$PIDFILE")
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && grep -q 'kafka\.Kafka' "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

# A Metadata v1 request over a raw socket: ready once the broker lists itself and a controller.
answers() {
  python3 - "$PORT" <<'PY'
import socket, struct, sys
port = int(sys.argv[1])
try:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        client = b"hutch-services"
        body = struct.pack(">hhih", 3, 1, 7, len(client)) + client + struct.pack(">i", -1)
        s.sendall(struct.pack(">i", len(body)) + body)
        def exact(n):
            buf = b""
            while len(buf) < n:
                chunk = s.recv(n - len(buf))
                if not chunk:
                    raise OSError("closed")
                buf += chunk
            return buf
        (size,) = struct.unpack(">i", exact(4))
        data = exact(size)
        corr, nbrokers = struct.unpack(">ii", data[:8])
        off = 8
        for _ in range(nbrokers):
            off += 4
            (hl,) = struct.unpack(">h", data[off:off + 2]); off += 2 + hl + 4
            (rl,) = struct.unpack(">h", data[off:off + 2]); off += 2 + max(rl, 0)
        (controller,) = struct.unpack(">i", data[off:off + 4])
        sys.exit(0 if corr == 7 and nbrokers >= 1 and controller >= 0 else 1)
except (OSError, struct.error):
    sys.exit(1)
PY
}

print_settings() { echo "HUTCH_EVENT_LOG=kafka://127.0.0.1:$PORT/$TOPIC"; }

install() {
  command -v java >/dev/null || { say "installing Java 17"; apt_install openjdk-17-jre-headless; }
  command -v mvn >/dev/null || { say "installing Maven"; apt_install maven; }
  if [[ ! -f "$LIBS/.complete" ]]; then
    say "fetching Apache Kafka $KAFKA_VERSION jars from Maven Central (once; cached in $LIBS)"
    mkdir -p "$LIBS"
    mvn -q -B -Dstyle.color=never -f "$here/kafka/pom.xml" -Dmaven.repo.local="$CACHE/maven" \
      dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIBS" >&2
    touch "$LIBS/.complete"
  fi
}

apt_install() {
  local sudo=; [[ $EUID -ne 0 ]] && sudo=sudo
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >&2
}

JAVA=(java -Xms"$HEAP" -Xmx"$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
  -Dkafka.logs.dir="$DIR/logs" -Dlog4j.configuration="file:$here/kafka/log4j.properties" -cp "$LIBS/*")

configure() {
  mkdir -p "$DIR/data" "$DIR/logs"
  cat >"$DIR/server.properties" <<PROPS
# written by scripts/services.d/kafka.sh
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DIR/data
num.partitions=6
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
min.insync.replicas=1
group.initial.rebalance.delay.ms=0
# abort transactions whose producer vanished within seconds, not the default minute
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
# after a kill -9 the broker may re-register once its old session expired: keep that short
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=500
log.retention.hours=-1
PROPS
  if [[ ! -f "$DIR/data/meta.properties" ]]; then
    local cluster_id
    # Not starting with "-", as Kafka's own random-uuid: the tool's parser reads "-P5…" as an option.
    cluster_id=$(python3 -c 'import base64,uuid
while (i := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"): pass
print(i)')
    say "formatting storage in $DIR/data (cluster $cluster_id)"
    "${JAVA[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$DIR/server.properties" >>"$DIR/logs/format.log" 2>&1 \
      || { cat "$DIR/logs/format.log" >&2; exit 1; }
  fi
}

start() {
  if pid=$(running_pid) && answers; then
    say "already running (pid $pid) on 127.0.0.1:$PORT"
    print_settings; return 0
  fi
  if ! running_pid >/dev/null && answers; then
    say "port $PORT answers but is not the broker this script started ($PIDFILE); set HUTCH_KAFKA_PORT"
    exit 1
  fi
  install
  if ! running_pid >/dev/null; then
    configure
    say "starting the broker on 127.0.0.1:$PORT (logs in $DIR/logs)"
    # setsid: the broker outlives this script and the caller's terminal or process group.
    setsid "${JAVA[@]}" kafka.Kafka "$DIR/server.properties" >>"$DIR/logs/stdout.log" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
  fi
  local deadline=$((SECONDS + ${HUTCH_KAFKA_START_TIMEOUT:-90}))
  until answers; do
    if ! running_pid >/dev/null; then
      say "the broker exited; last lines of its logs:"; tail -n 30 "$DIR/logs/stdout.log" "$DIR/logs/server.log" >&2 2>/dev/null || true
      exit 1
    fi
    if ((SECONDS > deadline)); then say "the broker did not answer in time; see $DIR/logs"; exit 1; fi
    sleep 0.2
  done
  say "ready on 127.0.0.1:$PORT (pid $(running_pid))"
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
  status) if pid=$(running_pid) && answers; then say "running (pid $pid) on 127.0.0.1:$PORT"; print_settings; else say "not running"; exit 3; fi ;;
  pid) running_pid ;;
  *) echo "usage: $0 start|stop|restart|status|pid" >&2; exit 2 ;;
esac
