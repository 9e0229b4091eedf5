"""A sandbox's cpu limit is written before its first command, not at its create: each write
of a cpu quota walks every cpu cgroup on the host (the kernel's bandwidth check), so at its
create it made every create slower the more sandboxes there were (docs/idle.md). Its cpu
cgroup is made then too (v1), so an idle sandbox adds nothing to that walk. What must hold
all the same: no process of the sandbox's own runs outside the limit, a server restarted
before the first command still writes it, and a destroy leaves no cpu cgroup.

Needs root and the python:3.13 runtime (built by the session fixture); nothing here skips.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hutch.drivers.base import ExecRequest, ResourceLimits
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
HALF_A_CORE = 500  # millis: a quota of 50,000 us a 100,000 us period


def cpu_dir(driver: LocalDriver, sid: str) -> Path:
    cgroups = driver._cgroups
    assert isinstance(cgroups, CgroupV1), "these tests are about cgroup v1 (this host's)"
    return cgroups.mounts["cpu"] / "hutch" / cgroups.instance / sid


def quota(driver: LocalDriver, sid: str) -> int:
    return int((cpu_dir(driver, sid) / "cpu.cfs_quota_us").read_text())


def throttled(driver: LocalDriver, sid: str) -> int:
    """Periods in which the sandbox's cpu cgroup ran out of its quota (cpu.stat)."""
    stat = dict(line.split() for line in (cpu_dir(driver, sid) / "cpu.stat").read_text().splitlines())
    return int(stat["nr_throttled"])


# The attacker's first command: spin a whole core for a second (twice its limit).
SPIN = "import time\nend = time.time() + 1\nwhile time.time() < end: pass"


async def test_an_idle_sandbox_has_no_cpu_cgroup_and_its_first_command_runs_under_the_limit(
        driver: LocalDriver) -> None:
    sid = await provision(driver, PY, resources=ResourceLimits(cpu_millis=HALF_A_CORE))
    try:
        assert not cpu_dir(driver, sid).exists(), "the create made a cpu cgroup (a task group every quota write walks)"
        ex = new_id("ex")
        task = asyncio.create_task(driver.exec(ExecRequest(ex, sid, ("python3", "-c", SPIN), timeout=30), Recorder()))
        for _ in range(300):
            tasks = cpu_dir(driver, sid) / "tasks"
            if tasks.exists() and tasks.read_text().split():  # the command, in the sandbox's cgroup
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the command never showed in the sandbox's cpu cgroup")
        assert quota(driver, sid) == 50_000  # already, while the command runs
        assert (await task).exit_code == 0
        assert throttled(driver, sid) > 0, "the spinning command was never held to half a core"
        # A background process of a later command stays in it after its command ends.
        done = await driver.exec(ExecRequest(new_id("ex"), sid, ("sh", "-c", "sleep 30 >/dev/null 2>&1 &")), Recorder())
        assert done.exit_code == 0 and quota(driver, sid) == 50_000
        assert {int(p) for f in cpu_dir(driver, sid).rglob("tasks") for p in f.read_text().split()}, \
            "the background process left the sandbox's cpu cgroup"
    finally:
        await driver.destroy(sid)
    assert not cpu_dir(driver, sid).exists(), "the destroy left the sandbox's cpu cgroup"


async def test_a_restarted_server_writes_a_limit_its_predecessor_left_unwritten(driver: LocalDriver) -> None:
    sid = await provision(driver, PY, resources=ResourceLimits(cpu_millis=HALF_A_CORE))
    try:
        assert not cpu_dir(driver, sid).exists()
        fresh = cgroups_detect.detect(driver._cgroups.instance if driver._cgroups else "")
        assert fresh is not None
        fresh.apply_cpu(sid, HALF_A_CORE)  # remembers nothing of the first server's sandboxes
        assert quota(driver, sid) == 50_000
    finally:
        await driver.destroy(sid)


async def test_a_sandbox_claimed_from_the_warm_pool_gets_its_limit_before_its_first_command(
        driver: LocalDriver) -> None:
    await driver.destroy(await provision(driver, PY))  # the pool fills for this runtime
    for _ in range(3000):
        if len(driver._pool.idle.get(PY, ())) >= 1 and PY not in driver._pool._filling:
            break
        await asyncio.sleep(0.01)
    pooled = {sb.id for sb in driver._pool.idle.get(PY, ())}
    assert pooled, "the warm pool never filled"
    sid = await provision(driver, PY, resources=ResourceLimits(cpu_millis=HALF_A_CORE))
    try:
        assert pooled - {sb.id for sb in driver._pool.idle.get(PY, ())}, "not claimed from the pool"
        # A pooled sandbox's cpu cgroup is made at its start (marked idle), with its pid 1 in it.
        assert quota(driver, sid) == -1, "the claim wrote the quota (a walk of every cpu cgroup)"
        init = str(driver._registry.sandboxes[sid].init_pid)
        assert init in (cpu_dir(driver, sid) / "tasks").read_text().split()
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ("true",)), Recorder())
        assert result.exit_code == 0 and quota(driver, sid) == 50_000
    finally:
        await driver.destroy(sid)
