"""A server killed while it makes a sandbox's network (local driver, sandboxnet.py): what the
next start leaves of it. Found by the node-agent chaos test (tests/system/test_node_chaos.py):
an agent killed during a create with ``network.allow`` left the sandbox's chain ``HUTCH-A<n>``
and the jump to it in the host's firewall for good, because its meta.json said "no network"
until everything was made, and the next start's teardown trusts meta.json.

Each case kills the server (``os._exit``: no cleanup, as a SIGKILL) at one point of the set-up;
then a fresh driver on the same data dir starts, and nothing of that sandbox is left: no chain,
no jump, no veth, no sandbox."""

from __future__ import annotations

import asyncio
import errno
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hutch.drivers.base import ProvisionRequest
from hutch.drivers.local import network
from hutch.drivers.local.driver import LocalDriver
from hutch.drivers.local.state import LocalSandbox, Registry
from hutch.drivers.local.uids import UID_BASE
from tests.drivers_support import (
    RUNTIME_CACHE,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    local_driver_fixture,
    new_id,
    require_root,
)

pytestmark = pytest.mark.isolation

# Provisions ``sid`` with an allow-list (a chain of its own) and dies at the point argv[4] names.
CRASH_MID_NETWORK = r"""
import asyncio, os, sys
from pathlib import Path
from hutch.drivers.base import ProvisionRequest
from hutch.drivers.local import network
from hutch.drivers.local.driver import LocalDriver

async def main() -> None:
    data, cache, sid, point = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    driver = LocalDriver(data, cache)
    await driver.start()
    setup = network.setup
    def crash(pid, index, *, outbound):
        if point == "after its veth":
            setup(pid, index, outbound=outbound)
        if point == "after its veth, meta.json torn":
            setup(pid, index, outbound=outbound)
            (data / "sandboxes" / sid / "meta.json").write_text('{"id": "')
        print(index, flush=True)
        os._exit(9)
    network.setup = crash  # the rules are in force by now (set before the veth: network.py)
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest", network_enabled=True,
                                            network_allow=("192.0.2.0/24",)))
    sys.exit("the create finished")

asyncio.run(main())
"""


def _firewall_of(index: int) -> list[str]:
    chain = f"HUTCH-A{index:x}"
    veths = {network.host_veth(index, True), network.host_veth(index, False)}
    rules = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True, check=True).stdout
    left = [r for r in rules.splitlines() if chain in r.split() or veths & set(r.split())]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    left += [f"veth {v}" for v in veths if f" {v}:" in links or f" {v}@" in links]
    return left


@pytest.mark.parametrize("point", ["after its rules", "after its veth", "after its veth, meta.json torn"])
async def test_a_server_killed_while_it_makes_a_network_leaves_none_of_it(
        point: str, built_runtimes: Path, tmp_path: Path) -> None:  # noqa: F811
    require_root()
    sid = new_id()
    crashed = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASH_MID_NETWORK, str(tmp_path), str(RUNTIME_CACHE), sid, point,
        env={"HUTCH_WARM_POOL": "0", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": ":".join(sys.path)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(crashed.communicate(), 300)
    assert crashed.returncode == 9, err.decode()[-3000:]
    index = int(out.decode().split()[0])
    assert _firewall_of(index), "the crash came before the rules were made: nothing to test"
    driver = LocalDriver(tmp_path, RUNTIME_CACHE)
    await driver.start()
    try:
        assert not driver.is_alive(sid)
        assert not (tmp_path / "sandboxes" / sid).exists()  # torn down
        assert _firewall_of(index) == [], f"left in the firewall after {point}"
    finally:
        for left in await driver.alive():
            await driver.destroy(left)
        await driver.close()


@pytest.fixture
async def driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalDriver]:
    monkeypatch.setenv("HUTCH_WARM_POOL", "0")
    async for d in local_driver_fixture(request):
        assert isinstance(d, LocalDriver)
        yield d


async def test_a_create_cancelled_while_its_network_is_made_leaves_none_of_it(
        driver: LocalDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A create cancelled (a server closing) while its network is made in a worker thread: the
    thread runs on. Before, the create's teardown ran beside it, found no rules yet, and the
    thread then put the sandbox's chain and the jump to it in force, for good."""
    set_rules, began, index = network.set_rules, threading.Event(), []

    def slow_rules(i: int, **rules: Any) -> None:
        index.append(i)
        began.set()
        time.sleep(0.3)  # the teardown's turn comes meanwhile
        set_rules(i, **rules)

    monkeypatch.setattr(network, "set_rules", slow_rules)
    sid = new_id()
    create = asyncio.create_task(driver.provision(ProvisionRequest(
        sandbox_id=sid, runtime="base:latest", network_enabled=True, network_allow=("192.0.2.0/24",))))
    assert await asyncio.to_thread(began.wait, 60), "the create never came to its network"
    create.cancel()
    with pytest.raises(asyncio.CancelledError):
        await create
    await asyncio.sleep(0.5)  # a thread left running would have made its veth by now
    assert not driver.is_alive(sid)
    assert _firewall_of(index[0]) == []


# Provisions ``sid`` with a network (no allow-list: a pooled sandbox may take it) and dies as its
# network is about to be made: after the sandbox's first meta.json (the launch's, or the pool
# claim's), before the one that says "making". argv[4]: "pooled" claims from a filled pool.
CRASH_BEFORE_NETWORK = r"""
import asyncio, os, sys, time
from pathlib import Path
from hutch.drivers.base import ProvisionRequest
from hutch.drivers.local import sandboxnet
from hutch.drivers.local.driver import LocalDriver

async def main() -> None:
    data, cache, sid, how = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    driver = LocalDriver(data, cache)
    await driver.start()
    if how == "pooled":
        await driver.provision(ProvisionRequest(sandbox_id=sid + "-first", runtime="base:latest"))
        deadline = time.monotonic() + 120
        while not driver._pool.idle.get("base:latest"):
            assert time.monotonic() < deadline, "the pool never filled"
            await asyncio.sleep(0.1)
    def crash(self, sb):
        os._exit(9)
    sandboxnet.SandboxNetwork.sync = crash
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest", network_enabled=True))
    sys.exit("the create finished")

asyncio.run(main())
"""


@pytest.mark.parametrize("how", ["from scratch", "pooled"])
async def test_a_server_killed_before_it_makes_a_network_leaves_no_sandbox_without_it(
        how: str, built_runtimes: Path, tmp_path: Path) -> None:  # noqa: F811
    """Killed after the sandbox's first meta.json (it said "no network", not "making") and before
    its network was begun: the next start adopted a live sandbox without the network its create
    asked for, one the create never answered (a retried create was told it exists)."""
    require_root()
    sid = new_id()
    crashed = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASH_BEFORE_NETWORK, str(tmp_path), str(RUNTIME_CACHE), sid, how,
        env={"HUTCH_WARM_POOL": "1" if how == "pooled" else "0", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
             "PYTHONPATH": ":".join(sys.path)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(crashed.communicate(), 300)
    assert crashed.returncode == 9, err.decode()[-3000:]
    driver = LocalDriver(tmp_path, RUNTIME_CACHE)
    await driver.start()
    try:
        assert not driver.is_alive(sid), f"{how}: adopted alive without its network"
        assert not (tmp_path / "sandboxes" / sid).exists()  # torn down
    finally:
        for left in await driver.alive():
            await driver.destroy(left)
        await driver.close()


async def test_a_create_whose_last_record_fails_leaves_none_of_it(
        driver: LocalDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record that says its network is made ("making" cleared) fails (a full disk): before,
    the create raised past its teardown, and the sandbox ran on, its veth and chain with it,
    in no registry, until the next start ended it."""
    write_meta, index = Registry.write_meta, []

    def full_disk(self: Registry, sb: LocalSandbox) -> None:
        if sb.network and not sb.making:
            index.append(sb.uid - UID_BASE)
            raise OSError(errno.ENOSPC, "No space left on device")
        write_meta(self, sb)

    monkeypatch.setattr(Registry, "write_meta", full_disk)
    sid = new_id()
    with pytest.raises(OSError, match="No space left"):
        await driver.provision(ProvisionRequest(
            sandbox_id=sid, runtime="base:latest", network_enabled=True, network_allow=("192.0.2.0/24",)))
    monkeypatch.setattr(Registry, "write_meta", write_meta)
    assert not driver.is_alive(sid)
    assert not (driver.sandbox_root / sid).exists(), "the sandbox was left running"
    assert _firewall_of(index[0]) == []
