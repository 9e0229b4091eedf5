"""A deny-list and a live sandbox's rules replaced (E2B's denyOut and update_network) on the
nomad driver, from inside the sandbox, as tests/adversarial/test_local_egress_rules.py holds
the local driver to: it never reaches more than its rules of the moment say, during an update
either, and a connection it opened before an update does not outlive the rules that let it
through. The rules are the hutch-containerd plugin's (containerd-driver/egress.go), changed
through its egress verb.

"The internet" is tests/isolation's fake one: a network namespace routed from the host, one
HTTP server under two addresses (INET_SERVER, INET_SERVER2)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from hutch.core.errors import InvalidInput, NotSupported
from hutch.drivers.base import ExecRequest, ProvisionRequest
from hutch.drivers.nomad.driver import NomadDriver
from tests.adversarial.test_local_egress_rules import HELD, reached
from tests.adversarial.test_local_network import KNOCK
from tests.drivers_support import Recorder, new_id
from tests.isolation.test_local_network import (  # noqa: F401  (fixtures)
    INET_HOST,
    INET_SERVER,
    INET_SERVER2,
    fake_internet,
    hosts_entry,
    probe,
)

PY = "python:3.13"
A, B = f"{INET_SERVER}:8080", f"{INET_SERVER2}:8080"
BOTH = [(INET_SERVER, 8080), (INET_SERVER2, 8080)]


async def sandbox(driver: NomadDriver, **net: object) -> str:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=PY, **net))  # type: ignore[arg-type]
    return sid


async def test_a_deny_list_keeps_its_destinations_out_and_opens_nothing_else(
    driver: NomadDriver, fake_internet: tuple[str, int]  # noqa: F811
) -> None:
    """Only the listed address is out of reach; what every sandbox is denied (the host's own
    address on the fake internet's link) stays denied."""
    assert driver.capabilities.egress_deny and driver.capabilities.network_update
    sid = await sandbox(driver, network_enabled=True, network_deny=(f"{INET_SERVER}/32",))
    seen = await probe(driver, sid, [*BOTH, (INET_HOST, 8080)])  # type: ignore[arg-type]
    assert reached(seen) == {B}, seen


async def test_an_update_replaces_the_rules_whole_each_time(
    driver: NomadDriver, fake_internet: tuple[str, int]  # noqa: F811
) -> None:
    """Open, then a deny-list, an allow-list, off, and open again: each probe sees exactly the
    rules of that moment."""
    sid = await sandbox(driver, network_enabled=True)
    assert reached(await probe(driver, sid, BOTH)) == {A, B}  # type: ignore[arg-type]
    for enabled, allow, deny, expected in (
        (True, (), (f"{INET_SERVER}/32",), {B}),
        (True, (f"{INET_SERVER}/32",), (), {A}),
        (False, (), (), set()),
        (True, (), (), {A, B}),
    ):
        await driver.update_network(sid, enabled=enabled, allow=allow, deny=deny)
        seen = await probe(driver, sid, BOTH)  # type: ignore[arg-type]
        assert reached(seen) == expected, (enabled, allow, deny, seen)


async def test_off_leaves_no_name_server_either(driver: NomadDriver, fake_internet: tuple[str, int]) -> None:  # noqa: F811
    """Network off is nothing out: DNS to its name servers, which an allow-list keeps, too."""
    sid = await sandbox(driver, network_enabled=True, network_allow=(f"{INET_SERVER}/32",))
    sink = Recorder()
    await driver.exec(ExecRequest(new_id("ex"), sid, ["cat", "/etc/resolv.conf"]), sink)
    servers = [(line.split()[1], 53) for line in sink.stdout.splitlines() if line.startswith("nameserver")]
    assert servers, sink.stdout
    assert await connects(driver, sid, servers) == ["connected"] * len(servers)  # an allow-list keeps them
    await driver.update_network(sid, enabled=False, allow=(), deny=())
    assert await connects(driver, sid, servers) == ["ConnectionRefusedError"] * len(servers)


CONNECT = """
import socket, sys
for target in sys.argv[1:]:
    try:
        socket.create_connection((target.rsplit(":", 1)[0], int(target.rsplit(":", 1)[1])), 3).close()
        print("connected")
    except OSError as err:
        print(type(err).__name__)
"""


async def connects(driver: NomadDriver, sid: str, targets: list[tuple[str, int]]) -> list[str]:
    """Whether a TCP connection to each target opens (a name server answers no HTTP)."""
    sink = Recorder()
    argv = ["python3", "-c", CONNECT, *(f"{h}:{p}" for h, p in targets)]
    result = await driver.exec(ExecRequest(new_id("ex"), sid, argv, timeout=60), sink)
    assert result.exit_code == 0, sink.stderr
    return sink.stdout.split()


async def test_a_connection_opened_before_an_update_does_not_outlive_its_rules(
    driver: NomadDriver, fake_internet: tuple[str, int]  # noqa: F811
) -> None:
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
            assert sink.text().strip() and not sink.text().startswith("answered"), (rules, sink.text(),
                                                                                     sink.text("stderr"))
        finally:
            await driver.destroy(sid)


async def test_a_connection_its_new_rules_still_allow_carries_on(
    driver: NomadDriver, fake_internet: tuple[str, int]  # noqa: F811
) -> None:
    """The other side of the one above (so that one cannot pass for nothing): a connection to
    a destination the new rules still allow is answered."""
    sid = await sandbox(driver, network_enabled=True)
    sink = Recorder()
    held = asyncio.ensure_future(driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", HELD, INET_SERVER],
                                                         timeout=60), sink))
    while (await driver.exec(ExecRequest(new_id("ex"), sid, ["test", "-f", "/tmp/connected"]), Recorder())).exit_code:
        assert not held.done(), sink.text("stderr")
        await asyncio.sleep(0.1)
    await driver.update_network(sid, enabled=True, allow=(), deny=(f"{INET_SERVER2}/32",))
    await driver.exec(ExecRequest(new_id("ex"), sid, ["touch", "/tmp/go"]), Recorder())
    await held
    assert sink.text().startswith("answered HTTP/1."), (sink.text(), sink.text("stderr"))


async def test_no_update_ever_leaves_a_moment_without_walls(
    driver: NomadDriver, fake_internet: tuple[str, int]  # noqa: F811
) -> None:
    """The sandbox knocks on a denied address without pause while its rules are replaced over
    and over, between a deny-list naming it and an allow-list that does not: under either it
    is out of reach, so not one connection may get through."""
    sid = await sandbox(driver, network_enabled=True, network_deny=(f"{INET_SERVER}/32",))
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
    knock = driver.exec(ExecRequest(new_id("ex"), sid, ["python3", "-c", KNOCK, "6", A], timeout=60), sink)
    _, n = await asyncio.gather(knock, updates())
    opened, tries = map(int, sink.text().split())
    assert n >= 5 and tries >= 50, (n, tries, sink.text("stderr"))
    assert opened == 0, f"{opened} of {tries} connections got through during {n} updates"
    assert reached(await probe(driver, sid, [(INET_SERVER2, 8080)])) == {B}  # type: ignore[arg-type]


async def test_an_update_gives_no_network_to_a_sandbox_made_without(
    driver: NomadDriver, fake_internet: tuple[str, int]  # noqa: F811
) -> None:
    """A port-only sandbox (on the bridge, nothing out) and one with no network at all (a warm
    pool's kind): an update cannot give either a network; off is what they have."""
    for net in ({"port": 8000}, {}):
        sid = await sandbox(driver, **net)
        with pytest.raises(NotSupported, match="was made without outbound network"):
            await driver.update_network(sid, enabled=True, allow=(), deny=())
        await driver.update_network(sid, enabled=False, allow=(), deny=())  # what it has: fine
        seen = await probe(driver, sid, BOTH)  # type: ignore[arg-type]
        assert reached(seen) == set(), (net, seen)


async def test_an_updated_allow_list_follows_its_names_and_a_bad_name_changes_nothing(
    driver: NomadDriver, fake_internet: tuple[str, int]  # noqa: F811
) -> None:
    """An allow-list given by an update is refreshed like one given at create (the plugin's
    allow verb on the rules of the moment, not those of the create)."""
    name = f"updated-{uuid.uuid4().hex[:8]}.hutch.test"
    with hosts_entry(name, INET_SERVER) as point:
        sid = await sandbox(driver, network_enabled=True)
        await driver.update_network(sid, enabled=True, allow=(name,), deny=())
        assert reached(await probe(driver, sid, BOTH)) == {A}  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="does not resolve"):
            await driver.update_network(sid, enabled=False, allow=("no-such-host.invalid",), deny=())
        point(INET_SERVER2)
        await driver._allow.refresh()
        assert reached(await probe(driver, sid, BOTH)) == {B}  # type: ignore[arg-type]
        await driver.update_network(sid, enabled=True, allow=(), deny=())  # the list gone: not refreshed back
        assert sid not in driver._allow._lists
        assert reached(await probe(driver, sid, BOTH)) == {A, B}  # type: ignore[arg-type]
