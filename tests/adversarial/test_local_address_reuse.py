"""A destroyed sandbox's flows do not pass to the next sandbox given its address (local driver).

A sandbox's address is its uid's index (network.address), and the index of a destroyed
sandbox is handed out again. The kernel's connection tracking outlives the sandbox: an
entry of one of its flows (a UDP exchange, a TCP connection it never closed: 5 days) stays
until it times out. The firewall lets established flows through (HUTCH-FWD accepts replies
into any sandbox veth; a sandbox's own chain lets its established flows skip its lists), so
the next sandbox at that address could, spoofing the old flow's ports, receive the old
one's replies and send on its flow past its own allow- or deny-list. The attacker here
binds the old flow's port and listens, then sends on it.

"The internet" is tests/isolation's fake one, with a UDP server of this test in it that,
once greeted, sends to the greeting's source 20 times a second, and logs what it receives.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from hutch.core.errors import DriverFailure
from hutch.drivers.base import ExecRequest, ProvisionRequest
from hutch.drivers.local import conntrack, network, uids
from hutch.drivers.local.driver import UID_BASE, LocalDriver
from hutch.drivers.local.smallfiles import put
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    local_driver_fixture,
    new_id,
)
from tests.isolation.test_local_network import INET_SERVER, INET_SERVER2, fake_internet_namespace

pytestmark = pytest.mark.isolation

PY = "python:3.13"
UDP_PORT, FLOW_PORT = 9999, 40123

PUSHER = r"""
import socket, sys, threading, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[2])))
log = open(sys.argv[1], "a", buffering=1)
log.write("listening\n")
def push(peer):
    for n in range(1800):
        try:
            s.sendto(b"reply %d to the first tenant" % n, peer)
        except OSError:
            pass
        time.sleep(0.05)
peers = set()
while True:
    data, peer = s.recvfrom(2048)
    log.write("%s from %s:%d\n" % (data.decode(errors="replace"), peer[0], peer[1]))
    if data.startswith(b"hello") and peer not in peers:
        peers.add(peer)
        threading.Thread(target=push, args=(peer,), daemon=True).start()
"""

# The first tenant: greets the server from FLOW_PORT and waits for its first reply.
OPEN_FLOW = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[2])))
s.settimeout(5)
s.sendto(b"hello from the first tenant", (sys.argv[1], int(sys.argv[3])))
print(s.recv(100).decode())
"""

# The next tenant at that address: listens on the old flow's port, sends on it, and (the
# control) sends from another port.
REUSE_FLOW = r"""
import json, socket, sys, time
host, port, server = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", port))
s.settimeout(2)
try:
    got = s.recv(100).decode()
except OSError as err:
    got = type(err).__name__
for _ in range(5):
    s.sendto(b"spoofed on the old flow", (host, server))
    time.sleep(0.05)
other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
other.bind(("0.0.0.0", port + 1))
other.sendto(b"a new flow of the next tenant", (host, server))
print(json.dumps(got))
"""


@pytest.fixture
def internet() -> Iterator[tuple[str, Path]]:
    """The fake internet with the UDP server in it: (its namespace, the server's log)."""
    with fake_internet_namespace() as (ns, _):
        log = Path(f"/tmp/{ns}-udp.log")
        log.write_text("")
        server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", PUSHER, str(log), str(UDP_PORT)])
        try:
            deadline = time.monotonic() + 30
            while "listening" not in log.read_text():
                assert server.poll() is None and time.monotonic() < deadline, f"the UDP server never listened: {server.poll()}"
                time.sleep(0.05)
            yield ns, log
        finally:
            server.kill()
            server.wait()
            log.unlink(missing_ok=True)


@pytest.fixture
async def driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalDriver]:
    monkeypatch.setenv("HUTCH_WARM_POOL", "0")  # no pooled sandbox takes the index this test frees
    async for d in local_driver_fixture(request):
        assert isinstance(d, LocalDriver)
        yield d


async def at_index(driver: LocalDriver, index: int, **net: object) -> str:
    """A sandbox given the address of index ``index`` (freed just before): the uid registry's
    round robin pointed at it. Another server on this host may take it meanwhile: tried again."""
    for _ in range(8):
        await asyncio.to_thread(_next_uid_index, index)
        sid = new_id()
        await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, **net))  # type: ignore[arg-type]
        if driver._registry.running(sid).uid - UID_BASE == index:
            return sid
        await driver.destroy(sid)
    raise AssertionError(f"index {index} was never handed out again")


def _next_uid_index(index: int) -> None:
    with open(uids.UID_REGISTRY / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        put(uids.UID_REGISTRY / ".next", str(index).encode())


def _make_entry(address: str) -> subprocess.CompletedProcess[str]:
    """A UDP entry from ``address`` to the fake internet's server, as a flow would leave one."""
    return subprocess.run(["conntrack", "-I", "-p", "udp", "--src", address, "--dst", INET_SERVER, "--sport",
                           str(FLOW_PORT), "--dport", str(UDP_PORT), "--timeout", "120", "--reply-src",
                           INET_SERVER, "--reply-dst", address, "--reply-port-src", str(UDP_PORT),
                           "--reply-port-dst", str(FLOW_PORT)], capture_output=True, text=True)


def udp_entries() -> str:
    return subprocess.run(["conntrack", "-L", "-p", "udp"], capture_output=True, text=True).stdout


def tracked(address: str) -> list[str]:
    """The host's conntrack entries with ``address`` at either end."""
    out = []
    for side in ("--orig-src", "--orig-dst", "--reply-src", "--reply-dst"):
        done = subprocess.run(["conntrack", "-L", side, address], capture_output=True, text=True)
        out += done.stdout.splitlines()
    return sorted(set(out))


@pytest.mark.parametrize("rules", [
    {"network_enabled": True, "network_allow": (f"{INET_SERVER2}/32",)},
    {"network_enabled": True, "network_deny": (f"{INET_SERVER}/32",)},
    {"port": 8000},  # a port, no network: it sends nothing; may it receive?
], ids=["allow-list", "deny-list", "port-only"])
async def test_the_next_sandbox_at_an_address_gets_nothing_of_the_last_ones_flows(
        driver: LocalDriver, internet: tuple[str, Path], rules: dict[str, object]) -> None:
    _, log = internet
    first = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=first, runtime=PY, network_enabled=True,
                                            network_allow=(f"{INET_SERVER}/32",)))
    index = driver._registry.running(first).uid - UID_BASE
    address = str(network.address(index))
    try:
        sink = Recorder()
        await driver.exec(ExecRequest(new_id("ex"), first, ["python3", "-c", OPEN_FLOW, INET_SERVER, str(FLOW_PORT),
                                                            str(UDP_PORT)], timeout=30), sink)
        assert sink.stdout.startswith("reply 0 to the first tenant"), (
            sink.stdout, sink.stderr, log.read_text(), await asyncio.to_thread(udp_entries))
    finally:
        await driver.destroy(first)
    left = await asyncio.to_thread(tracked, address)  # the server's replies still come, to the old flow
    second = await at_index(driver, index, **rules)
    try:
        sink = Recorder()
        await driver.exec(ExecRequest(new_id("ex"), second, ["python3", "-c", REUSE_FLOW, INET_SERVER, str(FLOW_PORT),
                                                             str(UDP_PORT)], timeout=30), sink)
        assert sink.stderr == "", sink.stderr
        received = json.loads(sink.stdout)
        await asyncio.sleep(0.5)
        seen = log.read_text()
        # The control: the next sandbox's own rules are in force (a new flow to INET_SERVER is refused).
        assert "a new flow of the next tenant" not in seen, seen
        holes = []
        if received != "TimeoutError":
            holes.append(f"the next sandbox at {address} received the last one's flow: {received!r}")
        if "spoofed on the old flow" in seen:
            holes.append(f"the next sandbox at {address} sent on the last one's flow:\n{seen}")
        if left:
            holes.append(f"conntrack entries of {address} outlived its sandbox:\n" + "\n".join(left))
        assert not holes, "\n".join(holes)
    finally:
        await driver.destroy(second)


async def test_a_sandbox_never_starts_with_flows_left_at_its_address(driver: LocalDriver) -> None:
    """Entries at an address that no destroy removed (a server killed before it tore the
    sandbox's network down): setting the next sandbox's network up removes them first."""
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, network_enabled=True))
    try:
        index = driver._registry.running(sid).uid - UID_BASE
        address = str(network.address(index))
        # A stand-in for a flow the killed server's sandbox left: a UDP entry with its address.
        made = await asyncio.to_thread(_make_entry, address)
        assert made.returncode == 0, made.stderr
        assert await asyncio.to_thread(tracked, address), "the stand-in entry was not made"
        await asyncio.to_thread(network.setup, driver._registry.running(sid).init_pid, index, outbound=True)
        assert await asyncio.to_thread(tracked, address) == []
    finally:
        await driver.destroy(sid)


async def test_a_teardown_that_could_not_forget_leaves_it_to_the_next_set_up(
        driver: LocalDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A teardown marks the address it forgot, and the next set-up there trusts the mark rather
    than walk the kernel's table again (conntrack.py). One that could not forget marks nothing:
    the destroy completes, and the next set-up at the address forgets the entries itself."""
    first = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=first, runtime=PY, network_enabled=True))
    index = driver._registry.running(first).uid - UID_BASE
    address = str(network.address(index))

    def refused(_: str) -> int:
        raise DriverFailure("ctnetlink: refused")

    monkeypatch.setattr(conntrack, "forget", refused)
    await driver.destroy(first)  # completes: the failure is logged
    monkeypatch.undo()
    made = await asyncio.to_thread(_make_entry, address)  # what it could not forget
    assert made.returncode == 0, made.stderr
    second = await at_index(driver, index, network_enabled=True)
    try:
        assert await asyncio.to_thread(tracked, address) == []
    finally:
        await driver.destroy(second)
