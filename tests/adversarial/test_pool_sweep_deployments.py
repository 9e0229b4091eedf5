"""A survivor's sweep of a lost replica's warm pool jobs (drivers/nomad/adoption.py:
``lost_leftovers``) against another hutch deployment sharing the Nomad cluster. Both name a
replica ``api-1`` (HUTCH_REPLICA_ID is the operator's choice, and the default, host name + a
hash of the data dir, is the same for two containers alike). The staging deployment's
``api-1`` is lost; its survivor must end what *its* ``api-1`` placed, never the production
deployment's pool jobs: one of those is a tenant's live sandbox (a claimed pool entry keeps
its pool job's name), which no handle of the staging deployment names. Real Nomad."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from hutch.drivers.base import ExecRequest, ResourceLimits
from hutch.drivers.nomad.driver import NomadDriver
from tests.drivers_support import Recorder, new_id, provision, start_nomad


async def _ready(driver: NomadDriver, n: int) -> None:
    deadline = time.monotonic() + 90
    while driver.pool_metrics()["pools"]["base:latest"]["ready"] < n:
        assert time.monotonic() < deadline, "the warm pool did not fill"
        await asyncio.sleep(0.2)


async def test_a_survivor_never_sweeps_another_deployments_pool_jobs(tmp_path: Path) -> None:
    prod = await start_nomad(tmp_path / "prod", pool_sizes={"base:latest": 1},
                             replica={"replica_id": "api-1", "deployment": "prod-deployment"})
    staging: NomadDriver | None = None
    assert isinstance(prod, NomadDriver)
    try:
        await _ready(prod, 1)
        sid = await provision(prod)  # a production tenant's sandbox, in a claimed pool job
        assert prod.pool_metrics()["claims"] == 1
        tenant_job, tenant_alloc = prod._sandboxes[sid].job_id, prod._sandboxes[sid].alloc_id
        assert "-pool-" in tenant_job
        await _ready(prod, 1)  # refilled: an idle entry too
        idle = [e.job_id for pool in prod._pool.values() for e in pool]
        # staging's own api-1, with a warm pool entry of its own, then lost (its jobs run on).
        lost = await start_nomad(tmp_path / "staging-1", pool_sizes={"base:latest": 1},
                                 replica={"replica_id": "api-1", "deployment": "staging-deployment"})
        assert isinstance(lost, NomadDriver)
        await _ready(lost, 1)
        its_own = [e.job_id for pool in lost._pool.values() for e in pool]
        lost_alloc = next(e.alloc_id for pool in lost._pool.values() for e in pool)
        lost._pool.clear()  # as a process killed -9 leaves them: its close would take them down
        await lost.close()
        started = await start_nomad(tmp_path / "staging",
                                    replica={"replica_id": "api-2", "deployment": "staging-deployment"})
        assert isinstance(started, NomadDriver)
        staging = started
        # staging's api-1 was lost: its survivor lists and ends what that replica placed ahead.
        leftovers = await staging.lost_leftovers("api-1")
        assert leftovers == its_own, (leftovers, its_own, tenant_job, idle)
        await staging.discard_leftovers(leftovers, [])
        assert not await staging._alloc_running(its_own[0], lost_alloc), "the lost replica's own pool job was left"
        assert await prod._alloc_running(tenant_job, tenant_alloc), "another deployment's tenant sandbox was purged"
        sink = Recorder()
        result = await prod.exec(ExecRequest(new_id("ex"), sid, ["echo", "alive"]), sink)
        assert (result.exit_code, sink.stdout) == (0, "alive\n")
    finally:
        if staging is not None:
            with contextlib.suppress(Exception):  # what the lost one left, had the test stopped short
                await staging.discard_leftovers(await staging.lost_leftovers("api-1"), [])
            await staging.close()
        for s in await prod.alive():
            await prod.destroy(s)
        await prod.close()


async def test_a_starting_replica_leaves_a_live_replicas_jobs_alone(tmp_path: Path) -> None:
    """The Terraform module's replicas all have HUTCH_DATA_DIR=/data: one job prefix
    (``hutch-<hash of the data dir>-``) for all. A replica's start-up recovery stopped and purged
    every job of that prefix no owner row's handle names: another live replica's idle warm pool
    jobs (which it still hands out: the next tenant's create got a purged container) and its
    sandboxes whose create is under way (its handle not yet written). Now a job marked as
    another replica's (job meta ``hutch.replica``) is left to it."""
    live = await start_nomad(tmp_path / "api-0", pool_sizes={"base:latest": 1},
                             replica={"replica_id": "api-0", "deployment": "one"})
    starting: NomadDriver | None = None
    assert isinstance(live, NomadDriver)
    try:
        await _ready(live, 1)
        theirs = {e.job_id: e.alloc_id for pool in live._pool.values() for e in pool}
        # A create under way on the live replica (no owner row's handle names its job yet).
        sid = await provision(live, resources=ResourceLimits(memory_bytes=128 * 2**20))  # never pooled
        theirs[live._sandboxes[sid].job_id] = live._sandboxes[sid].alloc_id
        started = await start_nomad(tmp_path / "api-1", pool_sizes={"base:latest": 1}, instance=live.instance,
                                    replica={"replica_id": "api-1", "deployment": "one"})
        assert isinstance(started, NomadDriver)
        starting = started
        mine = {e.job_id for pool in starting._pool.values() for e in pool}
        assert not mine & set(theirs), f"the starting replica took the live one's job(s) {mine & set(theirs)}"
        for job_id, alloc_id in theirs.items():
            assert await live._alloc_running(job_id, alloc_id), f"the starting replica stopped {job_id}"
        sink = Recorder()
        result = await live.exec(ExecRequest(new_id("ex"), sid, ["echo", "alive"]), sink)
        assert (result.exit_code, sink.stdout) == (0, "alive\n")
    finally:
        if starting is not None:
            await starting.close()
        for s in await live.alive():
            await live.destroy(s)
        await live.close()


def test_whose_a_job_is_by_its_marks() -> None:
    """Unmarked (a single server, an older replica): everyone's, as before the marks. Marked
    with this replica's id and no deployment (placed by it before the deployment mark, a
    rolling upgrade): its own, or nobody would ever end it. Any other mark: another's."""
    from hutch.drivers.nomad.adoption import NomadAdoption

    here = NomadAdoption.__new__(NomadAdoption)
    here._replica_id, here._deployment = "api-1", "one"
    assert here._placed_here({}) and here._placed_here({"hutch.pool": "base:latest"})
    assert here._placed_here({"hutch.replica": "api-1", "hutch.deployment": "one"})
    assert here._placed_here({"hutch.replica": "api-1"})
    assert not here._placed_here({"hutch.replica": "api-1", "hutch.deployment": "two"})
    assert not here._placed_here({"hutch.replica": "api-2", "hutch.deployment": "one"})
    assert not here._placed_here({"hutch.replica": "api-2"})
