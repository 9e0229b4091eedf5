#!/usr/bin/env bash
# Nomad + containerd for hutch's `nomad` driver and its tests, all on loopback:
#   - containerd and runc (Debian), containerd's root on a tmpfs (file creation on / is slow);
#   - a local OCI registry (Debian's docker-registry) holding the runtime images;
#   - HashiCorp Nomad in dev mode (server + client) with hutch's containerd task driver plugin,
#     both built from Go modules through the module proxy with this machine's Go, cached by
#     version under $HUTCH_NOMAD_CACHE (a second start never rebuilds);
#   - the runtime images: the same root filesystems the local driver uses (built by
#     `python -m hutch.drivers.local.rootfs`), turned into OCI images with umoci and pushed with skopeo.
#
#   nomad.sh start     # idempotent; installs/builds what is missing; waits for a ready client
#                      # node; prints HUTCH_DRIVER=nomad and HUTCH_NOMAD_* settings on stdout
#                      # (HUTCH_NOMAD_TOKEN: hutch's ACL token, a new one after each restart)
#   nomad.sh stop      # stops Nomad, removes the containers it left, stops containerd + registry
#   nomad.sh restart | status | build | images
# Settings (environment): HUTCH_NOMAD_PORT (4646), HUTCH_REGISTRY_PORT (5000),
# HUTCH_NOMAD_RUNTIMES ("base:latest python:3.13"), HUTCH_NOMAD_CACHE (/var/cache/hutch/nomad),
# HUTCH_SERVICES_DIR (state). Logs: $HUTCH_SERVICES_DIR/nomad/*.log.
#
# As production runs it (infra/terraform): ACLs on, so nothing answers without a token (the
# management token's secret is $HUTCH_SERVICES_DIR/nomad/acl/management.secret, root only;
# hutch gets a token of the hutch-driver policy: acl_setup), and no raw_exec or exec driver:
# hutch-containerd is the only one a job can use.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
MODULE="$here/nomad"

NOMAD_VERSION=v1.10.0
PORT=${HUTCH_NOMAD_PORT:-4646}
REGISTRY_PORT=${HUTCH_REGISTRY_PORT:-5000}
REGISTRY="127.0.0.1:$REGISTRY_PORT"
RUNTIMES=${HUTCH_NOMAD_RUNTIMES:-"base:latest python:3.13"}
STATE=${HUTCH_SERVICES_DIR:-/var/lib/hutch/services}/nomad
CACHE=${HUTCH_NOMAD_CACHE:-/var/cache/hutch/nomad}
REGISTRY_DATA=${HUTCH_REGISTRY_DATA:-/var/cache/hutch/registry}
CTRD_ROOT="$STATE/containerd-root"      # a tmpfs
CTRD_RUN=/run/hutch-containerd
CTRD_SOCK="$CTRD_RUN/containerd.sock"
CTRD_NS=nomad
WORKSPACES=${HUTCH_NOMAD_WORKSPACES:-/var/lib/hutch/nomad-workspaces}
PY=${PYTHON:-python3}

say() { echo "nomad: $*" >&2; }
die() { say "$*"; exit 1; }

[[ $EUID -eq 0 ]] || die "needs root (containerd, runc, cgroups); run as root"

# A pidfile can outlive its process: after a power loss or a kill -9 of the whole machine's
# services the pid may be free, a zombie, or recycled by some other program. Only a live process
# whose command line names the service counts (nomad, containerd, docker-registry).
pid_of() {  # name -> pid of a live process we started, from its pidfile
  local f="$STATE/$1.pid"
  [[ -f "$f" ]] || return 1
  local pid; pid=$(cat "$f")
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  local state; state=$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || return 1
  [[ -n "$state" && "$state" != Z && "$state" != X ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$1" || return 1
  echo "$pid"
}

stop_pid() {  # name [signal]
  local pid
  pid=$(pid_of "$1") || { rm -f "$STATE/$1.pid"; return 0; }
  kill "-${2:-TERM}" "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$STATE/$1.pid"
}

# ---------------------------------------------------------------------------- install

install_packages() {
  local missing=() pkg
  # A client's packages come from the list the Terraform nomad-node module installs on its clients;
  # this host also keeps the registry and builds the images.
  local client_packages
  client_packages=$(grep -v '^#' "$repo/infra/terraform/modules/nomad-node/client-packages.txt")
  for pkg in $client_packages docker-registry umoci skopeo; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    say "installing Debian packages: ${missing[*]}"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi
  command -v go >/dev/null || [[ -x /usr/local/go/bin/go ]] || die "Go is not installed (needed to build Nomad)"
}

go_bin() { command -v go || echo /usr/local/go/bin/go; }

# The cache keys: Nomad by its version and the module's requirements; the plugin by its sources too.
nomad_key() { cat "$MODULE/go.mod" "$MODULE/go.sum" | sha256sum | cut -c1-12; }
plugin_key() { cat "$MODULE/go.mod" "$MODULE/go.sum" "$MODULE"/containerd-driver/*.go | sha256sum | cut -c1-12; }
nomad_bin() { echo "$CACHE/nomad-$NOMAD_VERSION-$(nomad_key)/nomad"; }
plugin_dir() { echo "$CACHE/plugins-$(plugin_key)"; }

# Builds from a private copy of the wrapper module (the repo stays clean, the module cache
# read-only). Nomad's own go.mod has replace directives, so `go install nomad@version`
# refuses it; the wrapper repeats them. -p 2: two cores.
go_build() {  # package output
  local work; work=$(mktemp -d "$CACHE/.build-XXXXXX")
  cp -r "$MODULE/." "$work/"
  local started=$SECONDS
  (cd "$work" && GOFLAGS="-mod=mod -trimpath -buildvcs=false" GONOSUMDB=github.com/hashicorp/nomad/api \
      CGO_ENABLED=1 "$(go_bin)" build -p 2 -o "$2.tmp" "$1") >&2 || { rm -rf "$work"; die "building $1 failed"; }
  mv "$2.tmp" "$2"
  rm -rf "$work"
  say "built $(basename "$2") in $((SECONDS - started))s"
}

build() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.build.lock"
  flock 9
  local nb; nb=$(nomad_bin)
  if [[ ! -x "$nb" ]]; then
    say "building Nomad $NOMAD_VERSION from its Go module (first time only: a few minutes on 2 cores)"
    mkdir -p "$(dirname "$nb")"
    go_build github.com/hashicorp/nomad "$nb"
  fi
  local pd; pd=$(plugin_dir)
  if [[ ! -x "$pd/hutch-containerd" ]]; then
    say "building the hutch-containerd task driver plugin"
    mkdir -p "$pd"
    go_build ./containerd-driver "$pd/hutch-containerd"
  fi
  # The exec agent each sandbox runs its commands through (static, no dependencies; cached by
  # its sources' hash: drivers/nomad/agents.py).
  (cd "$repo" && HUTCH_NOMAD_CACHE="$CACHE" $PY -m hutch.drivers.nomad.agents build) >/dev/null \
    || die "building the nomad exec agent failed"
  exec 9>&-
}

# ---------------------------------------------------------------------------- containerd

start_containerd() {
  mkdir -p "$STATE" "$CTRD_ROOT" "$CTRD_RUN"
  if ! mountpoint -q "$CTRD_ROOT"; then
    mount -t tmpfs -o size=12g,mode=0711 hutch-containerd "$CTRD_ROOT"
  fi
  if pid_of containerd >/dev/null && ctr_ version >/dev/null 2>&1; then return 0; fi
  cat >"$STATE/containerd.toml" <<EOF
version = 2
root = "$CTRD_ROOT/root"
state = "$CTRD_RUN/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$CTRD_SOCK"
[debug]
  level = "warn"
EOF
  say "starting containerd (root on tmpfs $CTRD_ROOT; log $STATE/containerd.log)"
  setsid containerd --config "$STATE/containerd.toml" >>"$STATE/containerd.log" 2>&1 </dev/null &
  echo $! >"$STATE/containerd.pid"
  local deadline=$((SECONDS + 30))
  until ctr_ version >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { tail -n 20 "$STATE/containerd.log" >&2; die "containerd did not come up"; }
    sleep 0.2
  done
}

ctr_() { ctr --address "$CTRD_SOCK" --namespace "$CTRD_NS" "$@"; }
# Clean-up calls are bounded: a task whose shim died answers UNKNOWN, and `tasks kill` on it can
# block for minutes, which would hang `services stop` (and the next start) behind it.
ctr_bounded() { timeout 20 ctr --address "$CTRD_SOCK" --namespace "$CTRD_NS" "$@"; }

# Containers a dead Nomad left behind (dev mode forgets its allocations when it stops).
remove_containers() {
  local id
  for id in $(ctr_bounded tasks ls -q 2>/dev/null); do ctr_bounded tasks kill -a -s KILL "$id" >/dev/null 2>&1 || true; done
  sleep 0.2
  for id in $(ctr_bounded tasks ls -q 2>/dev/null); do ctr_bounded tasks rm -f "$id" >/dev/null 2>&1 || true; done
  for id in $(ctr_bounded containers ls -q 2>/dev/null); do ctr_bounded containers rm "$id" >/dev/null 2>&1 || true; done
}

# What a Nomad dev client killed without a stop leaves behind: its allocations' mounts
# under /tmp/NomadClient* (526 of them were found on this host once: every tool that reads
# the mount table pays for them) and CNI network namespaces named by allocation id.
# Called only when no Nomad runs. Mounts are detached, never deleted through: an
# allocation dir may hold a bind mount of a host directory.
release_dead_client() {
  pgrep -x nomad >/dev/null && return 0
  local mnt ns name left
  awk '$5 ~ "^/tmp/NomadClient" {print $5}' /proc/self/mountinfo | sort -r | while read -r mnt; do
    umount -l "$mnt" 2>/dev/null || true
  done
  left=$(awk '$5 ~ "^/tmp/NomadClient"' /proc/self/mountinfo | wc -l)
  ((left == 0)) || say "warning: $left mounts of a dead Nomad client remain under /tmp/NomadClient*"
  for ns in /run/netns/*; do
    [[ -e $ns ]] || continue
    name=${ns##*/}
    [[ $name =~ ^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$ ]] || continue
    [[ -n $(ip netns pids "$name" 2>/dev/null) ]] && continue
    ip netns del "$name" 2>/dev/null || true
  done
}

# Log monitors of allocations whose Nomad agent is gone (re-parented to init): every stop
# left a few, and they kept `pgrep -x nomad` above true, so the clean-up skipped itself.
kill_orphan_logmons() {
  pkill -KILL -P 1 -f '/nomad logmon$' 2>/dev/null || true
}

# ---------------------------------------------------------------------------- registry + images

start_registry() {
  if pid_of registry >/dev/null && curl -fsS "http://$REGISTRY/v2/" >/dev/null 2>&1; then return 0; fi
  curl -fsS -m 2 "http://$REGISTRY/v2/" >/dev/null 2>&1 && die "port $REGISTRY_PORT answers but is not our registry; set HUTCH_REGISTRY_PORT"
  mkdir -p "$REGISTRY_DATA" "$STATE"
  cat >"$STATE/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $REGISTRY_DATA
  delete:
    enabled: true
http:
  addr: $REGISTRY
EOF
  say "starting the OCI registry on $REGISTRY (data $REGISTRY_DATA)"
  setsid docker-registry serve "$STATE/registry.yml" >>"$STATE/registry.log" 2>&1 </dev/null &
  echo $! >"$STATE/registry.pid"
  local deadline=$((SECONDS + 20))
  until curl -fsS "http://$REGISTRY/v2/" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { tail -n 20 "$STATE/registry.log" >&2; die "registry did not come up"; }
    sleep 0.2
  done
}

# Optional warm-up (`nomad.sh images`): pushes each of $RUNTIMES unless the registry has it, then
# pre-pulls it into containerd. `start` no longer does: which runtimes exist is the catalog's
# business, and the nomad driver builds and pushes a runtime's image on its first use.
images() {
  local name ref
  for name in $RUNTIMES; do
    ref=$(cd "$repo" && $PY -m hutch.drivers.nomad.images ref "$name" --registry "$REGISTRY")
    if ! (cd "$repo" && $PY -m hutch.drivers.nomad.images exists "$name" --registry "$REGISTRY"); then
      local started=$SECONDS
      (cd "$repo" && $PY -m hutch.drivers.local.rootfs build "$name") >&2
      (cd "$repo" && $PY -m hutch.drivers.nomad.images push "$name" --registry "$REGISTRY") >&2
      say "pushed $ref in $((SECONDS - started))s"
    fi
    if ! ctr_ images ls -q | grep -qxF "$ref"; then
      local started=$SECONDS
      ctr_ images pull --plain-http "$ref" >/dev/null
      say "pulled $ref into containerd in $((SECONDS - started))s"
    fi
  done
}

# ---------------------------------------------------------------------------- nomad

api() { curl -fsS -m 5 -H "X-Nomad-Token: $(management_secret "$STATE/acl")" "http://127.0.0.1:$PORT$1"; }

# ---------------------------------------------------------------------------- ACLs

ACL_POLICY=hutch-driver
# What the nomad driver calls (drivers/nomad/client.py, placement.py): jobs (register, read,
# stop, their allocations and evaluations), allocations (read, exec, gc: submit-job), nodes (read).
# In hutch-system, where the node agents run, only what the node driver's directory reads: the
# hutch-node service registrations (drivers/node/catalog.py; Nomad wants read-job for them).
ACL_RULES='namespace "default" {
  capabilities = ["submit-job", "read-job", "list-jobs", "alloc-exec", "alloc-lifecycle"]
}
namespace "hutch-system" {
  capabilities = ["read-job"]
}
node {
  policy = "read"
}'

# The node agents run as root through raw_exec (the hutch-node system job). Nomad's servers
# refuse, at registration, a job whose driver its namespace's capabilities do not allow
# (nomad/job_endpoint_validators.go): raw_exec only in hutch-system, where no token but a
# management one may submit, and never in default, where hutch's token may. A namespace made
# without capabilities would allow every driver: only management tokens can make one.
NAMESPACES='[
  {"Name": "default", "Description": "Default shared namespace",
   "Capabilities": {"DisabledTaskDrivers": ["raw_exec"]}},
  {"Name": "hutch-system", "Description": "hutch node agents (the hutch-node system job): raw_exec only",
   "Capabilities": {"EnabledTaskDrivers": ["raw_exec"]}}
]'

namespaces_setup() {  # addr management-secret
  local ns name
  while read -r ns; do
    name=$($PY -c 'import json, sys; print(json.loads(sys.argv[1])["Name"])' "$ns")
    curl -fsS -m 5 -X PUT -H "X-Nomad-Token: $2" -d "$ns" "$1/v1/namespace/$name" >/dev/null \
      || die "writing namespace $name to $1 failed"
  done < <($PY -c 'import json, sys; [print(json.dumps(n)) for n in json.loads(sys.argv[1])]' "$NAMESPACES")
}

management_secret() { cat "$1/management.secret" 2>/dev/null || true; }

# acl_setup ADDR DIR: bootstraps the ACLs of the Nomad at ADDR with the secret in
# DIR/management.secret (generated once: a dev agent, which forgets everything when it stops,
# gets the same management token again), writes the namespaces (their task drivers) and the
# hutch-driver policy and keeps a token of it in DIR/hutch.token (a new one when the old no
# longer works).
acl_setup() {
  local addr=$1 dir=$2 mgmt out deadline=$((SECONDS + 60))
  mkdir -p "$dir" && chmod 700 "$dir"
  [[ -s $dir/management.secret ]] || (umask 077 && cat /proc/sys/kernel/random/uuid >"$dir/management.secret")
  mgmt=$(management_secret "$dir")
  until curl -fsS -m 5 -H "X-Nomad-Token: $mgmt" "$addr/v1/acl/token/self" >/dev/null 2>&1; do
    out=$(curl -sS -m 5 -X POST -d "{\"BootstrapSecret\": \"$mgmt\"}" "$addr/v1/acl/bootstrap" 2>&1) || true
    [[ $out != *"already done"* ]] || die "the Nomad at $addr had its ACLs bootstrapped with another secret than $dir/management.secret; stop it (its state goes) and start it again"
    ((SECONDS < deadline)) || die "bootstrapping the ACLs of the Nomad at $addr failed: $out"
    sleep 0.3
  done
  # Before hutch's token exists: it never sees default allowing raw_exec.
  namespaces_setup "$addr" "$mgmt"
  local policy
  policy=$($PY -c 'import json, sys; print(json.dumps({"Name": sys.argv[1], "Description": "the hutch nomad driver", "Rules": sys.argv[2]}))' "$ACL_POLICY" "$ACL_RULES")
  curl -fsS -m 5 -X POST -H "X-Nomad-Token: $mgmt" -d "$policy" "$addr/v1/acl/policy/$ACL_POLICY" >/dev/null \
    || die "writing the ACL policy $ACL_POLICY to $addr failed"
  if [[ -s $dir/hutch.token ]] && curl -fsS -m 5 -H "X-Nomad-Token: $(cat "$dir/hutch.token")" "$addr/v1/acl/token/self" >/dev/null 2>&1; then
    return 0
  fi
  out=$(curl -fsS -m 5 -X POST -H "X-Nomad-Token: $mgmt" -d "{\"Name\": \"hutch\", \"Type\": \"client\", \"Policies\": [\"$ACL_POLICY\"]}" \
    "$addr/v1/acl/token") || die "making hutch's ACL token on $addr failed"
  (umask 077 && $PY -c 'import json, sys; print(json.load(sys.stdin)["SecretID"])' <<<"$out" >"$dir/hutch.token")
}

node_ready() {
  api /v1/nodes?resources=false 2>/dev/null | $PY -c '
import json, sys
try:
    nodes = json.load(sys.stdin)
except ValueError:
    sys.exit(1)
ok = [n for n in nodes if n["Status"] == "ready" and n.get("Drivers", {}).get("hutch-containerd", {}).get("Healthy")]
sys.exit(0 if ok else 1)'
}

start_nomad() {
  local plugin; plugin="$(plugin_dir)/hutch-containerd"
  mkdir -p "$STATE"
  agent_config "$plugin" >"$STATE/agent.hcl.new"
  if pid_of nomad >/dev/null && node_ready && cmp -s "$STATE/agent.hcl.new" "$STATE/agent.hcl"; then
    rm -f "$STATE/agent.hcl.new"
    acl_setup "http://127.0.0.1:$PORT" "$STATE/acl"
    return 0
  fi
  stop_pid nomad INT
  curl -sS -m 5 -o /dev/null "http://127.0.0.1:$PORT/v1/status/leader" 2>/dev/null \
    && die "port $PORT answers but is not our Nomad; set HUTCH_NOMAD_PORT"
  remove_containers
  release_dead_client
  mkdir -p "$WORKSPACES" "$STATE/plugins"
  chmod 711 "$WORKSPACES"
  ln -sfn "$plugin" "$STATE/plugins/hutch-containerd"
  mv "$STATE/agent.hcl.new" "$STATE/agent.hcl"
  say "starting Nomad $NOMAD_VERSION (dev agent on 127.0.0.1:$PORT; log $STATE/nomad.log)"
  rm -rf "$STATE/alloc"
  setsid "$(nomad_bin)" agent -dev -config "$STATE/agent.hcl" >>"$STATE/nomad.log" 2>&1 </dev/null &
  echo $! >"$STATE/nomad.pid"
  acl_setup "http://127.0.0.1:$PORT" "$STATE/acl"
  local deadline=$((SECONDS + 90))
  until node_ready; do
    pid_of nomad >/dev/null || { tail -n 30 "$STATE/nomad.log" >&2; die "Nomad exited"; }
    ((SECONDS < deadline)) || { tail -n 30 "$STATE/nomad.log" >&2; die "no ready client node with the hutch-containerd driver"; }
    sleep 0.3
  done
}

# The agent's configuration; a change (or a new plugin build) restarts a running agent.
agent_config() {
  cat <<EOF
# Written by scripts/services.d/nomad.sh (plugin build: $1)
bind_addr  = "127.0.0.1"
plugin_dir = "$STATE/plugins"
log_level  = "WARN"
limits {
  http_max_conns_per_client = 1000
  rpc_max_conns_per_client  = 1000
}
ports {
  http = $PORT
  rpc  = $((PORT + 1))
  serf = $((PORT + 2))
}
acl {
  enabled = true
}
client {
  options = {
    # hutch-containerd only: raw_exec (which dev mode turns on) runs a job as root on the host.
    "driver.denylist"          = "docker,java,qemu,podman,raw_exec,exec"
    "fingerprint.denylist"     = "env_aws,env_gce,env_azure,env_digitalocean"
  }
  gc_interval = "10s"
  gc_max_allocs = 500
  # Sandboxes with network.enabled: a group network in bridge mode, from Debian's CNI plugins;
  # the plugin's sandbox_firewall keeps them off the host and off each other.
  cni_path = "/usr/lib/cni"
}
server {
  job_gc_threshold = "5m"
}
plugin "raw_exec" {
  config {
    enabled = false
  }
}
plugin "hutch-containerd" {
  config {
    address        = "$CTRD_SOCK"
    namespace      = "$CTRD_NS"
    workspace_root = "$WORKSPACES"
    sandbox_firewall = true
  }
}
EOF
}

print_settings() {
  echo "HUTCH_DRIVER=nomad"
  echo "HUTCH_NOMAD_ADDR=http://127.0.0.1:$PORT"
  echo "HUTCH_NOMAD_REGISTRY=$REGISTRY"
  echo "HUTCH_NOMAD_TOKEN=$(cat "$STATE/acl/hutch.token")"
}

# Every nomad sandbox runs as the same uid of the host (HUTCH_NOMAD_UID), and the kernel counts
# inotify instances and watches per uid: one sandbox holding the 128 instances of the default
# left every other sandbox of the node without any (EMFILE). Both are kernel memory charged to
# the memory cgroup of the sandbox that takes them, so the per-uid counts are lifted and each
# sandbox pays for its own within its memory limit. The same values as the Terraform nodes'
# /etc/sysctl.d/60-hutch-sandboxes.conf (infra/terraform/modules/nomad-node).
sandbox_sysctls() {
  sysctl -qw fs.inotify.max_user_instances=2147483647 fs.inotify.max_user_watches=2147483647
}

start() {
  local started=$SECONDS
  install_packages
  build
  sandbox_sysctls
  start_containerd
  start_registry
  start_nomad
  say "ready in $((SECONDS - started))s: Nomad on 127.0.0.1:$PORT, registry $REGISTRY, containerd $CTRD_SOCK"
  print_settings
}

stop() {
  if pid_of nomad >/dev/null; then say "stopping Nomad"; fi
  stop_pid nomad INT
  kill_orphan_logmons
  release_dead_client
  if pid_of containerd >/dev/null; then
    remove_containers
    say "stopping containerd"
  fi
  stop_pid containerd
  release_dead_client  # again: the namespaces the containers held are free now
  if pid_of registry >/dev/null; then say "stopping the registry"; fi
  stop_pid registry
  if mountpoint -q "$CTRD_ROOT"; then umount "$CTRD_ROOT" 2>/dev/null || umount -l "$CTRD_ROOT" || true; fi
  rm -rf "${WORKSPACES:?}"/* 2>/dev/null || true
}

status() {
  local ok=0
  for svc in containerd registry nomad; do
    if pid=$(pid_of $svc); then say "$svc running (pid $pid)"; else say "$svc not running"; ok=3; fi
  done
  if ((ok == 0)) && node_ready; then print_settings; else return 3; fi
}

# Sourced by cluster.sh for its functions (install, build, containerd, registry): no action then.
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  status) status ;;
  build) install_packages; build; echo "$(nomad_bin)"; echo "$(plugin_dir)/hutch-containerd"
    (cd "$repo" && HUTCH_NOMAD_CACHE="$CACHE" $PY -m hutch.drivers.nomad.agents build) ;;
  images) start_containerd; start_registry; images ;;
  *) echo "usage: $0 start|stop|restart|status|build|images" >&2; exit 2 ;;
esac
