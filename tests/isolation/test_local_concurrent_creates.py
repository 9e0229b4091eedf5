"""Many creates at once on the local driver: all succeed, and no more than its cap are being
started at the same time (drivers/local/provisioning.py, STARTS_PER_CORE)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from hutch.drivers.local import provisioning
from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import (
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
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

