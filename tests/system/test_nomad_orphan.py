"""Nothing half-made on the nomad path (issue 35): an API replica killed -9 after it placed a
sandbox's Nomad job and before it recorded the sandbox leaves a job no event records. Once its
lease lapsed, the surviving replica that takes its sandboxes over finds the job by the name
hutch gives it (``hutch-<instance>-<sandbox id>``, the instance being the dead replica's),
stops it and purges it. One made from a warm pool entry bears no sandbox id in its name, and a
replica killed before it wrote the create's handle leaves only a pool job of its own: ended by the
take-over too, as every pool job the lost replica placed. Against the real single-node Nomad
(HUTCH_NOMAD_*), not the cluster."""

from __future__ import annotations

import contextlib
import hashlib
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hutch.core.replicas import LEASE_SECONDS, RENEW_SECONDS
from tests.drivers_support import NOMAD_ADDR, NOMAD_TOKEN
from tests.system.server import KEY, Server

pytestmark = pytest.mark.slow

ENDED_WITHIN = LEASE_SECONDS + 2 * RENEW_SECONDS + 20  # the lease, a take-over round, the job's stop


def _jobs() -> dict[str, str]:
    import nomad

    return {j["ID"]: j["Status"] for j in nomad.Nomad(address=NOMAD_ADDR, token=NOMAD_TOKEN).jobs.get_jobs(prefix="hutch-")}


def _purge(job: str) -> None:
    import nomad

    nomad.Nomad(address=NOMAD_ADDR, token=NOMAD_TOKEN).job.deregister_job(job, purge=True)


def test_a_nomad_job_its_replica_died_before_recording_is_stopped_and_purged(
        tmp_path: Path, shared: Callable[[], dict[str, str]]) -> None:
    env: dict[str, Any] = shared()
    survivor = Server(tmp_path / "b", driver="nomad", **env).start(timeout=120)
    doomed = Server(tmp_path / "a", driver="nomad", HUTCH_CRASH_AT="create-made-unrecorded", **env).start(timeout=120)
    job: str | None = None
    try:
        before = set(_jobs())
        with pytest.raises((ConnectionError, urllib.error.URLError)):  # no answer: the replica is gone
            doomed.call("POST", "/sandbox", {}, timeout=120)
        assert doomed.proc is not None and doomed.proc.wait(10) == -9, "the replica did not die at the crash point"
        killed = time.monotonic()
        made = [(job, status) for job, status in _jobs().items() if job not in before and "-sbx_" in job]
        assert len(made) == 1 and made[0][1] != "dead", f"expected the one job the replica placed: {made}"
        job = made[0][0]
        sid = job[job.index("sbx_"):]
        status, _ = survivor.call("GET", f"/sandbox/{sid}?includeDeleted=true")
        assert status == 404  # no event records it
        while job in _jobs():
            assert time.monotonic() - killed < ENDED_WITHIN, (
                f"job {job} still placed {ENDED_WITHIN:.0f} s after its replica died: nothing recorded it")
            time.sleep(0.5)
        print(f"the orphan's job was purged {time.monotonic() - killed:.1f} s after its replica died")
        status, body = survivor.call("GET", f"/sandbox/{sid}?includeDeleted=true")
        assert status == 404, body  # ended, not recorded after the fact
    finally:
        with contextlib.suppress(Exception):
            survivor.destroy_every_sandbox()
        for s in (doomed, survivor):
            s.stop()
        if job is not None and job in _jobs():  # the test failed: what it made does not outlive it
            _purge(job)


def _meta(job: str) -> dict[str, str]:
    import nomad

    return nomad.Nomad(address=NOMAD_ADDR, token=NOMAD_TOKEN).job.get_job(job).get("Meta") or {}


def _pool_ready(server: Server) -> int:
    req = urllib.request.Request(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith('hutch_nomad_pool_ready{runtime="base:latest"}'):
            return int(float(line.split()[-1]))
    return 0


def test_a_warm_pool_job_its_replica_claimed_and_died_before_recording_is_purged(
        tmp_path: Path, shared: Callable[[], dict[str, str]]) -> None:
    env: dict[str, Any] = shared()
    survivor = Server(tmp_path / "b", driver="nomad", HUTCH_NOMAD_POOL="base:latest=1", **env).start(timeout=120)
    doomed = Server(tmp_path / "a", driver="nomad", HUTCH_NOMAD_POOL="base:latest=1",
                    HUTCH_CRASH_AT="create-made-unhandled", **env).start(timeout=120)
    prefix = f"hutch-{hashlib.sha256(str((tmp_path / 'a').resolve()).encode()).hexdigest()[:8]}-pool-"
    theirs = f"hutch-{hashlib.sha256(str((tmp_path / 'b').resolve()).encode()).hexdigest()[:8]}-pool-"
    pooled: set[str] = set()
    try:
        for server in (doomed, survivor):
            deadline = time.monotonic() + 120
            while _pool_ready(server) < 1:
                assert time.monotonic() < deadline, "no warm pool entry within 120 s"
                time.sleep(0.5)
        pooled = {job for job, status in _jobs().items() if job.startswith(prefix) and status != "dead"}
        assert len(pooled) == 1, pooled  # the entry the create claims
        assert _meta(next(iter(pooled))).get("hutch.replica"), "pool job not marked with its replica"
        with pytest.raises((ConnectionError, urllib.error.URLError)):  # no answer: the replica is gone
            doomed.call("POST", "/sandbox", {}, timeout=120)
        assert doomed.proc is not None and doomed.proc.wait(10) == -9, "the replica did not die at the crash point"
        killed = time.monotonic()
        assert not [job for job in _jobs() if job.startswith(prefix.removesuffix("pool-") + "sbx_")], \
            "the create placed a job of its own instead of claiming the warm pool's"
        survivors_own = {job for job, status in _jobs().items() if job.startswith(theirs) and status != "dead"}
        assert survivors_own, "the survivor's own pool job is missing"
        left = set(pooled)
        while left & set(_jobs()):
            assert time.monotonic() - killed < ENDED_WITHIN, (
                f"claimed pool job {sorted(left)} still placed {ENDED_WITHIN:.0f} s after its replica died")
            time.sleep(0.5)
        print(f"the claimed pool job was purged {time.monotonic() - killed:.1f} s after its replica died")
        # Everything else the lost replica placed ahead (its refill) goes too; a live replica's stays.
        deadline = time.monotonic() + 30
        while any(job.startswith(prefix) for job in _jobs()):
            assert time.monotonic() < deadline, f"the lost replica's pool left: {sorted(_jobs())}"
            time.sleep(0.5)
        assert survivors_own <= set(_jobs()), "the survivor's own warm pool job was touched"
    finally:
        with contextlib.suppress(Exception):
            survivor.destroy_every_sandbox()
        for s in (doomed, survivor):
            s.stop()
        for job in _jobs():  # the test failed: what it made does not outlive it
            if job.startswith(prefix) or job.startswith(theirs):
                with contextlib.suppress(Exception):
                    _purge(job)
