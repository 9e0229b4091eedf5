# ruff: noqa: ASYNC240  (tests inspect host files directly; blocking is fine here)
"""What a node agent needs of the local driver beyond the contract (issue 35): a sandbox
whose init dies without a destroy (killed on the host: pid 1 of a pid namespace ignores what
its own sandbox sends it, and the OOM killer spares it, oom_score_adj -1000) is reported (the
ended watch, drivers/local/endwatch.py), and a restarted driver knows the limits each adopted
sandbox was given (meta.json).

Needs root and the base runtime (built by the session fixture); nothing here skips.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from hutch.core.errors import SandboxNotFound
from hutch.drivers.base import ResourceLimits
from hutch.drivers.local import endwatch
from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import (
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    new_id,
    provision,
)

pytestmark = pytest.mark.isolation


class Ends:
    """The listener: what the driver reported, as it arrives."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bool]] = []
        self.arrived = asyncio.Event()

    async def __call__(self, sid: str, reason: str, failed: bool) -> None:
        self.seen.append((sid, reason, failed))
        self.arrived.set()

    async def first(self, within: float = 5.0) -> tuple[str, str, bool]:
        await asyncio.wait_for(self.arrived.wait(), within)
        return self.seen[0]


@pytest.fixture
def ends(driver: LocalDriver) -> Ends:
    listener = Ends()
    driver.set_listener(listener)  # the engine sets it before start; the watch reads it when an init ends
    return listener


async def test_an_init_killed_from_the_host_is_reported_failed_and_cleaned_up(driver: LocalDriver, ends: Ends) -> None:
    sid = await provision(driver)
    init = driver._registry.running(sid).init_pid
    assert driver._cgroups is not None
    cgroups = driver._cgroups.paths(sid)  # known while it lives (its pids one: under its organization's)
    os.kill(init, signal.SIGKILL)
    reported, reason, failed = await ends.first()
    assert (reported, failed) == (sid, True)
    assert f"init process (pid {init})" in reason and "without a destroy" in reason
    assert sid not in await driver.alive()
    # Ended with it: its cgroup and directory (what a destroy removes), so nothing lingers
    # until the next restart.
    assert driver._cgroups is not None
    for _ in range(100):
        if not (driver.sandbox_root / sid).exists():
            break
        await asyncio.sleep(0.05)
    assert not (driver.sandbox_root / sid).exists()
    assert not any(p.exists() for p in cgroups)
    with pytest.raises(SandboxNotFound):
        driver._registry.running(sid)
    await driver.destroy(sid)  # the engine's later destroy of a failed sandbox: a no-op
    assert ends.seen == [(sid, reason, True)]


async def test_a_destroy_or_a_restore_is_not_reported(driver: LocalDriver, ends: Ends) -> None:
    sid = await provision(driver)
    await driver.checkpoint(sid, "cp1")
    await driver.restore(sid, "cp1")  # kills init and starts another: not an end
    await asyncio.sleep(0.3)
    assert ends.seen == []
    # The new init is watched in its turn.
    os.kill(driver._registry.running(sid).init_pid, signal.SIGKILL)
    assert (await ends.first())[:1] == (sid,)
    other = await provision(driver)
    await driver.destroy(other)
    await asyncio.sleep(0.3)
    assert [s for s, _, _ in ends.seen] == [sid]


async def test_a_restarted_driver_watches_what_it_adopts(driver: LocalDriver) -> None:
    sid = await provision(driver)
    driver._ended.close()  # as if its process were gone: only the new one watches
    fresh = LocalDriver(driver.data_dir, driver.runtime_cache)
    later = Ends()
    fresh.set_listener(later)
    await fresh.start()
    try:
        os.kill(fresh._registry.running(sid).init_pid, signal.SIGKILL)
        assert (await later.first())[0::2] == (sid, True)
    finally:
        await fresh.close()


async def test_without_pidfd_the_watch_polls(driver: LocalDriver, ends: Ends, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")  # ENOSYS: a kernel before 5.3

    sid = await provision(driver)
    monkeypatch.setattr(endwatch, "_pidfd_open", missing)
    monkeypatch.setattr(endwatch, "POLL_PERIOD", 0.1)
    driver._ended.forget(sid)
    driver._ended.watch(driver._registry.running(sid))
    os.kill(driver._registry.running(sid).init_pid, signal.SIGKILL)
    assert (await ends.first())[0::2] == (sid, True)


# -- limits in meta.json ---------------------------------------------------------------


async def test_limits_are_known_again_after_a_restart(driver: LocalDriver) -> None:
    given = ResourceLimits(memory_bytes=256 * 2**20, cpu_millis=500, disk_bytes=64 * 2**20)
    sid = await provision(driver, resources=given)
    plain = await provision(driver)
    assert driver.limits(sid) == given
    fresh = LocalDriver(driver.data_dir, driver.runtime_cache)
    await fresh.start()
    try:
        assert {sid, plain} <= await fresh.alive()
        assert fresh.limits(sid) == given
        assert fresh.limits(plain) == ResourceLimits()
        with pytest.raises(SandboxNotFound):
            fresh.limits(new_id())
    finally:
        await fresh.close()


async def test_a_meta_json_written_before_limits_still_loads(driver: LocalDriver) -> None:
    sid = await provision(driver, resources=ResourceLimits(memory_bytes=128 * 2**20))
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
        assert fresh.limits(sid) == ResourceLimits()  # not known: said so, not guessed
    finally:
        await fresh.close()
