"""The nomad driver from the attacker's side (issue 32): code running inside a nomad sandbox
tries what the adversarial pass did, against the real Nomad + containerd + hutch-containerd of
``./scripts/services start nomad`` (and the cluster's Nomad for its ACLs):

- Nomad's own things (the Task API socket, the workload identity, the alloc/local/secrets
  dirs) are not in the sandbox, and a job submission from it is impossible; Nomad answers no
  one without a token and runs no raw_exec;
- every writable path counts against the disk limit, or is not there;
- IPv6 reaches nothing of the host, as IPv4 does not (network on, with an allow-list, port only);
- private ranges and the local driver's sandboxes are out of reach, DNS to the sandbox's own
  name servers still works;
- the task's stdout on the host stays bounded;
- the exec agent's memory is out of reach of the sandbox's own processes;
- memory, CPU and /dev/shm limits are real, and never "unlimited" when none were asked for.

One driver for the module; each test makes the sandboxes it attacks."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from hutch.drivers.base import ExecRequest, ProvisionRequest, ResourceLimits
from hutch.drivers.nomad.driver import NomadDriver
from tests.drivers_support import (  # noqa: F401  (fixtures of the local driver)
    NOMAD_ADDR,
    Recorder,
    built_runtimes,
    local_data_dir,
    new_id,
    start_local,
    start_nomad,
    stop_local,
)
from tests.isolation import connect_probe
from tests.isolation.test_local_network import fake_internet_running, host_addresses, network_state

pytestmark = pytest.mark.asyncio(loop_scope="module")

PY = "python:3.13"
MiB = 2**20
NOMAD_TOKEN = os.environ.get("HUTCH_NOMAD_TOKEN")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def driver(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NomadDriver]:
    d = await start_nomad(tmp_path_factory.mktemp("nomad-attacker") / "data")
    assert isinstance(d, NomadDriver)
    try:
        yield d
    finally:
        for sid in list(d._sandboxes):
            await d.destroy(sid)
        await d.close()


async def make(driver: NomadDriver, **kw: Any) -> str:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, **kw))
    return sid


async def python(driver: NomadDriver, sid: str, script: str, *args: str, stdin: bytes | None = None,
                 timeout: float = 120) -> Any:
    """Run ``script`` in the sandbox; what it printed last, as JSON."""
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", script, *args], stdin=stdin,
                                           timeout=timeout), sink)
    assert result.exit_code == 0, f"exit {result.exit_code}: {sink.stderr}\n{sink.stdout}"
    return json.loads(sink.stdout.strip().splitlines()[-1])


def nomad_get(addr: str, path: str, token: str | None) -> tuple[int, Any]:
    headers = {"X-Nomad-Token": token} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(addr + path, headers=headers), timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def nomad_put(addr: str, path: str, body: str, token: str | None) -> int:
    headers = {"X-Nomad-Token": token} if token else {}
    try:
        req = urllib.request.Request(addr + path, data=body.encode(), method="PUT", headers=headers)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code


def nomad_delete(addr: str, path: str, token: str | None) -> None:
    headers = {"X-Nomad-Token": token} if token else {}
    with contextlib.suppress(urllib.error.URLError):
        urllib.request.urlopen(urllib.request.Request(addr + path, method="DELETE", headers=headers), timeout=10)


# ------------------------------------------------------------------------ Nomad's own things

# What a sandbox finds of Nomad's: its dirs, any unix socket or identity token on the whole
# file system, NOMAD_* in its own and its init's environment; through every socket found, the
# jobs list and a raw_exec job submission (the root on the host), with a made-up token.
NOMAD_PROBE = r'''
import http.client, json, os, socket, stat, sys
job_id = sys.argv[1]
out = {"dirs": [p for p in ("/secrets", "/alloc", "/local") if os.path.exists(p)],
       "sockets": [], "tokens": [], "env": [], "api": {}}
for dirpath, dirnames, filenames in os.walk("/"):
    if dirpath in ("/proc", "/sys"):
        dirnames[:] = []
        continue
    for name in filenames + dirnames:
        path = os.path.join(dirpath, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode):
            out["sockets"].append(path)
        if name in ("nomad_token", "api.sock") or name.endswith(".jwt"):
            out["tokens"].append(path)
for source in ("/proc/self/environ", "/proc/1/environ"):
    try:
        env = open(source, "rb").read().split(b"\0")
    except OSError:
        continue
    out["env"] += sorted({e.split(b"=")[0].decode() for e in env if e.startswith((b"NOMAD_", b"VAULT_", b"CONSUL_"))})

class Unix(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=5)
        self.unix = path
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(5)
        self.sock.connect(self.unix)

job = {"Job": {"ID": job_id, "Name": job_id, "Type": "batch", "Datacenters": ["*"], "TaskGroups": [{
    "Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}}
for path in sorted(set(out["sockets"] + ["/secrets/api.sock"])):
    answers = {}
    for method, route, body in (("GET", "/v1/jobs", None), ("PUT", "/v1/jobs", json.dumps(job))):
        try:
            conn = Unix(path)
            conn.request(method, route, body=body, headers={"X-Nomad-Token": "anything"})
            answers[method] = conn.getresponse().status
        except OSError as err:
            answers[method] = type(err).__name__
    out["api"][path] = answers
print(json.dumps(out))
'''


async def test_nothing_of_nomads_is_in_a_sandbox_and_no_job_can_be_submitted(driver: NomadDriver) -> None:
    found: dict[str, Any] = {}
    for network in (False, True):
        sid = await make(driver, network_enabled=network)
        job_id = f"hutch-attacker-{uuid.uuid4().hex[:8]}"
        seen = await python(driver, sid, NOMAD_PROBE, job_id)
        status, _ = await asyncio.to_thread(nomad_get, NOMAD_ADDR, f"/v1/job/{job_id}", NOMAD_TOKEN)
        if status == 200:  # the attack worked: take its job away again
            await asyncio.to_thread(nomad_delete, NOMAD_ADDR, f"/v1/job/{job_id}?purge=true", NOMAD_TOKEN)
        mode = "network" if network else "no network"
        found[mode] = {"dirs": seen["dirs"], "sockets": seen["sockets"], "tokens": seen["tokens"],
                       "env": seen["env"], "api": {p: a for p, a in seen["api"].items()
                                                   if any(isinstance(v, int) for v in a.values())},
                       "job registered": status == 200}
        if network:  # Nomad's HTTP and RPC ports on every address of the host: not open
            targets = [(a, p) for a in [*host_addresses(), "172.26.64.1"] for p in (4646, 4647, 4656)]
            argv = ["python3", "-c", connect_probe.SCRIPT, *(f"{h}:{p}" for h, p in targets)]
            sink = Recorder()
            await driver.exec(ExecRequest(new_id("ex"), sid, argv, timeout=60), sink)
            found[mode]["nomad ports open"] = [t for t, v in json.loads(sink.stdout).items() if v.startswith("open")]
        await driver.destroy(sid)
    clean = {"dirs": [], "sockets": [], "tokens": [], "env": [], "api": {}, "job registered": False}
    assert found == {"no network": clean, "network": {**clean, "nomad ports open": []}}, json.dumps(found, indent=1)


async def test_nomad_answers_no_one_without_a_token_and_runs_no_raw_exec() -> None:
    """The dev agent and the cluster: ACLs on (an anonymous read and a job submission are
    refused), hutch's own token reads, and no client offers raw_exec."""
    profiles = [("dev agent", NOMAD_ADDR, NOMAD_TOKEN)]
    cluster = os.environ.get("HUTCH_TEST_CLUSTER_ADDR")
    if not cluster:
        pytest.fail("HUTCH_TEST_CLUSTER_ADDR is not set: start the cluster with ./scripts/services start cluster",
                    pytrace=False)
    profiles.append(("cluster", cluster, os.environ.get("HUTCH_TEST_CLUSTER_TOKEN")))
    found = {}
    for name, addr, token in profiles:
        anonymous, _ = await asyncio.to_thread(nomad_get, addr, "/v1/jobs", None)
        job = json.dumps({"Job": {"ID": "hutch-anonymous", "Type": "batch", "Datacenters": ["*"], "TaskGroups": [
            {"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}})
        submitted = await asyncio.to_thread(nomad_put, addr, "/v1/jobs", job, None)
        if submitted == 200:
            await asyncio.to_thread(nomad_delete, addr, "/v1/job/hutch-anonymous?purge=true", token)
        status, nodes = await asyncio.to_thread(nomad_get, addr, "/v1/nodes", token)
        raw_exec = [n["Name"] for n in nodes if (n.get("Drivers") or {}).get("raw_exec", {}).get("Detected")] \
            if status == 200 else f"nodes unreadable with hutch's token: {status} {nodes}"
        found[name] = {"anonymous read": anonymous, "anonymous submit": submitted, "raw_exec on": raw_exec}
    assert found == {name: {"anonymous read": 403, "anonymous submit": 403, "raw_exec on": []}
                     for name, _, _ in profiles}, json.dumps(found, indent=1)


# ------------------------------------------------------------------------ disk

# dd into every writable directory a sandbox can find (the usual ones and every mount point),
# up to ``want`` bytes each, deleting each file before the next: what each one took.
FILL = r'''
import errno, json, os, sys
want = int(sys.argv[1])
dirs = {"/tmp", "/var/tmp", "/dev/shm", "/run", "/run/lock", "/home/agentuity", "/alloc", "/alloc/data",
        "/alloc/tmp", "/alloc/logs", "/local", "/secrets", "/dev/mqueue"}
for line in open("/proc/self/mountinfo"):
    dirs.add(line.split()[4])
taken = {}
block = b"\xa5" * (1 << 20)
for d in sorted(dirs):
    if d.startswith(("/proc", "/sys")) or not os.path.isdir(d) or not os.access(d, os.W_OK):
        continue
    path, n, why = os.path.join(d, ".hutch-fill"), 0, None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while n < want:
                n += os.write(fd, block)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        why = errno.errorcode.get(err.errno, str(err.errno))
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    taken[d] = [n, why]
print(json.dumps(taken))
'''


async def test_every_writable_path_counts_against_the_disk_limit(driver: NomadDriver) -> None:
    limit = 200 * MiB
    sid = await make(driver, resources=ResourceLimits(disk_bytes=limit))
    taken = await python(driver, sid, FILL, str(300 * MiB), timeout=300)
    await driver.destroy(sid)
    over = {d: t for d, t in taken.items() if t[0] > limit}
    nomads = {d: t for d, t in taken.items() if d.startswith(("/alloc", "/local", "/secrets"))}
    assert "/home/agentuity" in taken and "/tmp" in taken, taken  # the probe found the usual places
    assert not over and not nomads, f"past the {limit // MiB} MiB limit: {over}; Nomad's dirs: {nomads}"
    # The workspace and the root file system share the limit: each stopped at a full disk.
    assert all(taken[d][1] == "ENOSPC" for d in ("/home/agentuity", "/tmp", "/var/tmp")), taken


# ------------------------------------------------------------------------ IPv6 (and IPv4)

@pytest_asyncio.fixture(loop_scope="module")
async def dual_stack_server() -> AsyncIterator[int]:
    """A service of the host on [::] that takes IPv4 too: every address of both families."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::", 0))

    async def answer(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.0 200 OK\r\n\r\nhost service\n")
        await w.drain()
        w.close()

    server = await asyncio.start_server(answer, sock=sock)
    try:
        yield sock.getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def host_ipv6() -> list[str]:
    """The host's IPv6 addresses as a sandbox would name them: link-local ones scoped to the
    sandbox's own eth0 (they are reached over its link, the bridge), the rest as they are."""
    out = subprocess.run(["ip", "-6", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    addrs = []
    for line in out.splitlines():
        addr = line.split()[3].split("/")[0]
        if addr == "::1":
            continue
        addrs.append(f"{addr}%eth0" if addr.startswith("fe80:") else addr)
    return addrs


async def test_ipv6_reaches_nothing_of_the_host_as_ipv4_does_not(driver: NomadDriver, dual_stack_server: int) -> None:
    sandboxes = {"network": await make(driver, network_enabled=True),
                 "allow-list": await make(driver, network_enabled=True, network_allow=("198.51.100.7/32",)),
                 "port only": await make(driver, port=8000)}
    v6 = host_ipv6()  # after the creates: the nomad bridge and its link-local address exist now
    assert any(a.startswith("fe80:") for a in v6), v6
    targets = [(a, dual_stack_server) for a in [*v6, *host_addresses(), "172.26.64.1"]]
    # The service is up on both families: the host reaches it on each of these addresses.
    for host, port in targets:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        info = socket.getaddrinfo(host.replace("%eth0", "%nomad") if host.startswith("fe80:") else host, port,
                                  family)[0][4]
        with contextlib.suppress(OSError), socket.socket(family) as s:  # a link-local of eth0 is not on the bridge
            s.settimeout(2)
            s.connect(info)
    opened = {}
    for mode, sid in sandboxes.items():
        argv = ["python3", "-c", connect_probe.SCRIPT, *(f"{h}:{p}" for h, p in targets)]
        sink = Recorder()
        result = await driver.exec(ExecRequest(new_id("ex"), sid, argv, timeout=60), sink)
        assert result.exit_code == 0, sink.stderr
        opened[mode] = sorted(t for t, v in json.loads(sink.stdout).items() if v.startswith("open"))
    for sid in sandboxes.values():
        await driver.destroy(sid)
    assert opened == {mode: [] for mode in sandboxes}, f"{json.dumps(opened, indent=1)}\n{v6}"


# ------------------------------------------------------------------------ private ranges, the local driver

PRIVATE_HOST, PRIVATE_SERVER = "172.31.254.1", "172.31.254.2"  # RFC 1918, on no other network here


@contextlib.contextmanager
def private_server() -> Iterator[tuple[str, int]]:
    """An HTTP server at a private address, routed from the host (a LAN service)."""
    for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("hutch-priv-"):  # left by a killed run
            subprocess.run(["ip", "netns", "del", line.split()[0]], capture_output=True)
    tag = uuid.uuid4().hex[:6]
    ns, veth = f"hutch-priv-{tag}", f"tpriv{tag}"
    server = None

    def sh(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True)

    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "addr", "add", f"{PRIVATE_HOST}/29", "dev", veth)
        sh("ip", "link", "set", veth, "up")
        for cmd in (["ip", "addr", "add", f"{PRIVATE_SERVER}/29", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                    ["ip", "link", "set", "lo", "up"], ["ip", "route", "add", "default", "via", PRIVATE_HOST]):
            sh("ip", "netns", "exec", ns, *cmd)
        server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", "8080",
                                   "--bind", "0.0.0.0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((PRIVATE_SERVER, 8080), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the private server never came up"
                time.sleep(0.05)
        yield PRIVATE_SERVER, 8080
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# One DNS query (for "hutch.invalid", type A) to each name server of the sandbox's resolv.conf, over
# UDP: whether an answer came back.
DNS_PROBE = r'''
import json, os, socket, struct
servers = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")]
query = struct.pack(">HHHHHH", os.getpid() & 0xffff, 0x0100, 1, 0, 0, 0) + b"\x05hutch\x07invalid\x00" + b"\x00\x01\x00\x01"
out = {}
for server in servers:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    try:
        s.sendto(query, (server, 53))
        out[server] = len(s.recvfrom(512)[0]) > 12
    except OSError as err:
        out[server] = type(err).__name__
print(json.dumps(out))
'''


async def test_private_ranges_and_the_local_drivers_sandboxes_are_out_of_reach(
    driver: NomadDriver, request: pytest.FixtureRequest
) -> None:
    local = await start_local(request)
    try:
        served = new_id()
        await local.provision(ProvisionRequest(sandbox_id=served, runtime=PY, port=8000))
        await local.exec(ExecRequest(new_id("ex"), served, ["sh", "-c", "python3 -m http.server 8000 >/dev/null 2>&1 &"]),
                         Recorder())
        local_target = await local.port_target(served)
        for _ in range(100):  # it serves: the host reaches it
            with contextlib.suppress(OSError):
                socket.create_connection(local_target, 1).close()
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the local sandbox never served on {local_target}")
        with private_server() as lan, fake_internet_running() as internet:
            sandboxes = {"network": await make(driver, network_enabled=True),
                         # a list narrows, never widens: naming them does not open them
                         "allow-list": await make(driver, network_enabled=True, network_allow=(
                             f"{lan[0]}/32", f"{local_target[0]}/32", f"{internet[0]}/32"))}
            seen, dns = {}, {}
            for mode, sid in sandboxes.items():
                argv = ["python3", "-c", connect_probe.SCRIPT, *(f"{h}:{p}" for h, p in (lan, local_target, internet))]
                sink = Recorder()
                await driver.exec(ExecRequest(new_id("ex"), sid, argv, timeout=60), sink)
                seen[mode] = json.loads(sink.stdout)
                dns[mode] = await python(driver, sid, DNS_PROBE)
                await driver.destroy(sid)
    finally:
        await stop_local(local)
    inet, lan_t, local_t = f"{internet[0]}:{internet[1]}", f"{lan[0]}:{lan[1]}", f"{local_target[0]}:{local_target[1]}"
    for mode, results in seen.items():
        assert results[inet].startswith("open"), f"{mode}: the internet is unreachable: {results}\n{network_state()}"
        assert not results[lan_t].startswith("open"), f"{mode}: a private address answered: {results}"
        assert not results[local_t].startswith("open"), f"{mode}: a local-driver sandbox answered: {results}"
        assert dns[mode] and all(v is True for v in dns[mode].values()), f"{mode}: DNS failed: {dns[mode]}"


# ------------------------------------------------------------------------ the task's log

# 50 MiB into the task's stdout: through init's fd 1, or (init not being dumpable) the fd 1 of
# init's children, which share it.
FLOOD = r'''
import os
pids = ["1"] + [p for p in os.listdir("/proc") if p.isdigit() and p != "1"
                and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == "1"]
for pid in pids:
    try:
        fd = os.open(f"/proc/{pid}/fd/1", os.O_WRONLY)
        break
    except OSError:
        continue
else:
    raise SystemExit(f"no way into the task's stdout through {pids}")
for _ in range(50):
    os.write(fd, b"x" * (1 << 20))
print("wrote 50 MiB through", pid)
'''


def alloc_files(alloc: str) -> dict[str, int]:
    """The files of an allocation's dir on the dev agent's client, and their sizes."""
    dirs = glob.glob(f"/tmp/NomadClient*/{alloc}")
    assert dirs, f"no alloc dir of {alloc} on this host"
    return {str(p): p.stat().st_size for d in dirs for p in Path(d).rglob("*") if p.is_file()}


async def test_the_task_log_on_the_host_stays_bounded(driver: NomadDriver) -> None:
    sid = await make(driver)
    alloc = driver.running(sid).alloc_id
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", FLOOD], timeout=120), sink)
    await asyncio.sleep(1)  # what the shim still copies
    sizes = await asyncio.to_thread(alloc_files, alloc)
    await driver.destroy(sid)
    big = {p: s for p, s in sizes.items() if s > 2 * MiB}
    assert not big and sum(sizes.values()) < 4 * MiB, (result, sink.stdout, sink.stderr, big)


# ------------------------------------------------------------------------ the exec agent

# Another command's stdin, read from the exec agent's memory: its pid (given), its maps, its
# mem; then PTRACE_ATTACH. What each step gave.
AGENT_PROBE = r'''
import ctypes, errno, json, re, sys
pid, secret = int(sys.argv[1]), sys.argv[2].encode()
out = {}
try:
    regions = [tuple(int(x, 16) for x in l.split()[0].split("-")) for l in open(f"/proc/{pid}/maps")
               if l.split()[1].startswith("rw")]
    out["maps"] = len(regions)
except OSError as err:
    regions, out["maps"] = [], errno.errorcode[err.errno]
try:
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        found, read = False, 0
        for start, end in regions or [(0x400000, 0x401000)]:
            try:
                mem.seek(start)
                data = mem.read(min(end - start, 64 << 20))
            except OSError:
                continue
            read += len(data)
            found = found or secret in data
        out["mem"] = {"read": read, "secret found": found}
except OSError as err:
    out["mem"] = errno.errorcode[err.errno]
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
if libc.ptrace(PTRACE_ATTACH, pid, None, None) == 0:
    out["ptrace"] = "attached"
    import os
    os.waitpid(pid, 0)
    libc.ptrace(PTRACE_DETACH, pid, None, None)
else:
    out["ptrace"] = errno.errorcode[ctypes.get_errno()]
print(json.dumps(out))
'''


async def test_the_exec_agent_cannot_be_read_or_traced_by_the_sandbox(driver: NomadDriver) -> None:
    from tests.nomad.test_exec_agent import until_agent

    sid = await make(driver)
    agent = await until_agent(driver, sid)
    secret = f"hutch-secret-{uuid.uuid4().hex}"
    sink = Recorder()  # a command whose stdin is a secret, through the agent
    await driver.exec(ExecRequest(new_id("ex"), sid, ["sh", "-c", "cat >/dev/null"], stdin=secret.encode() * 64), sink)
    seen = await python(driver, sid, AGENT_PROBE, str(agent.pid), secret)
    assert driver._agents.live(sid) is agent, "the agent was restarted: the probe hit another one"
    await driver.destroy(sid)
    assert seen["maps"] in ("EACCES", "EPERM") and seen["mem"] in ("EACCES", "EPERM") and seen["ptrace"] == "EPERM", seen


# ------------------------------------------------------------------------ memory, CPU, /dev/shm

def cgroup_value(controller: str, container: str, name: str) -> int:
    return int(Path(f"/sys/fs/cgroup/{controller}/nomad/{container}/{name}").read_text())


def container_of(alloc: str) -> str:
    """The containerd container of an allocation of the dev agent."""
    ids = subprocess.run(["ctr", "--address", "/run/hutch-containerd/containerd.sock", "--namespace", "nomad",
                          "containers", "ls", "-q"], capture_output=True, text=True, check=True).stdout.split()
    return next(i for i in ids if i.endswith(alloc))


SHM_AND_HEAP = r'''
import json, os, sys, errno
what = sys.argv[1]
if what == "heap":
    chunks = []
    for _ in range(512):
        chunks.append(bytearray(1 << 20))
    print(json.dumps({"allocated": len(chunks)}))
else:
    n, why = 0, None
    fd = os.open("/dev/shm/fill", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while n < (512 << 20):
            n += os.write(fd, b"\xa5" * (1 << 20))
    except OSError as err:
        why = errno.errorcode[err.errno]
    st = os.statvfs("/dev/shm")
    print(json.dumps({"written": n, "why": why, "size": st.f_blocks * st.f_frsize}))
'''


async def test_memory_cpu_and_shm_limits_are_real_and_never_unlimited(driver: NomadDriver) -> None:
    sized = await make(driver, resources=ResourceLimits(memory_bytes=128 * MiB, cpu_millis=500))
    unsized = await make(driver)
    found: dict[str, Any] = {}
    for name, sid in (("sized", sized), ("unsized", unsized)):
        container = await asyncio.to_thread(container_of, driver.running(sid).alloc_id)
        found[name] = {"memory": cgroup_value("memory", container, "memory.limit_in_bytes"),
                       "cpu quota": cgroup_value("cpu", container, "cpu.cfs_quota_us"),
                       "cpu period": cgroup_value("cpu", container, "cpu.cfs_period_us")}
    sink = Recorder()
    heap = await driver.exec(ExecRequest(new_id("ex"), sized, ["python3", "-c", SHM_AND_HEAP, "heap"], timeout=60), sink)
    found["sized"]["512 MiB heap"] = "killed" if heap.exit_code == 137 or heap.oom_killed else sink.stdout.strip()
    sink = Recorder()
    shm = await driver.exec(ExecRequest(new_id("ex"), sized, ["python3", "-c", SHM_AND_HEAP, "shm"], timeout=60), sink)
    found["sized"]["512 MiB in /dev/shm"] = (
        "killed" if shm.exit_code == 137 or shm.oom_killed else json.loads(sink.stdout.strip().splitlines()[-1]))
    shm_unsized = await python(driver, unsized, "import os, json; st = os.statvfs('/dev/shm'); "
                                                "print(json.dumps(st.f_blocks * st.f_frsize))")
    for sid in (sized, unsized):
        await driver.destroy(sid)
    sized_ok = found["sized"]
    assert sized_ok["memory"] == 128 * MiB and sized_ok["cpu quota"] * 1000 // sized_ok["cpu period"] == 500, found
    assert sized_ok["512 MiB heap"] == "killed", found
    in_shm = sized_ok["512 MiB in /dev/shm"]
    assert in_shm == "killed" or (in_shm["written"] <= 128 * MiB and in_shm["size"] <= 128 * MiB), found
    # Nothing asked for: the service's defaults (512Mi, one CPU), never unlimited.
    unsized_ok = found["unsized"]
    assert unsized_ok["memory"] == 512 * MiB and unsized_ok["cpu quota"] == unsized_ok["cpu period"], found
    assert shm_unsized <= 512 * MiB, shm_unsized
