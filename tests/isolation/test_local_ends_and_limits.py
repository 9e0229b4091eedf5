# ruff: noqa: ASYNC240  (tests inspect host files directly; blocking is fine here)
"""What a node agent needs of the local driver beyond the contract (issue 35): a sandbox
whose init dies without a destroy (killed on the host: pid 1 of a pid namespace ignores what
its own sandbox sends it, and the OOM killer spares it, oom_score_adj -1000) is reported (the
ended watch, drivers/local/endwatch.py), and a restarted driver knows the limits each adopted
sandbox was given (meta.json).

Needs root and the base runtime (built by the session fixture); nothing here skips.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hutch.core.errors import SandboxNotFound
from hutch.drivers.base import Resources
from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import (
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    local_driver_fixture,
    new_id,
    provision,
)

pytestmark = pytest.mark.isolation


@pytest.fixture
async def driver(request: pytest.FixtureRequest) -> AsyncIterator[LocalDriver]:
    async for d in local_driver_fixture(request):
        assert isinstance(d, LocalDriver)
        yield d


# -- limits in meta.json ---------------------------------------------------------------


async def test_limits_are_known_again_after_a_restart(driver: LocalDriver) -> None:
    given = Resources(memory_bytes=256 * 2**20, cpu_millis=500, disk_bytes=64 * 2**20)
    sid = await provision(driver, resources=given)
    plain = await provision(driver)
    assert driver.limits(sid) == given
    fresh = LocalDriver(driver.data_dir, driver.runtime_cache)
    await fresh.start()
    try:
        assert {sid, plain} <= await fresh.alive()
        assert fresh.limits(sid) == given
        assert fresh.limits(plain) == Resources()
        with pytest.raises(SandboxNotFound):
            fresh.limits(new_id())
    finally:
        await fresh.close()


async def test_a_meta_json_written_before_limits_still_loads(driver: LocalDriver) -> None:
    sid = await provision(driver, resources=Resources(memory_bytes=128 * 2**20))
    meta = Path(driver.sandbox_root / sid / "meta.json")
    old = json.loads(meta.read_text())
    for key in ("memory_bytes", "cpu_millis", "disk_bytes"):
        assert key in old, key  # written at launch
        del old[key]
    meta.write_text(json.dumps(old))
    fresh = LocalDriver(driver.data_dir, driver.runtime_cache)
    await fresh.start()
    try:
        assert sid in await fresh.alive()
        assert fresh.limits(sid) == Resources()  # not known: said so, not guessed
    finally:
        await fresh.close()
