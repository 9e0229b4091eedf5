# ruff: noqa: ASYNC240  (tests inspect host cgroup files directly; blocking is fine here)
"""An execution's memory leaf is reused within its sandbox (cgroup v1): a new memory cgroup
costs 0.3-0.65 ms to make on this host (docs/idle.md), so an ended execution's empty leaf is
kept as the sandbox's spare and renamed for the next one. What must hold all the same: each
execution is still alone in its leaf, its OOM kills are its own (not the count the leaf
carried over), and a spare goes with its sandbox.

Needs root and the python:3.13 runtime (built by the session fixture); nothing here skips.
"""

from __future__ import annotations

import asyncio
import os
import textwrap
from pathlib import Path

import pytest

from hutch.drivers.base import ExecRequest, ExecResult, ResourceLimits
from hutch.drivers.local.cgroups import SPARE_MEMORY_LEAF, CgroupV1
from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    new_id,
    provision,
)

pytestmark = pytest.mark.isolation

PY = "python:3.13"


async def run(driver: LocalDriver, sid: str, *argv: str, **kw: object) -> tuple[ExecResult, Recorder]:
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, argv, **kw), sink)  # type: ignore[arg-type]
    return result, sink


def memory_dir(driver: LocalDriver, sid: str) -> Path:
    cgroups = driver._cgroups
    assert isinstance(cgroups, CgroupV1), "these tests are about cgroup v1 (this host's)"
    return cgroups.mounts["memory"] / "hutch" / cgroups.instance / sid


async def test_the_next_execution_reuses_the_memory_leaf_and_counts_only_its_own_oom_kills(
        driver: LocalDriver) -> None:
    sid = await provision(driver, PY, resources=ResourceLimits(memory_bytes=128 * 2**20))
    try:
        hog = textwrap.dedent("""
            hog = []
            while True:
                hog.append(bytearray(16 * 2**20))
        """)
        result, _ = await run(driver, sid, "python3", "-c", hog, timeout=60)
        assert result.oom_killed and result.exit_code == 137
        spare = memory_dir(driver, sid) / SPARE_MEMORY_LEAF
        assert spare.is_dir(), "the ended execution's memory leaf was not kept"
        inode = spare.stat().st_ino
        assert "oom_kill 0" not in (spare / "memory.oom_control").read_text()  # it carries the kill

        # The next execution runs in that very cgroup, alone, and is not reported killed.
        ex = new_id("ex")
        sink = Recorder()
        task = asyncio.create_task(driver.exec(ExecRequest(ex, sid, ("sleep", "1")), sink))
        leaf = memory_dir(driver, sid) / ("x-" + ex)
        for _ in range(200):
            if leaf.is_dir() and (leaf / "tasks").read_text().split():
                break
            await asyncio.sleep(0.01)
        assert leaf.stat().st_ino == inode
        assert not spare.exists()
        assert len((leaf / "tasks").read_text().split()) == 1  # the sleep, nothing left over
        result = await task
        assert (result.exit_code, result.oom_killed) == (0, False)

        # An OOM kill in a reused leaf is still reported.
        result, _ = await run(driver, sid, "python3", "-c", hog, timeout=60)
        assert result.oom_killed and result.exit_code == 137
    finally:
        await driver.destroy(sid)
    assert not memory_dir(driver, sid).exists()


async def test_a_leaf_with_processes_left_is_not_made_a_spare(driver: LocalDriver) -> None:
    sid = await provision(driver, PY)
    try:
        result, _ = await run(driver, sid, "sh", "-c", "sleep 30 >/dev/null 2>&1 &")
        assert result.exit_code == 0
        assert not (memory_dir(driver, sid) / SPARE_MEMORY_LEAF).exists()
        result, _ = await run(driver, sid, "true")
        assert result.exit_code == 0
        # The clean one is kept; the lingering one stays where its process is.
        assert (memory_dir(driver, sid) / SPARE_MEMORY_LEAF).is_dir()
        lingering = [p for p in memory_dir(driver, sid).iterdir() if p.is_dir() and p.name.startswith("x-")]
        assert len(lingering) == 1 and (lingering[0] / "tasks").read_text().split()
    finally:
        await driver.destroy(sid)
    assert not memory_dir(driver, sid).exists()


async def pool_settled(driver: LocalDriver) -> None:
    """The runtime's warm pool full and not filling (30 s at most)."""
    for _ in range(1500):
        if len(driver._pool.idle.get(PY, ())) >= driver._pool.size and PY not in driver._pool._filling:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the warm pool of {PY} did not fill in 30 s")


async def test_spares_are_capped_and_dropped_when_stale(driver: LocalDriver) -> None:
    cgroups = driver._cgroups
    assert isinstance(cgroups, CgroupV1)
    sids = [await provision(driver, PY) for _ in range(3)]
    # The warm pool refills behind the claims, and each sandbox it makes brings a spare that
    # counts toward the cap: once it is full, the spares taken and kept below are these three's.
    await pool_settled(driver)
    old_cap = cgroups.spare_cap
    cgroups.spare_cap = 2
    try:
        for sid in sids:
            assert (await run(driver, sid, "true"))[0].exit_code == 0
        kept = [sid for sid in sids if (memory_dir(driver, sid) / SPARE_MEMORY_LEAF).is_dir()]
        assert kept == sids[1:], "past the cap the oldest spare goes"
        cgroups.drop_stale_spares(max_age=0.0)
        assert not any((memory_dir(driver, sid) / SPARE_MEMORY_LEAF).exists() for sid in sids)
        assert (await run(driver, sids[0], "true"))[0].exit_code == 0  # and a new leaf is made
    finally:
        cgroups.spare_cap = old_cap
        for sid in sids:
            await driver.destroy(sid)
    assert os.path.exists(memory_dir(driver, sids[0]).parent)


async def test_a_pooled_sandbox_has_its_first_commands_leaf_made_and_it_ages_once_claimed(
        driver: LocalDriver) -> None:
    cgroups = driver._cgroups
    assert isinstance(cgroups, CgroupV1) and driver._pool.size > 0, "the warm pool is on by default (v1, root)"
    await driver.destroy(await provision(driver, PY))  # the runtime's pool is filled from its first create
    await pool_settled(driver)
    pooled = driver._pool.idle[PY][-1].id
    cgroups.drop_stale_spares(max_age=0.0)  # a pooled sandbox's spare does not age
    spare = memory_dir(driver, pooled) / SPARE_MEMORY_LEAF
    assert spare.is_dir()
    assert (spare / "tasks").read_text() == "" and "oom_kill 0" in (spare / "memory.oom_control").read_text()
    inode = spare.stat().st_ino
    sid = await provision(driver, PY)  # claims it
    try:
        assert (memory_dir(driver, sid) / SPARE_MEMORY_LEAF).stat().st_ino == inode
        ex = new_id("ex")
        task = asyncio.create_task(driver.exec(ExecRequest(ex, sid, ("sleep", "0.5")), Recorder()))
        leaf = memory_dir(driver, sid) / ("x-" + ex)
        for _ in range(200):
            if leaf.is_dir():
                break
            await asyncio.sleep(0.01)
        assert leaf.stat().st_ino == inode
        assert (await task).exit_code == 0
        cgroups.drop_stale_spares(max_age=0.0)  # claimed, it ages as any other
        assert not (memory_dir(driver, sid) / SPARE_MEMORY_LEAF).exists()
    finally:
        await driver.destroy(sid)
