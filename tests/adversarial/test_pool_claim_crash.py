"""A process killed in the middle of a warm pool claim (local driver, pool.py): the pooled
sandbox renamed to the tenant's id, its limits not yet written. What the next start makes of it.

A node agent asks ``is_alive`` at every create (a retried create must not make a second
sandbox), so whatever the next start adopts as the tenant's sandbox is what the tenant gets.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import RUNTIME_CACHE, built_runtimes, new_id, require_root  # noqa: F401  (fixture)

pytestmark = pytest.mark.isolation

# Claims a pooled sandbox for ``sid`` with a CPU limit and dies (as a SIGKILL would: no
# cleanup) the moment the claim comes to write the tenant's limits, after the renames.
CRASH_MID_CLAIM = r"""
import asyncio, os, sys
from pathlib import Path
from hutch.drivers.base import ProvisionRequest, ResourceLimits
from hutch.drivers.local.driver import LocalDriver

async def main() -> None:
    data, cache, sid = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    driver = LocalDriver(data, cache)
    await driver.start()
    driver._pool.refill("base:latest", None)
    for _ in range(600):
        if driver._pool.idle.get("base:latest"):
            break
        await asyncio.sleep(0.1)
    else:
        sys.exit("the pool never filled")
    type(driver._pool._cgroups).set_limits = lambda *a, **k: os._exit(9)
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest",
                                            resources=ResourceLimits(cpu_millis=500, pids=64)))
    sys.exit("the claim finished")

asyncio.run(main())
"""


async def test_a_claim_cut_short_is_no_one_s_sandbox_after_a_restart(built_runtimes: Path, tmp_path: Path) -> None:  # noqa: F811
    """Before: the next start adopted the half-claimed sandbox as the tenant's (its meta still
    the pool's, read under the tenant's id), with the pool's cgroup: no CPU quota, marked idle,
    and a retried create on a node agent answered "made" for it."""
    require_root()
    sid = new_id()
    crashed = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASH_MID_CLAIM, str(tmp_path), str(RUNTIME_CACHE), sid,
        env={"HUTCH_WARM_POOL": "1", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": ":".join(sys.path)},
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(crashed.communicate(), 300)
    assert crashed.returncode == 9, err.decode()[-3000:]
    assert (tmp_path / "sandboxes" / sid).is_dir(), "the crash came before the rename: nothing to test"
    driver = LocalDriver(tmp_path, RUNTIME_CACHE)
    await driver.start()
    try:
        cpu = [p for p in driver._cgroups.paths(sid) if "cpu" in str(p)] if driver._cgroups else []
        seen = {f.name: f.read_text().strip() for p in cpu for f in (p / "cpu.cfs_quota_us", p / "cpu.idle") if f.exists()}
        assert not driver.is_alive(sid), f"adopted as the tenant's, its cpu cgroup {seen}"
        assert sid not in await driver.alive()
        assert not (tmp_path / "sandboxes" / sid).exists()  # torn down: its processes with it
    finally:
        for left in await driver.alive():
            await driver.destroy(left)
        await driver.close()
