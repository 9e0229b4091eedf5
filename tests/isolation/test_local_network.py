"""Sandbox networking on the local driver, from the attacker's side.

A "fake internet" host is a network namespace the test creates (veth to the host,
203.0.113.0/29) with an HTTP server in it. A sandbox with network reaches it through NAT;
nothing reaches the host's own services (any of its addresses), another sandbox, or
link-local/metadata addresses; a sandbox without network has loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from hutch.drivers.base import ExecRequest, ProvisionRequest, ResourceLimits
from hutch.drivers.local import network
from hutch.drivers.local.driver import UID_BASE, LocalDriver
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    new_id,
)
from tests.isolation import connect_probe

pytestmark = pytest.mark.isolation

PY = "python:3.13"
INET_HOST, INET_SERVER = "203.0.113.1", "203.0.113.2"
INET_SERVER2 = "203.0.113.3"  # the same server under a second address (allow-list tests)
# A /29, not the whole TEST-NET-3 /24: on the machines CI runs on, the package registries
# (deb.debian.org, PyPI, npm, the Go proxy) answer at 203.0.113.80, and a host route for the
# /24 sent every download made meanwhile into this namespace ("No route to host": a runtime
# build on first use failed twice in a row while another suite's fake internet was up).
INET_PREFIX = 29


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture
def fake_internet() -> Iterator[tuple[str, int]]:
    with fake_internet_running() as target:
        yield target


# Every fake internet has the same addresses, so one is up on this host at a time: each
# holds this lock while it is up, and the next waits for it. A fake internet's namespace and
# link are named with these prefixes (no other test's): found while the lock is held, one is
# a leftover of a run that was killed, never another run's live one.
FAKE_INTERNET_LOCK = Path("/run/lock/hutch-fake-internet.lock")
INET_NS_PREFIX, INET_LINK_PREFIX = "hutch-fakenet-", "tfnet"


@contextlib.contextmanager
def fake_internet_running() -> Iterator[tuple[str, int]]:
    """An HTTP server in its own network namespace, routed from the host: "the internet"."""
    with fake_internet_namespace() as (_, target):
        yield target


@contextlib.contextmanager
def fake_internet_namespace(wait: float = 90) -> Iterator[tuple[str, tuple[str, int]]]:
    """fake_internet_running, also naming its namespace (for servers of a test's own in it)."""
    with _fake_internet_lock(wait):
        _remove_leftover_internets()
        _wait_for_foreign_internets(wait)
        tag = uuid.uuid4().hex[:8]
        ns, veth = f"{INET_NS_PREFIX}{tag}", f"{INET_LINK_PREFIX}{tag}"
        sh("ip", "netns", "add", ns)
        server = None
        try:
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "addr", "add", f"{INET_HOST}/{INET_PREFIX}", "dev", veth)
            sh("ip", "link", "set", veth, "up")
            for cmd in (["ip", "addr", "add", f"{INET_SERVER}/{INET_PREFIX}", "dev", "eth0"],
                        ["ip", "addr", "add", f"{INET_SERVER2}/{INET_PREFIX}", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                        ["ip", "link", "set", "lo", "up"], ["ip", "route", "add", "default", "via", INET_HOST]):
                sh("ip", "netns", "exec", ns, *cmd)
            server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", "8080",
                                       "--bind", "0.0.0.0"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            # Ready means reachable from the host's own namespace, the way sandbox traffic goes:
            # a test that starts before the server listens would see "connection refused".
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection((INET_SERVER, 8080), 1).close()
                    break
                except OSError as err:
                    if server.poll() is not None or time.monotonic() > deadline:
                        stderr = server.stderr.read().decode(errors="replace") if server.poll() is not None else ""
                        raise AssertionError(f"the fake internet never served on {INET_SERVER}:8080 ({err}); "
                                             f"server exit {server.poll()}: {stderr}\n{network_state()}") from err
                    time.sleep(0.05)
            yield ns, (INET_SERVER, 8080)
        finally:
            if server is not None:
                server.kill()
                server.wait()
                server.stderr.close()  # type: ignore[union-attr]
            _remove_internet(ns, veth)


_lock_holders = threading.local()


@contextlib.contextmanager
def _fake_internet_lock(wait: float) -> Iterator[None]:
    """Wait (up to ``wait`` s) until no other fake internet is up on this host, and keep others
    waiting while this one is. Two at once in one thread would wait for each other for ever:
    that is a test's mistake, said at once."""
    if getattr(_lock_holders, "held", False):
        raise AssertionError("a fake internet is already up in this thread: they share their addresses")
    FAKE_INTERNET_LOCK.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(FAKE_INTERNET_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"another test's fake internet was up for {wait:.0f} s "
                                         f"({FAKE_INTERNET_LOCK} held): {_internets()}") from None
                time.sleep(0.2)
        _lock_holders.held = True
        try:
            yield
        finally:
            _lock_holders.held = False
    finally:
        os.close(fd)  # releases the lock


def _wait_for_foreign_internets(wait: float) -> None:
    """Another's fake internet holding these addresses under other names (a checkout of before
    the lock, on this host): waited for, never removed. The route to it would win."""
    deadline = time.monotonic() + wait
    while held := subprocess.run(["ip", "-4", "-o", "addr", "show", "to", f"{INET_HOST}/{INET_PREFIX}"],
                                 capture_output=True, text=True).stdout.strip():
        if time.monotonic() > deadline:
            raise AssertionError(f"another fake internet held {INET_HOST}/{INET_PREFIX} for {wait:.0f} s: {held}")
        time.sleep(0.2)


def _internets() -> tuple[list[str], list[str]]:
    """The fake internets' namespaces and host links on this host."""
    namespaces = [line.split()[0] for line in
                  subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
                  if line.startswith(INET_NS_PREFIX)]
    links = [name for name in (line.split(":")[1].strip().split("@")[0] for line in
                               subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines())
             if name.startswith(INET_LINK_PREFIX)]
    return namespaces, links


def _remove_leftover_internets() -> None:
    """An earlier run that was killed leaves its fake internet behind: its route to the same
    prefix would win, and the sandbox would reach a namespace where nothing listens (or its
    server, still running there). Called with the lock held: every one found is a leftover."""
    namespaces, links = _internets()
    for ns in namespaces:
        _remove_internet(ns, None)
    for link in links:
        subprocess.run(["ip", "link", "del", link], capture_output=True)


def _remove_internet(ns: str, veth: str | None) -> None:
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:  # a killed run's server still serving in it
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    if veth is not None:
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_fake_internet_removes_its_own_leftovers_and_nothing_else() -> None:
    """Another run's (or another test's) namespaces and links stay, whatever their names; a
    fake internet's left by a killed run (its lock released) goes."""
    tag = uuid.uuid4().hex[:6]
    others = (f"hutch-inet-{tag}", f"tinet{tag}")  # the names every fake internet had before
    leftover = (f"{INET_NS_PREFIX}{tag}", f"{INET_LINK_PREFIX}{tag}")
    for ns, link in (others, leftover):
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
    try:
        with fake_internet_running():
            namespaces, links = _internets()  # its own only
            assert len(namespaces) == len(links) == 1 and leftover[0] not in namespaces, (namespaces, links)
            assert network.link_exists(others[1])
            assert others[0] in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        after = _internets()  # another test's may be up already: not this one's
        assert namespaces[0] not in after[0] and links[0] not in after[1], after
    finally:
        for ns, link in (others, leftover):
            _remove_internet(ns, link)


def network_state() -> str:
    """What the host's routing and firewall looked like: for failure messages."""
    out = []
    for cmd in (["ip", "-4", "route"], ["ip", "-4", "-o", "addr"], ["iptables-save"], ["sysctl", "net.ipv4.ip_forward"]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        out.append(f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}")
    return "\n".join(out)


@pytest.fixture
async def host_server() -> AsyncIterator[int]:
    """A service of the host itself, on every host address."""
    server = await asyncio.start_server(lambda r, w: w.close(), "0.0.0.0", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


async def make(driver: LocalDriver, *, network_enabled: bool = False, port: int | None = None) -> str:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, network_enabled=network_enabled, port=port))
    return sid


async def probe(driver: LocalDriver, sid: str, targets: list[tuple[str, int]]) -> dict[str, str]:
    argv = ["python3", "-c", connect_probe.SCRIPT, *(f"{h}:{p}" for h, p in targets)]
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, argv, timeout=60), sink)
    assert result.exit_code == 0, sink.stderr
    return json.loads(sink.stdout)


def host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


async def test_network_reaches_the_internet_but_not_the_host_or_other_sandboxes(
    driver: LocalDriver, fake_internet: tuple[str, int], host_server: int
) -> None:
    served = await make(driver, port=8000)  # another sandbox, serving on its port
    await driver.exec(ExecRequest(new_id("ex"), served, ["sh", "-c", "python3 -m http.server 8000 >/dev/null 2>&1 &"]), Recorder())
    other_ip, other_port = await driver.port_target(served)
    sid = await make(driver, network_enabled=True)
    try:
        inet = f"{fake_internet[0]}:{fake_internet[1]}"
        forbidden = [(a, host_server) for a in host_addresses()] + [
            (INET_HOST, host_server), (str(network.GATEWAY), host_server), ("169.254.169.254", 80),
            (other_ip, other_port), ("127.0.0.1", host_server)]
        seen = await probe(driver, sid, [fake_internet, *forbidden])
        assert seen[inet].startswith("open HTTP/1."), f"{seen}\n{network_state()}"
        for host, port in forbidden:
            assert not seen[f"{host}:{port}"].startswith("open"), (host, port, seen)
        # Without network: loopback only, nothing reachable.
        plain = await make(driver)
        seen = await probe(driver, plain, [fake_internet, (INET_HOST, host_server), (other_ip, other_port)])
        assert not any(v.startswith("open") for v in seen.values()), seen
        # A port without network: the server reaches it, it reaches nothing.
        seen = await probe(driver, served, [fake_internet, (INET_HOST, host_server)])
        assert not any(v.startswith("open") for v in seen.values()), seen
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://{other_ip}:{other_port}/", timeout=5).read())
        assert b"Directory listing" in body
        sink = Recorder()
        await driver.exec(ExecRequest(new_id("ex"), sid, ["sh", "-c", "cat /etc/resolv.conf; ip -6 addr 2>/dev/null | grep -c inet6 || true"]), sink)
        assert "nameserver" in sink.stdout
    finally:
        for s in (sid, served):
            await driver.destroy(s)


async def test_destroy_and_restore_keep_the_network_right(driver: LocalDriver, fake_internet: tuple[str, int]) -> None:
    sid = await make(driver, network_enabled=True)
    sb = driver._registry.running(sid)
    veth = network.host_veth(sb.uid - UID_BASE, True)
    assert veth in {n for _, n in socket.if_nameindex()}
    await driver.checkpoint(sid, "ckpt_net")
    await driver.restore(sid, "ckpt_net")
    seen = await probe(driver, sid, [fake_internet])
    assert next(iter(seen.values())).startswith("open"), f"{seen}\n{network_state()}"
    await driver.destroy(sid)
    for _ in range(100):
        if veth not in {n for _, n in socket.if_nameindex()}:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"{veth} outlived its sandbox")


async def test_a_restore_keeps_the_rules_and_limits_in_force_not_those_of_the_checkpoint(
        driver: LocalDriver, fake_internet: tuple[str, int]) -> None:
    """A checkpoint restore starts the sandbox's init again: it runs under the rules an update
    put in force after the checkpoint (network off here), and in the cgroup with its limits."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, network_enabled=True,
                                            resources=ResourceLimits(memory_bytes=96 * 2**20)))
    try:
        await driver.checkpoint(sid, "ckpt_on")  # taken while its network is on
        assert next(iter((await probe(driver, sid, [fake_internet])).values())).startswith("open")
        await driver.update_network(sid, enabled=False, allow=(), deny=())
        await driver.restore(sid, "ckpt_on")
        seen = await probe(driver, sid, [fake_internet])
        assert not next(iter(seen.values())).startswith("open"), f"{seen}\n{network_state()}"
        memory = next(p for p in driver._cgroups.paths(sid) if "memory" in p.parts)
        assert int((memory / "memory.limit_in_bytes").read_text()) == 96 * 2**20
    finally:
        await driver.destroy(sid)


@contextlib.contextmanager
def hosts_entry(name: str, address: str) -> Iterator[Callable[[str], None]]:
    """``name`` resolving to ``address`` through /etc/hosts (what the server's resolver
    reads); yields a function that points it elsewhere."""
    hosts = Path("/etc/hosts")
    saved = hosts.read_text()

    def point(to: str) -> None:
        hosts.write_text(f"{saved.rstrip()}\n{to} {name}\n")

    point(address)
    try:
        yield point
    finally:
        hosts.write_text(saved)


async def test_an_allow_list_limits_the_network_and_follows_its_names(
    driver: LocalDriver, fake_internet: tuple[str, int], host_server: int
) -> None:
    port = fake_internet[1]
    name = f"allowed-{uuid.uuid4().hex[:8]}.hutch.test"
    # A warm pool of this runtime is ready: its sandboxes have no allow-list, so a limited
    # create must not be handed one of them.
    await driver.destroy(await make(driver))
    for _ in range(200):
        if driver._pool.idle.get(PY):
            break
        await asyncio.sleep(0.1)
    assert driver._pool.idle.get(PY) or driver._pool.size == 0
    chains_before = await _allow_chains()  # another test's or server's may be there: not this one's
    with hosts_entry(name, INET_SERVER) as point:
        sid = new_id()
        # Listing the host's own address or the metadata service does not open them: a list narrows.
        await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, network_enabled=True,
                                                network_allow=(name, f"{INET_HOST}/32", "169.254.169.254/32")))
        try:
            targets = [(INET_SERVER, port), (INET_SERVER2, port), (INET_HOST, host_server), ("169.254.169.254", 80)]
            seen = await probe(driver, sid, targets)
            assert seen[f"{INET_SERVER}:{port}"].startswith("open HTTP/1."), f"{seen}\n{network_state()}"
            assert seen[f"{INET_SERVER2}:{port}"] == "ConnectionRefusedError", seen  # refused at connect
            assert not seen[f"{INET_HOST}:{host_server}"].startswith("open"), seen
            assert not seen["169.254.169.254:80"].startswith("open"), seen
            # The name now points elsewhere: the next refresh follows it.
            point(INET_SERVER2)
            await driver._network.allow.refresh()
            seen = await probe(driver, sid, targets[:2])
            assert seen[f"{INET_SERVER2}:{port}"].startswith("open HTTP/1."), seen
            assert seen[f"{INET_SERVER}:{port}"] == "ConnectionRefusedError", seen
            # A restarted server's firewall set-up keeps the list in force.
            network._firewall_ready = False
            network.ensure_firewall()
            seen = await probe(driver, sid, targets[:2])
            assert seen[f"{INET_SERVER}:{port}"] == "ConnectionRefusedError", f"{seen}\n{network_state()}"
        finally:
            await driver.destroy(sid)
    assert await _allow_chains() == chains_before  # destroy removed its chain


async def test_a_filesystem_only_pause_keeps_the_allow_list_and_its_resume_follows_its_names(
    driver: LocalDriver, fake_internet: tuple[str, int]
) -> None:
    """Paused filesystem-only, the sandbox has no network namespace; its resume makes its veth
    and rules again, with what its names resolve to by then (a refresh while it was paused)."""
    port = fake_internet[1]
    name = f"allowed-{uuid.uuid4().hex[:8]}.hutch.test"
    with hosts_entry(name, INET_SERVER) as point:
        sid = new_id()
        await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, network_enabled=True,
                                                network_allow=(name,)))
        try:
            targets = [(INET_SERVER, port), (INET_SERVER2, port)]
            await driver.pause(sid, memory=False)
            point(INET_SERVER2)
            await driver._network.allow.refresh()  # while it is paused
            await driver.resume(sid)
            seen = await probe(driver, sid, targets)
            assert seen[f"{INET_SERVER2}:{port}"].startswith("open HTTP/1."), f"{seen}\n{network_state()}"
            assert seen[f"{INET_SERVER}:{port}"] == "ConnectionRefusedError", seen
        finally:
            await driver.destroy(sid)


async def _allow_chains() -> set[str]:
    """The per-sandbox allow-list chains on this host (HUTCH-A<index>)."""
    rules = await asyncio.to_thread(subprocess.run, ["iptables", "-S"], capture_output=True, text=True, check=True)
    return {line.split()[1] for line in rules.stdout.splitlines()
            if line.startswith("-N HUTCH-A") and line.split()[1] != "HUTCH-ALLOW"}
