"""Third adversarial pass on issue 32 (what the server keeps for a tenant): an attacker with a
member key of an organization whose storage quota is small, looking for bytes the server
keeps, or holds, past what the fix of sec-retain bounds (command output: quota, cut,
retention; argv: its first 4 KiB in the log). In process, fake driver, on both profiles
(embedded: files and SQLite; production: PostgreSQL and Kafka)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from hutch.api.keys import ENGINE
from hutch.core import runtimes
from hutch.core.events import encode
from hutch.drivers.local import layers
from hutch.service import input_streams
from tests.adversarial.test_output_quota import END_RECORD, QUOTA, Tenant, tenant, usage
from tests.api.conftest import Api, AppFactory, make_api, profile  # noqa: F401  (fixtures)

KIB = 1024


@pytest.fixture
def driver_name() -> str:
    return "fake"


async def logged_bytes(api: Api, sandbox_id: str) -> int:
    """What the event log keeps for a sandbox: its records as they are stored (JSON)."""
    events = await api.client.app[ENGINE].parts.log.read(0, sandbox_id=sandbox_id)
    return sum(len(json.dumps(encode(e), separators=(",", ":"))) for e in events)


async def create_stdin(t: Tenant) -> tuple[int, str]:
    resp = await t.api.client.post("/streams", json={"name": "in"}, headers=t.auth)
    return resp.status, str((await resp.json()).get("id"))


async def test_env_changes_grow_the_event_log_past_the_storage_quota(make_api: AppFactory) -> None:  # noqa: F811
    """The argv of a command is cut to 4 KiB in its event; an env change is recorded whole (the
    env is the log's to replay). A member sets two 120 KiB variables twenty times (each value
    different, as a loop would): before, the log of one sandbox kept about 4.9 MB for an
    organization whose storage quota is 256 KiB, and a loop grew the log every tenant shares
    without bound. Now what a sandbox's events take in the log counts as usage eventBytes
    (in storageBytes), and a change that would pass the quota is refused before it is
    recorded (403 QUOTA_EXCEEDED naming the event log)."""
    api = await make_api()
    t = await tenant(api, "envious")
    sid = await t.sandbox()
    before = await logged_bytes(api, sid)
    assert (await usage(t))["eventBytes"] == before
    refused: list[dict] = []
    for i in range(20):
        value = f"{i:04d}" + "x" * (120 * KIB)  # one variable may be 128 KiB, the env 256 KiB
        resp = await api.client.patch(f"/sandbox/env/{sid}", json={"env": {"A": value, "B": value}}, headers=t.auth)
        if resp.status != 200:
            refused.append({"status": resp.status, **await resp.json()})
    grown = await logged_bytes(api, sid) - before
    assert grown <= QUOTA + 64 * KIB, f"the event log grew by {grown} bytes under a {QUOTA}-byte storage quota"
    assert len(refused) == 19, refused[:1]  # the first change (~240 KiB) fits beside the create; no second
    first = refused[0]
    assert first["status"] == 403 and first["code"] == "QUOTA_EXCEEDED" and "event log" in first["message"], first
    used = await usage(t)
    assert used["eventBytes"] == await logged_bytes(api, sid) and used["storageBytes"] <= QUOTA, used
    small = await t.call("PATCH", f"/sandbox/env/{sid}", json={"env": {"A": "fits"}})  # what fits is recorded
    assert (await usage(t))["eventBytes"] == await logged_bytes(api, sid) > used["eventBytes"], small


async def test_one_organization_cannot_take_every_stdin_stream(
        make_api: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """stdin streams (POST /streams) were bounded per server only (1000, each holding up to 16
    chunks of an upload, ~1 MiB, for up to 10 minutes): one member could take all of them, so
    that for 10 minutes no other organization could give a command stdin (nor run
    ``ssh host 'cmd'``, which makes one), and the server held ~1 GiB of its uploads. Now an
    organization has at most MAX_STREAMS_PER_ORG of them; the server's cap stays. Shrunk here
    (30 a server, 10 an organization) so the test is cheap; before the fix the victim got
    413 "too many open stdin streams" once the attacker held 30. A stream its command is done
    with holds nothing and frees its place at once (it is forgotten a minute later)."""
    monkeypatch.setattr(input_streams, "MAX_STREAMS", 30)
    monkeypatch.setattr(input_streams, "MAX_STREAMS_PER_ORG", 10, raising=False)
    api = await make_api()
    attacker, victim = await tenant(api, "hoarder"), await tenant(api, "bystander")
    made: list[str] = []
    for _ in range(31):
        status, stream_id = await create_stdin(attacker)
        if status != 201:
            assert status == 413, status
            break
        made.append(stream_id)
    assert len(made) == 10, f"one organization holds {len(made)} stdin streams"
    resp = await api.client.post("/streams", json={}, headers=attacker.auth)
    body = await resp.json()
    assert resp.status == 413 and "organization org_hoarder" in body["message"], body
    assert (await create_stdin(victim))[0] == 201
    sid = await attacker.sandbox()
    ex = await attacker.call("POST", f"/sandbox/{sid}/execute", json={"command": ["true"], "stream": {"stdin": made[0]}})
    done = await attacker.call("GET", f"/sandbox/execution/{ex['data']['executionId']}?wait=10s")
    assert done["data"]["status"] == "completed", done
    assert (await create_stdin(attacker))[0] == 201


def tree_bytes(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


async def test_an_install_layer_is_not_kept_past_its_retention_and_never_under_its_sandbox(
        make_api: AppFactory) -> None:  # noqa: F811
    """Local driver. npm ``packages`` are built once into a layer under the runtime cache and
    shared by every create that asks for the same list; the layer's key is the list as
    written, so ``json@>=1.0.0-r1``, ``json@>=1.0.0-r2``, … each install json 11.0.0 again into
    a new layer. The layers are the server's cache (HUTCH_LAYER_CACHE_MAX bounds them all,
    HUTCH_LAYER_RETENTION drops the unused), not an organization's storage: here, with a
    retention of 0s, a sweep leaves the layer while its sandbox runs over it and drops it
    once the sandbox went, so no spelling outlives its use uncounted."""
    api = await make_api(driver="local", output_retention="0s", layer_retention="0s")
    engine = api.client.app[ENGINE]
    t = await tenant(api, "installer")
    spec = f"json@>=1.0.0-r{time.time_ns()}"  # a spelling no one asked for before: a new layer
    made = await t.call("POST", "/sandbox", json={"runtime": "base:latest", "packages": [spec]}, expect=201)
    sid = made["data"]["sandboxId"]
    ran = await t.call("POST", f"/sandbox/{sid}/execute", json={"command": ["true"]})  # waits for the create
    recipe = runtimes.find("base:latest")
    assert recipe is not None
    key = layers.layer_key(recipe, (), (spec,))
    layer = layers.layer_path(engine.parts.driver.runtime_cache, key)
    assert layer.is_dir(), (ran, layer)
    try:
        # The cache is the host's: this sweep also drops other unused layers (a cache's churn).
        dropped = await engine.parts.driver.layers.sweep(now=time.time() + 60)
        assert key not in dropped and layer.is_dir(), "a sweep dropped the layer its live sandbox is mounted over"
        ran = await t.call("POST", f"/sandbox/{sid}/execute",
                           json={"command": ["sh", "-c", "ls /usr/local/lib/node_modules/json/package.json"]})
        done = await t.call("GET", f"/sandbox/execution/{ran['data']['executionId']}?wait=30s")
        assert done["data"]["exitCode"] == 0, done
        await t.call("DELETE", f"/sandbox/{sid}")
        await engine.retention.sweep(now=time.time() + 60)
        for _ in range(50):  # a destroyed sandbox's mount may outlive it a moment (a helper exiting)
            if key in await engine.parts.driver.layers.sweep(now=time.time() + 60):
                break
            await asyncio.sleep(0.2)
        used = await usage(t)  # its records in the event log are counted apart (eventBytes): not the layer
        kept, counted = (tree_bytes(layer) if layer.exists() else 0), used["storageBytes"] - used["eventBytes"]
        assert kept <= counted, f"{kept} bytes of its install layer kept after the sandbox went, {counted} counted"
    finally:  # the test's own layer (its key is this run's): the shared cache is not the test's to fill
        shutil.rmtree(layer.parent, ignore_errors=True)


async def test_an_install_larger_than_the_layer_cache_is_refused_naming_the_limit(
        make_api: AppFactory) -> None:  # noqa: F811
    """One install bigger than the whole cache may be is refused (413, naming the setting),
    and leaves nothing in the cache."""
    api = await make_api(driver="local", layer_cache_max="4Ki")
    engine = api.client.app[ENGINE]
    t = await tenant(api, "hoarder")
    spec = f"json@>=1.0.0-r{time.time_ns()}"
    recipe = runtimes.find("base:latest")
    assert recipe is not None
    layer = layers.layer_path(engine.parts.driver.runtime_cache, layers.layer_key(recipe, (), (spec,)))
    try:
        refused = await t.call("POST", "/sandbox", json={"runtime": "base:latest", "packages": [spec]}, expect=413)
        text = json.dumps(refused)
        assert "HUTCH_LAYER_CACHE_MAX" in text and "packages" in text, refused
        assert not layer.exists(), layer
    finally:
        shutil.rmtree(layer.parent, ignore_errors=True)


async def test_a_nomad_install_leaves_no_layer_on_the_host_once_its_image_is_pushed(
        make_api: AppFactory) -> None:  # noqa: F811
    """Nomad driver. An install is built on the server's host as the local driver builds it,
    then pushed to the registry as a derived image; the host's tree is a leftover from then
    on (the registry is asked first), so it must not pile up there for every spelling. (The
    derived images in the registry are not bounded: docs/security.md says so.)"""
    from hutch.drivers.local import rootfs

    api = await make_api(driver="nomad")
    t = await tenant(api, "nomad-installer", quota=None)
    spec = f"json@>=1.0.0-r{time.time_ns()}"
    recipe = runtimes.find("base:latest")
    assert recipe is not None
    layer = layers.layer_path(rootfs.default_cache(), layers.layer_key(recipe, (), (spec,)))
    try:
        made = await t.call("POST", "/sandbox", json={"runtime": "base:latest", "packages": [spec]}, expect=201)
        sid = made["data"]["sandboxId"]
        ran = await t.call("POST", f"/sandbox/{sid}/execute",
                           json={"command": ["sh", "-c", "ls /usr/local/lib/node_modules/json/package.json"]})
        done = await t.call("GET", f"/sandbox/execution/{ran['data']['executionId']}?wait=60s")
        assert done["data"]["exitCode"] == 0, done
        assert not layer.parent.exists(), f"{tree_bytes(layer)} bytes of a pushed install kept at {layer}"
        await t.call("DELETE", f"/sandbox/{sid}")
    finally:
        shutil.rmtree(layer.parent, ignore_errors=True)


async def test_the_sweep_spares_running_output_and_other_tenants_and_counts_down_to_zero(
        make_api: AppFactory) -> None:  # noqa: F811
    """Retention "0s": a sandbox destroyed while its job writes is final at once, so a sweep
    may meet its stream still open; it leaves it (counted) until it closes, then drops it
    and counts the organization down to 0, never below, and leaves another organization's
    live output alone. Holds (a probe, not a finding)."""
    api = await make_api(output_retention="0s")
    engine = api.client.app[ENGINE]
    t, other = await tenant(api, "leaver"), await tenant(api, "neighbour")
    sid, theirs = await t.sandbox(), await other.sandbox()
    assert (await other.execute(theirs, 50 * KIB))[0] == 200
    job = (await t.call("POST", f"/sandbox/sandboxes/{sid}/jobs",
                        json={"command": ["sh", "-c", "yes 40000; sleep 1; yes 30000"]}, expect=201))["data"]
    for _ in range(50):  # its first bytes are kept (and counted) before the sandbox goes
        if await engine.parts.outputs.stored(t.org) >= 40000:
            break
        await asyncio.sleep(0.02)
    assert await engine.parts.outputs.stored(t.org) >= 40000
    await t.call("DELETE", f"/sandbox/{sid}")
    for _ in range(30):  # while the job runs on, if it does: its bytes stay counted
        await engine.retention.sweep()
        stored = await engine.parts.outputs.stored(t.org)
        assert stored >= 0, stored
        if not await engine.parts.outputs.is_open(job["stdoutStreamUrl"].rsplit("/", 1)[1]):
            break
        await asyncio.sleep(0.1)
    await engine.retention.sweep()
    assert await engine.parts.outputs.stored(t.org) == 0 and (await usage(t))["outputBytes"] == 0
    assert await engine.parts.outputs.stored(other.org) == 50 * KIB  # live: kept


async def test_a_snapshot_taken_while_a_job_runs_does_not_double_spend_the_room(
        make_api: AppFactory) -> None:  # noqa: F811
    """Low. A job starts with the whole 256 KiB room to fill and sleeps; meanwhile the member
    snapshots 200 KiB of random files (allowed: nothing is stored yet); then the job writes
    200 KiB. Before, the room its budget was given was the room the snapshot was checked
    against too: the organization stored 409,600 bytes under its 262,144-byte quota. Now a
    snapshot, checkpoint or upload made while commands run comes out of their room
    (Quotas.charge), and the job is cut where the quota ends."""
    api = await make_api()
    t = await tenant(api, "doublespend")
    sid = await t.sandbox()
    blob = base64.b64encode(os.urandom(200 * KIB)).decode()
    await t.call("POST", f"/fs/{sid}", json={"files": [{"path": "noise.bin", "content": blob}]})
    job = (await t.call("POST", f"/sandbox/sandboxes/{sid}/jobs",
                        json={"command": ["sh", "-c", "sleep 1; yes 204800"]}, expect=201))["data"]
    await t.call("POST", f"/sandbox/{sid}/snapshot", json={"name": "noise"}, expect=201)
    for _ in range(100):
        if (await t.call("GET", f"/sandbox/sandboxes/{sid}/jobs/{job['jobId']}"))["data"]["status"] != "running":
            break
        await asyncio.sleep(0.05)
    used = await usage(t)
    assert QUOTA <= used["storageBytes"] <= QUOTA + END_RECORD, used  # past it by the job's end record only
    done = (await t.call("GET", f"/sandbox/execution/{job['jobId']}"))["data"]
    assert done["outputTruncated"] and used["outputBytes"] < QUOTA - 200 * KIB, (done, used)


async def test_a_quota_set_while_a_job_runs_bounds_that_jobs_output(make_api: AppFactory) -> None:  # noqa: F811
    """Low. A member of an organization without a storage quota starts a job that sleeps,
    then writes 300 KiB; the operator sets a 256 KiB storage quota in between. Before, the job
    kept all 300 KiB (a command started without a quota had no output budget). Now every
    organization's commands share a budget, unlimited while it has no quota and counted
    afresh when its quota changes (Quotas.requota, as the change is projected): the job is
    cut where the new quota ends."""
    api = await make_api()
    t = await tenant(api, "early", quota=None)
    sid = await t.sandbox()
    job = (await t.call("POST", f"/sandbox/sandboxes/{sid}/jobs",
                        json={"command": ["sh", "-c", "sleep 1; yes 307200"]}, expect=201))["data"]
    await api.data("PATCH", f"/orgs/{t.org}/quota", json={"snapshotBytes": QUOTA})  # the operator
    for _ in range(100):
        if (await t.call("GET", f"/sandbox/sandboxes/{sid}/jobs/{job['jobId']}"))["data"]["status"] != "running":
            break
        await asyncio.sleep(0.05)
    used = await usage(t)
    assert used["storageBytes"] <= QUOTA + END_RECORD, used  # past it by the job's end record only
    done = (await t.call("GET", f"/sandbox/execution/{job['jobId']}"))["data"]
    assert done["outputTruncated"] and 0 < used["outputBytes"] < QUOTA, (done, used)
