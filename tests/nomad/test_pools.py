"""Adaptive warm pools (drivers/nomad/pools.py): the sizing policy by itself, its settings, and
the nomad driver keeping real idle allocations on the dev agent as the policy says."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hutch.core.errors import InvalidInput
from hutch.drivers.base import ExecRequest, ProvisionRequest
from hutch.drivers.nomad.driver import NomadDriver
from hutch.drivers.nomad.pools import PoolSizing, pool_sizing_from_env
from tests.drivers_support import Recorder, new_id, start_nomad


def test_fixed_sizes_are_what_they_say() -> None:
    sizing = pool_sizing_from_env("base:latest=2,python:3.13=0")
    assert not sizing.adaptive and sizing.targets(nodes=3) == {"base:latest": 2}
    assert pool_sizing_from_env("off").targets(3) == {} and pool_sizing_from_env("").targets(3) == {}


def test_adaptive_sizes_follow_the_create_rate_and_drain_when_idle() -> None:
    s = PoolSizing(fixed=None, window=60, idle_after=120)
    assert s.targets(nodes=3, now=0) == {"base:latest": 1}  # a fresh install's creates are warm
    for i in range(60):  # one create a second of python:3.13, placements taking 2 s
        s.record_create("python:3.13", now=i)
    for _ in range(10):
        s.record_placement(2.0)
    wanted = s.targets(nodes=3, now=60)
    assert wanted["python:3.13"] >= 3 and wanted["base:latest"] == 1, wanted
    assert s.targets(nodes=3, now=100)["python:3.13"] >= 1  # slowed down: smaller, still warm
    assert "python:3.13" not in s.targets(nodes=3, now=200)  # idle for idle_after: drained
    assert s.targets(nodes=3, now=200) == {"base:latest": 1}


def test_adaptive_sizes_stay_within_the_memory_budget() -> None:
    s = PoolSizing(fixed=None, memory_budget_mb=1024, window=60)  # 2 idle allocations (512 MiB) per node
    for rt in ("python:3.13", "node:22"):
        for i in range(120):
            s.record_create(rt, now=i / 2)
    assert sum(s.targets(nodes=1, now=60).values()) == 2
    assert all(n >= 1 for n in s.targets(nodes=1, now=60).values() if n)
    assert sum(s.targets(nodes=3, now=60).values()) <= 6
    assert s.targets(nodes=0, now=60) == dict.fromkeys(s.targets(nodes=1, now=60), 0)


@pytest.mark.parametrize(("value", "memory", "named"), [
    ("base:latest", None, "HUTCH_NOMAD_POOL"), ("base:latest=two", None, "HUTCH_NOMAD_POOL"),
    ("auto", "lots", "HUTCH_NOMAD_POOL_MEMORY")])
def test_bad_settings_name_the_setting(value: str, memory: str | None, named: str) -> None:
    with pytest.raises(InvalidInput) as err:
        pool_sizing_from_env(value, memory)
    assert named in err.value.message and (memory or value.split("=")[-1]) in err.value.message


async def wait_for(check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_the_driver_keeps_adaptive_pools_on_nomad(tmp_path: Path) -> None:
    sizing = PoolSizing(fixed=None, window=5, idle_after=5)
    driver = await start_nomad(tmp_path / "data", pool_sizing=sizing)
    assert isinstance(driver, NomadDriver)
    pools = lambda: driver.pool_metrics()["pools"]  # noqa: E731
    try:
        assert driver.pool_metrics()["mode"] == "auto"
        await wait_for(lambda: pools().get("base:latest", {}).get("ready") == 1)  # warm from the start
        t = time.perf_counter()
        await driver.provision(ProvisionRequest("pool-a", "base:latest"))
        assert time.perf_counter() - t < 0.5 and driver.pool_metrics()["claims"] == 1
        await wait_for(lambda: pools()["base:latest"]["ready"] >= 1)  # refilled
        await driver.provision(ProvisionRequest("pool-b", "python:3.13"))  # cold: nothing asked before
        assert driver.pool_metrics()["misses"] == 1
        await wait_for(lambda: pools().get("python:3.13", {}).get("ready") == 1)  # now it is wanted
        # Nobody creates python:3.13 any more: its pool drains (the default runtime's stays).
        await wait_for(lambda: pools()["python:3.13"]["ready"] == 0 and pools()["python:3.13"]["target"] == 0,
                       timeout=30)
        assert pools()["base:latest"]["ready"] >= 1
        # In Nomad: the pool's idle allocations and the claimed one's job (now pool-a's), no more.
        wanted = {e.job_id for p in driver._pool.values() for e in p} | {sb.job_id for sb in driver._sandboxes.values()}
        deadline = time.monotonic() + 30
        while (left := {j["ID"] for j in await driver._client.jobs(driver._job_prefix() + "pool-")}) - wanted:
            assert time.monotonic() < deadline, (left, wanted)
            await asyncio.sleep(0.2)
    finally:
        for sid in ("pool-a", "pool-b"):
            await driver.destroy(sid)
        await driver.close()


@pytest.mark.parametrize("pooled", [True, False], ids=["claimed", "placed"])
async def test_a_create_whose_state_file_cannot_be_written_leaves_no_job_running(tmp_path: Path,
                                                                                 pooled: bool) -> None:
    """The disk is full as the create records its sandbox (its state file's temp file is
    /dev/full, which answers every write with ENOSPC). It used to leave the Nomad job it claimed
    from the warm pool (or placed) running, in no pool and recorded nowhere, until a restart;
    now the job is stopped and purged, and the error names the state file and the full disk."""
    from hutch.core.errors import DriverFailure
    from hutch.drivers.base import ResourceLimits

    driver = await start_nomad(tmp_path / "data", pool_sizes={"base:latest": 1})
    assert isinstance(driver, NomadDriver)
    try:
        await wait_for(lambda: driver.pool_metrics()["pools"]["base:latest"]["ready"] == 1)
        entry = driver._pool["base:latest"][0]
        sid = "full-disk"
        (driver.state_dir / f"{sid}.tmp").symlink_to("/dev/full")
        before = {j["ID"] for j in await driver._client.jobs(driver._job_prefix())}
        resources = ResourceLimits() if pooled else ResourceLimits(memory_bytes=128 * 2**20)  # other: never pooled
        with pytest.raises(DriverFailure) as err:
            await driver.provision(ProvisionRequest(sid, "base:latest", resources=resources))
        assert driver.pool_metrics()["claims"] == int(pooled)
        assert "state file" in err.value.message and "No space left on device" in err.value.message, err.value
        # No host path and no Nomad job id in what the tenant gets (docs/security.md)
        assert str(driver.state_dir) not in err.value.message and "hutch-" not in err.value.message, err.value
        assert sid not in await driver.alive() and sid not in driver._agents._agents  # its session ended
        made = entry.job_id if pooled else driver._job_prefix() + sid
        assert pooled or made not in before
        # Stopped and purged by the time the create's error is answered: nothing runs unrecorded.
        assert made not in {j["ID"] for j in await driver._client.jobs(driver._job_prefix())}, made
        if pooled:
            assert not await driver._alloc_running(entry.job_id, entry.alloc_id)
            await wait_for(lambda: driver.pool_metrics()["pools"]["base:latest"]["ready"] == 1)  # refilled
            assert driver._pool["base:latest"][0].job_id != entry.job_id
        (driver.state_dir / f"{sid}.tmp").unlink()
        sid2 = f"{sid}-again"  # the disk has room again: the next create is made and recorded
        await driver.provision(ProvisionRequest(sid2, "base:latest", resources=resources))
        assert sid2 in await driver.alive() and driver._states.path(sid2).exists()
    finally:
        for s in await driver.alive():
            await driver.destroy(s)
        await driver.close()


async def test_a_returning_replica_never_hands_out_a_pool_job_its_survivor_purges(tmp_path: Path) -> None:
    """api-1 is killed -9 with two idle pool jobs placed; api-2 takes it over, lists them
    (lost_leftovers) and, once its sandboxes are taken over, stops and purges them one by one
    (discard_leftovers), keeping any a recorded handle names as it read them at the start.
    api-1 restarts meanwhile. Its recovery took its old idle jobs back into its pool; a create
    claimed one and recorded its handle after the survivor had read the handles, and the
    survivor then stopped it: a sandbox answered created, ended a second later ("allocation
    ended"). A replica told at its start that it was taken over (Replicas.taken_over) now stops
    its old idle pool jobs (the survivor's to end) instead; its creates claim fresh ones."""
    from hutch.drivers.nomad.client import NomadNotFound

    async def ready(driver: NomadDriver, n: int) -> None:
        await wait_for(lambda: driver.pool_metrics()["pools"]["base:latest"]["ready"] >= n
                       and driver.pool_metrics()["pools"]["base:latest"]["starting"] == 0)

    def replica(name: str, **more: object) -> dict[str, object]:
        return {"replica": {"replica_id": name, "deployment": "one", **more}}

    lost = await start_nomad(tmp_path / "a", pool_sizes={"base:latest": 2}, **replica("api-1"))
    assert isinstance(lost, NomadDriver)
    await ready(lost, 2)

    async def drain_nothing() -> None:  # killed -9: its idle pool jobs stay placed
        pass

    lost._drain_pools = drain_nothing  # type: ignore[method-assign]
    await lost.close()
    survivor = await start_nomad(tmp_path / "b", **replica("api-2"))
    returned: NomadDriver | None = None
    assert isinstance(survivor, NomadDriver)
    try:
        leftovers = await survivor.lost_leftovers("api-1")
        assert len(leftovers) == 2, leftovers
        started = await start_nomad(tmp_path / "a", pool_sizes={"base:latest": 2},
                                    **replica("api-1", taken_over=True))
        assert isinstance(started, NomadDriver)
        returned = started
        await ready(returned, 1)
        handed = {e.job_id for e in returned._pool["base:latest"]}
        assert not handed & set(leftovers), f"the returning replica took back {handed & set(leftovers)}"
        # The handles in the owner rows: what returned records as its creates are made.
        read = asyncio.Event()

        async def owner_rows() -> list[dict[str, str]]:
            assert returned is not None
            rows = [h for sid in returned._sandboxes if (h := returned.handle(sid)) is not None]
            read.set()
            return rows

        survivor.set_foreign(owner_rows)
        # The one returned would hand out next is ended last (for the old code's sake: it is a leftover).
        nxt = returned._pool["base:latest"][0].job_id
        sweep = asyncio.create_task(survivor.discard_leftovers(sorted(leftovers, key=lambda j: j == nxt), []))
        await read.wait()
        sid = "after-return"
        await returned.provision(ProvisionRequest(sid, "base:latest"))
        sb = returned._sandboxes[sid]
        await sweep
        await asyncio.sleep(1)  # its allocation watch would have seen a stop by now
        assert sid in await returned.alive() and await returned._alloc_running(sb.job_id, sb.alloc_id), \
            "the survivor's sweep ended a sandbox the returning replica made and recorded"
        for job_id in leftovers:  # the lost replica's idle ones all went, whoever stopped them
            with contextlib.suppress(NomadNotFound):
                allocs = await survivor._client.job_allocations(job_id)
                assert not [a for a in allocs if a.get("ClientStatus") in ("pending", "running")
                            and a.get("DesiredStatus") == "run"], job_id
    finally:
        if returned is not None:
            for s in await returned.alive():
                await returned.destroy(s)
            await returned.close()
        with contextlib.suppress(Exception):
            await survivor.discard_leftovers(await survivor.lost_leftovers("api-1"), [])
        await survivor.close()


async def test_a_job_purged_outside_hutch_is_never_handed_out_and_its_sandbox_ends(tmp_path: Path) -> None:
    """A pool job purged at once (``nomad job stop -purge``, or a sweep that does not wait for
    the task) leaves Nomad's allocation list with no stopped state in between. The watch looked
    only at the allocations the list had: the entry stayed in the pool for good, and the next
    create was answered with a sandbox whose job was gone, which nothing ever reported ended.
    Now an allocation the list lacks is asked for once, and one Nomad no longer has is gone:
    the entry leaves the pool (refilled), a sandbox ends with a lifecycle event."""
    driver = await start_nomad(tmp_path / "data", pool_sizes={"base:latest": 1})
    assert isinstance(driver, NomadDriver)
    ended: list[tuple[str, str, bool]] = []

    async def listener(sid: str, reason: str, failed: bool) -> None:
        ended.append((sid, reason, failed))

    driver.set_listener(listener)
    pool = lambda: driver._pool["base:latest"]  # noqa: E731
    try:
        await wait_for(lambda: len(pool()) == 1)
        purged = pool()[0]
        await driver._client.deregister(purged.job_id, purge=True)
        await wait_for(lambda: purged not in pool(), timeout=10)
        await wait_for(lambda: len(pool()) == 1)  # refilled with a live one
        sid = new_id()
        await driver.provision(ProvisionRequest(sid, "base:latest"))
        sb = driver._sandboxes[sid]
        assert driver.pool_metrics()["claims"] == 1 and sb.job_id != purged.job_id
        sink = Recorder()
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ["echo", "live"]), sink)
        assert (result.exit_code, sink.stdout) == (0, "live\n")
        await driver._client.deregister(sb.job_id, purge=True)  # now the sandbox's own job
        await wait_for(lambda: bool(ended), timeout=10)
        assert ended[0][0] == sid and ended[0][2] is True and "purged" in ended[0][1], ended
        assert sid not in await driver.alive()
    finally:
        for s in await driver.alive():
            await driver.destroy(s)
        await driver.close()
