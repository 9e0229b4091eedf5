"""A deny-list and a live sandbox's rules replaced (E2B's denyOut and update_network) on the
local driver, from inside the sandbox: it never reaches more than its rules of the moment say,
during an update either, and a connection it opened before an update does not outlive the
rules that let it through.

"The internet" is tests/isolation's fake one: a network namespace routed from the host, one
HTTP server under two addresses (INET_SERVER, INET_SERVER2)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from hutch.core.errors import DriverFailure, NotSupported
from hutch.drivers.base import ExecRequest, ProvisionRequest
from hutch.drivers.local import network
from hutch.drivers.local.driver import UID_BASE, LocalDriver
from tests.adversarial.test_local_network import KNOCK, LAN_SERVER, private_lan
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    local_driver_fixture,
    new_id,
)
from tests.isolation.test_local_network import (
    INET_SERVER,
    INET_SERVER2,
    fake_internet_running,
    probe,
)

pytestmark = pytest.mark.isolation

PY = "python:3.13"
A, B = f"{INET_SERVER}:8080", f"{INET_SERVER2}:8080"

# Opens a connection, says so in a file, waits for /tmp/go, then sends a request on it and
# prints what came back (or the error): a connection that outlives an update.
HELD = r"""
import os, socket, sys, time
s = socket.create_connection((sys.argv[1], 8080), 3)
open("/tmp/connected", "w").close()
while not os.path.exists("/tmp/go"):
    time.sleep(0.05)
s.settimeout(3)
try:
    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    print("answered", s.recv(12).decode(errors="replace"))
except OSError as err:
    print(type(err).__name__)
"""


@pytest.fixture(scope="module")
def internet() -> Iterator[None]:
    with fake_internet_running():
        yield


@pytest.fixture
async def driver(request: pytest.FixtureRequest, internet: None) -> AsyncIterator[LocalDriver]:
    async for d in local_driver_fixture(request):
        assert isinstance(d, LocalDriver)
        yield d


async def sandbox(driver: LocalDriver, **net: object) -> str:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, **net))  # type: ignore[arg-type]
    return sid


def reached(seen: dict[str, str]) -> set[str]:
    return {target for target, what in seen.items() if what.startswith("open HTTP/1.")}


async def test_a_deny_list_keeps_its_destinations_out_and_opens_nothing_else(driver: LocalDriver) -> None:
    """Only the listed address is out of reach; what every sandbox is denied stays denied (a
    deny-list narrows the network, it never makes a private range reachable)."""
    with private_lan():
        sid = await sandbox(driver, network_enabled=True, network_deny=(f"{INET_SERVER}/32",))
        try:
            seen = await probe(driver, sid, [(INET_SERVER, 8080), (INET_SERVER2, 8080), (LAN_SERVER, 8080)])
            assert reached(seen) == {B}, seen
            assert driver.capabilities.egress_deny and driver.capabilities.network_update
        finally:
            await driver.destroy(sid)


async def test_an_update_replaces_the_rules_whole_each_time(driver: LocalDriver) -> None:
    """Open, then a deny-list, an allow-list, off, and open again: each probe sees exactly the
    rules of that moment."""
    sid = await sandbox(driver, network_enabled=True)
    try:
        assert reached(await probe(driver, sid, [(INET_SERVER, 8080), (INET_SERVER2, 8080)])) == {A, B}
        for enabled, allow, deny, expected in (
            (True, (), (f"{INET_SERVER}/32",), {B}),
            (True, (f"{INET_SERVER}/32",), (), {A}),
            (False, (), (), set()),
            (True, (), (), {A, B}),
        ):
            await driver.update_network(sid, enabled=enabled, allow=allow, deny=deny)
            seen = await probe(driver, sid, [(INET_SERVER, 8080), (INET_SERVER2, 8080)])
            assert reached(seen) == expected, (enabled, allow, deny, seen)
    finally:
        await driver.destroy(sid)


async def test_a_connection_opened_before_an_update_does_not_outlive_its_rules(driver: LocalDriver) -> None:
    """The sandbox opens a connection while it may, and uses it only after its destination was
    taken away: by a deny-list, and by an allow-list that does not name it."""
    for rules in ({"deny": (f"{INET_SERVER}/32",)}, {"allow": (f"{INET_SERVER2}/32",)}):
        sid = await sandbox(driver, network_enabled=True)
        try:
            sink = Recorder()
            held = asyncio.ensure_future(driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", HELD, INET_SERVER],
                                                                 timeout=60), sink))
            deadline = time.monotonic() + 30
            while (await driver.exec(ExecRequest(new_id("ex"), sid, ["test", "-f", "/tmp/connected"]),
                                     Recorder())).exit_code != 0:
                assert not held.done() and time.monotonic() < deadline, sink.text("stderr")
                await asyncio.sleep(0.1)
            await driver.update_network(sid, enabled=True, allow=rules.get("allow", ()), deny=rules.get("deny", ()))
            await driver.exec(ExecRequest(new_id("ex"), sid, ["touch", "/tmp/go"]), Recorder())
            await held
            assert not sink.text().startswith("answered"), (rules, sink.text(), sink.text("stderr"))
        finally:
            await driver.destroy(sid)


async def test_no_update_ever_leaves_a_moment_without_walls(driver: LocalDriver) -> None:
    """The sandbox knocks on a denied address without pause while its rules are replaced over
    and over, between a deny-list naming it and an allow-list that does not: under either it
    is out of reach, so not one connection may get through."""
    sid = await sandbox(driver, network_enabled=True, network_deny=(f"{INET_SERVER}/32",))
    try:
        stop = time.monotonic() + 6

        async def updates() -> int:
            n = 0
            while time.monotonic() < stop:
                allow_list = n % 2 == 0
                await driver.update_network(sid, enabled=True, allow=(f"{INET_SERVER2}/32",) if allow_list else (),
                                            deny=() if allow_list else (f"{INET_SERVER}/32",))
                n += 1
            return n

        sink = Recorder()
        knock = driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", KNOCK, "5", A], timeout=60), sink)
        _, n = await asyncio.gather(knock, updates())
        opened, tries = map(int, sink.text().split())
        assert n >= 5 and tries >= 50, (n, tries, sink.text("stderr"))
        assert opened == 0, f"{opened} of {tries} connections got through during {n} updates"
        # The allowed address stayed reachable under both (the knock is not failing for nothing).
        assert reached(await probe(driver, sid, [(INET_SERVER2, 8080)])) == {B}
    finally:
        await driver.destroy(sid)


async def test_an_update_gives_no_network_to_a_sandbox_made_without(driver: LocalDriver) -> None:
    sid = await sandbox(driver, port=8000)  # a veth for its port, none out
    try:
        with pytest.raises(NotSupported, match="was made without outbound network"):
            await driver.update_network(sid, enabled=True, allow=(), deny=())
        await driver.update_network(sid, enabled=False, allow=(), deny=())  # what it has: fine
        seen = await probe(driver, sid, [(INET_SERVER, 8080)])
        assert reached(seen) == set(), seen
        assert not network.link_exists(network.host_veth(driver._registry.running(sid).uid - UID_BASE, True))
    finally:
        await driver.destroy(sid)


async def test_a_swap_that_fails_leaves_the_old_rules_in_force_and_on_record(driver: LocalDriver,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    sid = await sandbox(driver, network_enabled=True, network_deny=(f"{INET_SERVER}/32",))
    try:
        def refused(*_: object, **__: object) -> None:
            raise DriverFailure("network setup failed: iptables-restore: refused")

        monkeypatch.setattr(network, "set_rules", refused)
        with pytest.raises(DriverFailure):
            await driver.update_network(sid, enabled=True, allow=(), deny=())
        monkeypatch.undo()
        sb = driver._registry.running(sid)
        assert (sb.deny, sb.allow, sb.rules_generation) == ([f"{INET_SERVER}/32"], {}, 0)
        assert reached(await probe(driver, sid, [(INET_SERVER, 8080), (INET_SERVER2, 8080)])) == {B}
    finally:
        await driver.destroy(sid)
