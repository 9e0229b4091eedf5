"""Many creates at once on the local driver: all succeed, and no more than its cap are being
started at the same time (drivers/local/provisioning.py, STARTS_PER_CORE)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from hutch.drivers.base import ProvisionRequest
from hutch.drivers.local import launch, provisioning, uids
from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import (
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    new_id,
    provision,
    start_local,
    stop_local,
)

pytestmark = pytest.mark.isolation


class Concurrency:
    """Counts the sandboxes being made at once; remembers the most."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    def wrap(self, make: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(*args: Any, **kw: Any) -> Any:
            self.now += 1
            self.most = max(self.most, self.now)
            try:
                return await make(*args, **kw)
            finally:
                self.now -= 1

        return counted


async def test_concurrent_creates_all_succeed_within_the_cap(request: pytest.FixtureRequest,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # One start per core, so a handful of sandboxes is enough to be over the cap.
    monkeypatch.setattr(provisioning, "STARTS_PER_CORE", 1)
    seen = Concurrency()
    monkeypatch.setattr(provisioning.Provisioner, "_make", seen.wrap(provisioning.Provisioner._make))
    driver = await start_local(request)
    assert isinstance(driver, LocalDriver)
    try:
        cap = driver._provisioner.max_starting
        made = await asyncio.gather(*(provision(driver) for _ in range(3 * cap + 1)))
        assert len(set(made)) == 3 * cap + 1
        assert set(made) <= set(await driver.alive())  # every one of them is running
        assert min(2, cap) <= seen.most <= cap, (seen.most, cap)  # concurrent, never more than the cap
    finally:
        await stop_local(driver)



async def test_a_create_cancelled_while_its_tree_is_made_leaves_nothing(request: pytest.FixtureRequest,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The directory, uid and skeleton are made in a worker thread (launch.py, _make_tree); a
    # create cancelled meanwhile (a client gone, a server stopping) must wait for it before its
    # teardown, or the thread makes them after the teardown looked and they are left.
    started = threading.Event()
    original = launch.Launcher._make_tree

    def slow(self: launch.Launcher, *args: Any) -> int:
        started.set()
        time.sleep(0.5)  # the cancel and the teardown it starts happen now
        return original(self, *args)

    monkeypatch.setattr(launch.Launcher, "_make_tree", slow)
    driver = await start_local(request)
    assert isinstance(driver, LocalDriver)
    try:
        sid = new_id()
        task = asyncio.create_task(driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest")))
        await asyncio.to_thread(started.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(1.0)  # past the thread's sleep: whatever it would make is made
        root = driver._registry.sandbox_root
        assert not (root / sid).exists()
        claims = [p for p in uids.UID_REGISTRY.iterdir() if p.name[0].isdigit()]
        assert not [p for p in claims if p.read_text() == str(root / sid)], "its uid claim was left"
        assert driver._cgroups is not None and not driver._cgroups.paths(sid)[0].exists()
        assert sid not in await driver.alive()
        assert await provision(driver)  # and the next create is made as usual
    finally:
        await stop_local(driver)
