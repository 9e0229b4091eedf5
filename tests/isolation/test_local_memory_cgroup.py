"""A sandbox's memory cgroup (cgroup v1) is made before its first command, not at its create:
every memory cgroup holds the kernel's shrinker map, sized by the most superblocks the host
ever held at once, so 10,000 idle sandboxes each paid ~780 KiB for it (docs/idle.md). What
must hold all the same: no process of the sandbox's own runs outside its limit, whatever
enters it first (a command, a file operation), and a server restarted before the first
command still makes it.

Needs root and the python:3.13 runtime (built by the session fixture); nothing here skips.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from hutch.drivers.base import ExecRequest, FileWrite, ResourceLimits
from hutch.drivers.local import cgroups_detect
from hutch.drivers.local.cgroups import CgroupV1
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
LIMIT = 128 * 2**20


def memory_dir(driver: LocalDriver, sid: str) -> Path:
    cgroups = driver._cgroups
    assert isinstance(cgroups, CgroupV1), "these tests are about cgroup v1 (this host's)"
    return cgroups.mounts["memory"] / "hutch" / cgroups.instance / sid


def limit(driver: LocalDriver, sid: str) -> int:
    return int((memory_dir(driver, sid) / "memory.limit_in_bytes").read_text())


def tasks_below(path: Path) -> set[int]:
    return {int(p) for f in path.rglob("tasks") for p in f.read_text().split()}


HOG = textwrap.dedent("""
    hog = []
    while True:
        hog.append(bytearray(16 * 2**20))
""")


async def test_an_idle_sandbox_has_no_memory_cgroup_and_its_first_command_runs_under_the_limit(
        driver: LocalDriver) -> None:
    sid = await provision(driver, PY, resources=ResourceLimits(memory_bytes=LIMIT))
    try:
        assert not memory_dir(driver, sid).exists(), "the create made a memory cgroup"
        used = await driver.usage(sid)
        # Nothing of its own ran yet: it holds nothing, and its total is its limit, not the host's.
        assert used.memory_bytes == 0 and used.memory_peak_bytes == 0, used
        assert used.memory_total_bytes == LIMIT, used
        # The attacker's first command is a memory hog: it is killed at the limit, in a leaf
        # under the sandbox's memory cgroup made for it.
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ("python3", "-c", HOG), timeout=60), Recorder())
        assert result.oom_killed and result.exit_code == 137, result
        assert limit(driver, sid) == LIMIT
        assert int((memory_dir(driver, sid) / "memory.max_usage_in_bytes").read_text()) <= LIMIT
        # A background process of a later command is under it too, and stays after the command.
        sink = Recorder()
        done = await driver.exec(ExecRequest(new_id("ex"), sid, ("sh", "-c", "sleep 30 >/dev/null 2>&1 &")), sink)
        assert done.exit_code == 0
        assert tasks_below(memory_dir(driver, sid)), "the background process left the sandbox's memory cgroup"
        assert (await driver.usage(sid)).memory_bytes > 0
    finally:
        await driver.destroy(sid)
    assert not memory_dir(driver, sid).exists()


async def test_a_file_write_first_makes_the_memory_cgroup_too(driver: LocalDriver) -> None:
    sid = await provision(driver, PY, resources=ResourceLimits(memory_bytes=LIMIT))
    try:
        await driver.write_files(sid, [FileWrite(path="/tmp/first", content=b"x" * 4096)])
        assert limit(driver, sid) == LIMIT
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ("python3", "-c", HOG), timeout=60), Recorder())
        assert result.oom_killed, result
    finally:
        await driver.destroy(sid)


async def test_a_restarted_server_makes_the_memory_cgroup_its_predecessor_left_unmade(driver: LocalDriver) -> None:
    sid = await provision(driver, PY, resources=ResourceLimits(memory_bytes=LIMIT))
    try:
        assert not memory_dir(driver, sid).exists()
        fresh = cgroups_detect.detect(driver._cgroups.instance if driver._cgroups else "")
        assert fresh is not None
        fresh.apply_memory(sid, LIMIT)  # remembers nothing of the first server's sandboxes
        assert limit(driver, sid) == LIMIT
    finally:
        await driver.destroy(sid)


async def test_a_sandbox_claimed_from_the_warm_pool_runs_under_its_own_limit(driver: LocalDriver) -> None:
    await driver.destroy(await provision(driver, PY, resources=ResourceLimits(memory_bytes=LIMIT)))
    for _ in range(3000):  # the pool fills for this runtime and limit
        if len(driver._pool.idle.get(PY, ())) >= 1 and PY not in driver._pool._filling:
            break
        await asyncio.sleep(0.01)
    pooled = {sb.id for sb in driver._pool.idle.get(PY, ())}
    assert pooled, "the warm pool never filled"
    sid = await provision(driver, PY, resources=ResourceLimits(memory_bytes=LIMIT))
    try:
        assert pooled - {sb.id for sb in driver._pool.idle.get(PY, ())}, "not claimed from the pool"
        assert limit(driver, sid) == LIMIT  # made at the fill, the claim's limit written
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ("python3", "-c", HOG), timeout=60), Recorder())
        assert result.oom_killed, result
    finally:
        await driver.destroy(sid)
