#!/usr/bin/env bash
# A Nomad cluster on this one machine that behaves like several hosts: one Nomad server and
# $HUTCH_CLUSTER_CLIENTS (3) Nomad clients. Each client is a "host" as far as the network and
# Nomad can tell: its own network namespace and address on a bridge (hutch-cl0, 10.77.0.0/24),
# its own containerd (own root on a tmpfs, own socket, own shims), its own hutch-containerd
# plugin process and its own data and workspace dirs. The parts are the ones `nomad.sh` builds
# (Nomad and the plugin from Go modules, cached; containerd/runc/registry from Debian).
#
#   cluster.sh start       # idempotent; prints HUTCH_DRIVER=nomad, HUTCH_NOMAD_* (like nomad.sh;
#                          # HUTCH_NOMAD_OPERATOR_TOKEN too: a management token, for Terraform)
#   cluster.sh stop        # leaves nothing: processes, shims, mounts, namespaces, links, iptables
#   cluster.sh status | restart
#   cluster.sh kill N      # node loss: kill -9 client N's Nomad agent and its containerd
#   cluster.sh revive N    # start client N's containerd and Nomad agent again
#   cluster.sh link N down|up   # node loss by network: client N's cable out / back in
#
# Placement is Nomad's "spread" algorithm (set in the server's scheduler configuration):
# sandboxes are bursty and interactive, so spreading them keeps neighbours apart and makes
# the loss of one node cost the fewest sandboxes; binpacking would only pay off with node
# autoscaling, which this profile does not do.
#
# Node loss is detected by Nomad's heartbeats: a TTL of 4-8 s (min_heartbeat_ttl 4s plus
# Nomad's random stagger) + heartbeat_grace 4s, so a dead client's node is `down` 8-12 s after
# its last heartbeat; its allocations turn `unknown` and the nomad driver ends those sandboxes
# `failed`, naming the node (drivers/nomad/jobs.py: Disconnect, nothing placed in their stead).
#
# The sandboxes' network: Nomad's CNI bridge inside each client's namespace, NATed there and
# again by this host for 10.77.0.0/24. The plugin's denied_cidrs keep every sandbox off the
# cluster network (the Nomad server, the registry) and off this host's own addresses.
#
# Hardened as production is (the same template): ACLs on (bootstrapped by acl_setup of nomad.sh,
# with its secret in $ROOT/acl), raw_exec off.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=nomad.sh
source "$here/nomad.sh"  # install_packages, build, nomad_bin, plugin_dir, pid_of, stop_pid

CLIENTS=${HUTCH_CLUSTER_CLIENTS:-3}
NET=${HUTCH_CLUSTER_NET:-10.77.0}          # a /24: .1 is this host (server, registry), .1N client N
BRIDGE=hutch-cl0
HOST_IP="$NET.1"
SERVER_PORT=${HUTCH_CLUSTER_PORT:-4656}    # http; rpc +1, serf +2
REGISTRY="$HOST_IP:${HUTCH_REGISTRY_PORT:-5000}"
ROOT=${HUTCH_SERVICES_DIR:-/var/lib/hutch/services}/cluster
RUN=/run/hutch-cluster
NAT_CHAIN=HUTCH-CLUSTER

client_ip() { echo "$NET.$((10 + $1))"; }
netns() { echo "hutch-c$1"; }
# nsenter execs its command (no fork), so `$!` of `nsenter … &` is the daemon itself.
ns_path() { echo "--net=/run/netns/$(netns "$1")"; }
sock() { echo "$RUN/c$1/containerd.sock"; }

# ---------------------------------------------------------------------------- network

net_up() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$HOST_IP/24" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  sysctl -qw net.ipv4.ip_forward=1
  if ! iptables -w -t nat -S "$NAT_CHAIN" >/dev/null 2>&1; then
    iptables -w -t nat -N "$NAT_CHAIN"
    iptables -w -t nat -A "$NAT_CHAIN" -s "$NET.0/24" ! -o "$BRIDGE" -j MASQUERADE
    iptables -w -t nat -A POSTROUTING -j "$NAT_CHAIN"
  fi
  local i
  for i in $(seq "$CLIENTS"); do client_net_up "$i"; done
}

client_net_up() {
  local i=$1 ns; ns=$(netns "$i")
  [[ -e /run/netns/$ns ]] || ip netns add "$ns"
  # A half-torn network (a killed stop, a namespace re-made under a surviving host end) leaves a
  # host veth whose peer is gone: make the pair again rather than trust the name.
  if ip link show "$ns" >/dev/null 2>&1 && ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
    ip link del "$ns"
  fi
  if ! ip link show "$ns" >/dev/null 2>&1; then
    ip link add "$ns" type veth peer name eth0 netns "$ns"
  fi
  ip link set "$ns" master "$BRIDGE"
  ip -n "$ns" addr replace "$(client_ip "$i")/24" dev eth0
  ip link set "$ns" up
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route replace default via "$HOST_IP"
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
}

net_down() {
  local i
  for i in $(seq "$CLIENTS"); do
    ip link del "$(netns "$i")" 2>/dev/null || true
    ip netns del "$(netns "$i")" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  if iptables -w -t nat -S "$NAT_CHAIN" >/dev/null 2>&1; then
    while iptables -w -t nat -D POSTROUTING -j "$NAT_CHAIN" 2>/dev/null; do :; done
    iptables -w -t nat -F "$NAT_CHAIN"
    iptables -w -t nat -X "$NAT_CHAIN"
  fi
}

# What no sandbox may reach: the cluster network and every address of this host.
denied_cidrs() {
  { echo "$NET.0/24"; ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | grep -v "^$NET\." | sed 's,$,/32,'; } \
    | sed 's/.*/"&"/' | paste -sd, | sed 's/,/, /g'
}

# ---------------------------------------------------------------------------- agents

# Every agent's configuration is the Terraform nomad-node module's template, rendered by OpenTofu
# itself (scripts/tofu): one source for real machines and for these, not two lists.
TEMPLATE="$repo/infra/terraform/modules/nomad-node/agent.hcl.tftpl"

# role name data_dir bind_addr plugin_dir [containerd_socket workspace_root interface cgroup_parent]
agent_vars() {
  cat <<VARS
{
  role = "$1", name = "$2", datacenter = "dc1", data_dir = "$3", bind_addr = "$4", log_level = "WARN",
  http_port = $SERVER_PORT, server_ips = ["$HOST_IP"], plugin_dir = "$5",
  containerd_address = "${6:-}", workspace_root = "${7:-}", network_interface = "${8:-}", cgroup_parent = "${9:-}",
  min_heartbeat_ttl = "4s", heartbeat_grace = "4s", failover_heartbeat_ttl = "20s",
  cluster_cidrs = [$(denied_cidrs)], insecure_registries = ["$REGISTRY"], acl_enabled = true
}
VARS
}

render_agent() {  # an HCL object of the template's variables -> the agent's configuration
  local out work="$ROOT/console"
  mkdir -p "$work"
  out=$(cd "$work" && tr '\n' ' ' <<<"templatefile(\"$TEMPLATE\", $1)" | "$repo/scripts/tofu" console) \
    || die "rendering $TEMPLATE failed"
  sed '1{/^<<EOT$/d}; ${/^EOT$/d}' <<<"$out"  # console prints a multi-line string as a heredoc
}

# ---------------------------------------------------------------------------- server

server_up() {
  STATE="$ROOT/server"
  mkdir -p "$STATE"
  render_agent "$(agent_vars server hutch-server "$STATE/data" "$HOST_IP" "$STATE/plugins")" >"$STATE/agent.hcl.new"
  if pid_of nomad >/dev/null && cmp -s "$STATE/agent.hcl.new" "$STATE/agent.hcl"; then
    rm -f "$STATE/agent.hcl.new"; return 0
  fi
  # A new configuration: a new server (its state would name clients that start over too).
  stop_pid nomad INT
  mv "$STATE/agent.hcl.new" "$STATE/agent.hcl"
  rm -rf "$STATE/data"
  FRESH_SERVER=1
  say "starting the cluster's Nomad server on $HOST_IP:$SERVER_PORT (log $STATE/nomad.log)"
  setsid "$(nomad_bin)" agent -config "$STATE/agent.hcl" >>"$STATE/nomad.log" 2>&1 </dev/null &
  echo $! >"$STATE/nomad.pid"
}

SERVER_ADDR="http://$HOST_IP:$SERVER_PORT"
server_api() { curl -fsS -m 5 -H "X-Nomad-Token: $(management_secret "$ROOT/acl")" "$SERVER_ADDR$1"; }

# ---------------------------------------------------------------------------- clients

client_config() {
  local i=$1 dir=$ROOT/c$1
  echo "# plugin build: $(plugin_dir)/hutch-containerd"
  render_agent "$(agent_vars client "hutch-c$i" "$dir/data" "$(client_ip "$i")" "$dir/plugins" \
    "$(sock "$i")" "$dir/workspaces" eth0 "hutch-c$i")"
}

client_up() {
  local i=$1 dir=$ROOT/c$1
  STATE=$dir
  mkdir -p "$dir/containerd-root" "$dir/workspaces" "$dir/plugins" "$RUN/c$i"
  chmod 711 "$dir/workspaces"
  mountpoint -q "$dir/containerd-root" || mount -t tmpfs -o size=6g,mode=0711 "hutch-c$i" "$dir/containerd-root"
  if ! pid_of containerd >/dev/null; then
    cat >"$dir/containerd.toml" <<EOF
version = 2
root = "$dir/containerd-root/root"
state = "$RUN/c$i/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$(sock "$i")"
[debug]
  level = "warn"
EOF
    nsenter "$(ns_path "$i")" -- setsid containerd --config "$dir/containerd.toml" >>"$dir/containerd.log" 2>&1 </dev/null &
    echo $! >"$dir/containerd.pid"
  fi
  local deadline=$((SECONDS + 30))
  until ctr --address "$(sock "$i")" version >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { tail -n 20 "$dir/containerd.log" >&2; die "containerd of client $i did not come up"; }
    sleep 0.2
  done
  ln -sfn "$(plugin_dir)/hutch-containerd" "$dir/plugins/hutch-containerd"
  client_config "$i" >"$dir/agent.hcl.new"
  if pid_of nomad >/dev/null && cmp -s "$dir/agent.hcl.new" "$dir/agent.hcl"; then
    rm -f "$dir/agent.hcl.new"; return 0
  fi
  stop_pid nomad INT
  mv "$dir/agent.hcl.new" "$dir/agent.hcl"
  nsenter "$(ns_path "$i")" -- setsid "$(nomad_bin)" agent -config "$dir/agent.hcl" >>"$dir/nomad.log" 2>&1 </dev/null &
  echo $! >"$dir/nomad.pid"
}

# Kill every task and shim of client N's containerd, then the daemon; detach what it mounted.
client_down() {
  local i=$1 dir=$ROOT/c$1 id
  STATE=$dir
  stop_pid nomad INT
  if pid_of containerd >/dev/null; then
    local c=(timeout 20 ctr --address "$(sock "$i")" --namespace nomad)  # bounded: see ctr_bounded
    for id in $("${c[@]}" tasks ls -q 2>/dev/null); do "${c[@]}" tasks kill -a -s KILL "$id" >/dev/null 2>&1 || true; done
    sleep 0.2
    for id in $("${c[@]}" tasks ls -q 2>/dev/null); do "${c[@]}" tasks rm -f "$id" >/dev/null 2>&1 || true; done
    for id in $("${c[@]}" containers ls -q 2>/dev/null); do "${c[@]}" containers rm "$id" >/dev/null 2>&1 || true; done
  fi
  stop_pid containerd
  # Daemons whose pidfile is gone (a killed start, an edited script): known by their config.
  pkill -KILL -f "agent -config $dir/agent.hcl" 2>/dev/null || true
  pkill -KILL -f "containerd --config $dir/containerd.toml" 2>/dev/null || true
  kill_shims "$i"
  unmount_under "$dir"
}

# The network namespaces the clients' CNI made for bridge allocations, named by allocation id.
remove_alloc_netns() {
  local id
  for id in "$@"; do
    [[ -e /run/netns/$id ]] && ip netns del "$id" 2>/dev/null || true
  done
}

# A containerd killed with -9 leaves its shims (and the sandboxes under them) running.
kill_shims() {
  local pid
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $(sock "$1")" || true); do
    pkill -KILL -P "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  done
}

unmount_under() {
  local mnt
  awk -v d="$1/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r mnt; do
    umount -l "$mnt" 2>/dev/null || true
  done
}

ready_clients() {
  server_api "/v1/nodes?resources=false" 2>/dev/null | python3 -c '
import json, sys
try:
    nodes = json.load(sys.stdin)
except ValueError:
    sys.exit(1)
print(sum(1 for n in nodes if n["Status"] == "ready" and n.get("SchedulingEligibility") == "eligible"
          and n.get("Drivers", {}).get("hutch-containerd", {}).get("Healthy")))' || echo 0
}

# ---------------------------------------------------------------------------- registry

# The registry the clients pull from, on the cluster network. It shares its storage with
# nomad.sh's registry on loopback, so images pushed to either are in both.
registry_up() {
  STATE="$ROOT/registry"
  start_registry  # nomad.sh's, with this STATE and REGISTRY
}

# ---------------------------------------------------------------------------- actions

print_settings() {
  echo "HUTCH_DRIVER=nomad"
  echo "HUTCH_NOMAD_ADDR=$SERVER_ADDR"
  echo "HUTCH_NOMAD_REGISTRY=$REGISTRY"
  echo "HUTCH_NOMAD_TOKEN=$(cat "$ROOT/acl/hutch.token")"
  echo "HUTCH_NOMAD_OPERATOR_TOKEN=$(management_secret "$ROOT/acl")"
}

wait_clients() {  # count timeout
  local deadline=$((SECONDS + $2)) n
  while :; do
    n=$(ready_clients)
    ((n >= $1)) && return 0
    ((SECONDS < deadline)) || { tail -n 20 "$ROOT"/c*/nomad.log "$ROOT/server/nomad.log" >&2 || true
                                die "$n of $1 client nodes ready after $2 s"; }
    sleep 0.3
  done
}

start() {
  local started=$SECONDS i
  install_packages
  build
  sandbox_sysctls  # nomad.sh: the clients' per-uid inotify counts, lifted (one kernel for all)
  net_up
  registry_up
  FRESH_SERVER=0
  server_up
  if ((FRESH_SERVER)); then
    # A new server knows no allocation: clients that kept state from before (a power loss, a
    # killed stop) would restore allocations whose containerd tasks are gone and that no server
    # will ever place again. Start them from nothing too.
    for i in $(seq "$CLIENTS"); do client_down "$i"; rm -rf "${ROOT:?}/c$i/data"; done
  fi
  acl_setup "$SERVER_ADDR" "$ROOT/acl"
  for i in $(seq "$CLIENTS"); do client_up "$i"; done
  wait_clients "$CLIENTS" 90
  say "cluster ready in $((SECONDS - started))s: server $HOST_IP:$SERVER_PORT, $CLIENTS clients ($(for i in $(seq "$CLIENTS"); do printf '%s ' "$(client_ip "$i")"; done)), registry $REGISTRY"
  print_settings
}

stop() {
  local i allocs
  allocs=$(server_api /v1/allocations 2>/dev/null | python3 -c 'import json, sys; print(" ".join(a["ID"] for a in json.load(sys.stdin)))' 2>/dev/null || true)
  for i in $(seq "$CLIENTS"); do client_down "$i"; done
  # shellcheck disable=SC2086
  remove_alloc_netns $allocs
  STATE="$ROOT/server"; stop_pid nomad INT
  STATE="$ROOT/registry"; stop_pid registry
  kill_orphan_logmons
  net_down
  for i in $(seq "$CLIENTS"); do
    unmount_under "$ROOT/c$i"
    rm -rf "${ROOT:?}/c$i" "$RUN/c$i"
  done
  rm -rf "$ROOT/server/data"
  rmdir "$RUN" 2>/dev/null || true
  # Nomad's per-client cgroup parents (cgroup v1 hierarchies and the v2 mount).
  for i in $(seq "$CLIENTS"); do
    find /sys/fs/cgroup -depth -type d -name "hutch-c$i" -exec rmdir {} + 2>/dev/null || true
  done
  return 0
}

status() {
  local rc=0 i
  STATE="$ROOT/server"; pid_of nomad >/dev/null && say "server running" || { say "server not running"; rc=3; }
  for i in $(seq "$CLIENTS"); do
    STATE="$ROOT/c$i"
    pid_of nomad >/dev/null && say "client $i running" || { say "client $i not running"; rc=3; }
  done
  ((rc == 0)) && (($(ready_clients) == CLIENTS)) && print_settings || return 3
}

node_arg() {
  [[ "${1:-}" =~ ^[0-9]+$ ]] && (($1 >= 1 && $1 <= CLIENTS)) || die "expected a client number 1..$CLIENTS, got '${1:-}'"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  status) status ;;
  kill)
    node_arg "${2:-}"
    STATE="$ROOT/c$2"
    for svc in nomad containerd; do pid=$(pid_of $svc) && kill -KILL "$pid"; rm -f "$STATE/$svc.pid"; done
    say "client $2: Nomad agent and containerd killed (-9); its shims and sandboxes run on" ;;
  revive) node_arg "${2:-}"; client_net_up "$2"; client_up "$2" ;;
  link)
    node_arg "${2:-}"
    [[ "${3:-}" == up || "${3:-}" == down ]] || die "expected: link N up|down"
    ip link set "$(netns "$2")" "$3" ;;
  *) echo "usage: $0 start|stop|restart|status|kill N|revive N|link N up|down" >&2; exit 2 ;;
esac
