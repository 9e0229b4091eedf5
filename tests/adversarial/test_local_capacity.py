"""Can one tenant take the whole host? On the local driver, creates past what the host takes
(its sandbox count, the memory its sandboxes' limits commit, the memory it has available) are
refused 503 NO_CAPACITY naming what is short, with nothing recorded or left: no event, no
sandbox directory, no cgroup; a one-shot, a create from a snapshot and a fork alike. A size
the host could not hold even empty is a 400 naming resources.memory instead. Before,
the local driver made every one, until the host's memory was committed many times over or its
pids ran out, and every tenant's sandboxes and the server met the OOM killer.

The host is made small by its settings (HUTCH_MAX_SANDBOXES, HUTCH_MEMORY_COMMIT_LIMIT), the
check left as it runs. In process, the local driver, embedded profile.
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import re

import pytest

from hutch.api.keys import ENGINE
from hutch.drivers.local.state import SAFE_ID
from tests.api.conftest import AUTH, Api, AppFactory
from tests.api.test_tenancy import bearer, new_key, new_org

pytestmark = pytest.mark.runs_on("local-embedded")

FULL = ("no room for a sandbox of 512Mi memory: the host runs its maximum of 2 sandboxes; "
        "try again once sandboxes end")


def traces(api: Api) -> tuple[set[str], set[str]]:
    """The sandbox directories and cgroups the server's driver holds (not its warm pool's)."""
    driver = api.client.server.app[ENGINE].parts.driver
    root = driver.data_dir / "sandboxes"  # type: ignore[attr-defined]
    instance = hashlib.sha256(str(driver.data_dir.resolve()).encode()).hexdigest()[:12]  # type: ignore[attr-defined]
    dirs = {p.name for p in root.iterdir() if SAFE_ID.match(p.name)}
    cgroups = {path for path in glob.glob(f"/sys/fs/cgroup/*/hutch/{instance}/*") if SAFE_ID.match(path.rsplit("/", 1)[1])}
    return dirs, cgroups


async def refused(api: Api, method: str, path: str, message: str, **kw: object) -> None:
    """``method path`` answers 503 NO_CAPACITY with ``message``, and records and leaves nothing."""
    log = api.client.server.app[ENGINE].parts.log
    before, left = await log.last_position(), traces(api)
    listed = await api.data("GET", "/sandbox?includeDeleted=true")
    snapshots = await api.data("GET", "/sandbox/snapshots?forks=true")
    body = await api.call(method, path, expect=503, **kw)
    assert body["code"] == "NO_CAPACITY" and re.fullmatch(message, body["message"]), body
    assert await log.last_position() == before, "a refused create recorded an event"
    assert await api.data("GET", "/sandbox?includeDeleted=true") == listed
    assert await api.data("GET", "/sandbox/snapshots?forks=true") == snapshots
    assert traces(api) == left, "a refused create left a directory or a cgroup"


async def test_creates_past_the_hosts_sandboxes_are_refused_and_leave_nothing(make_api: AppFactory) -> None:
    api = await make_api(max_sandboxes=2)
    first = (await api.data("POST", "/sandbox", json={}, expect=201))["sandboxId"]
    await api.call("POST", f"/fs/{first}", json={"files": [{"path": "kept", "content": "QUJD"}]})
    snap = await api.data("POST", f"/sandbox/{first}/snapshot", json={}, expect=201)
    # A fork of two with room for one: refused whole, before its snapshot is taken.
    await refused(api, "POST", f"/sandbox/{first}/fork", re.escape(FULL), json={"count": 2})
    second = (await api.data("POST", "/sandbox", json={}, expect=201))["sandboxId"]
    for body in ({}, {"command": {"exec": ["true"], "mode": "oneshot"}}, {"snapshot": snap["snapshotId"]}):
        await refused(api, "POST", "/sandbox", re.escape(FULL), json=body)
    await refused(api, "POST", f"/sandbox/{first}/fork", re.escape(FULL), json={})
    # Room given back by a destroy is there at once, for a one-shot too.
    await api.call("DELETE", f"/sandbox/{second}")
    made = await api.data("POST", "/sandbox", json={"command": {"exec": ["true"], "mode": "oneshot"}}, expect=201)
    assert (await api.wait_execution(made["executionId"]))["exitCode"] == 0


async def test_memory_past_what_the_host_commits_is_refused(make_api: AppFactory) -> None:
    api = await make_api(memory_commit_limit="1Gi")
    await api.data("POST", "/sandbox", json={"resources": {"memory": "512Mi"}}, expect=201)
    await refused(api, "POST", "/sandbox",
                  re.escape("no room for a sandbox of 600Mi memory: the host has 512Mi memory free; "
                            "try again once sandboxes end"), json={"resources": {"memory": "600Mi"}})
    await api.data("POST", "/sandbox", json={"resources": {"memory": "512Mi"}}, expect=201)


async def refused_as_too_large(api: Api, asked: str, most: str) -> None:
    """A create of ``asked`` memory answers 400 naming resources.memory and the most a sandbox
    can have (``most``, a pattern), and records and leaves nothing."""
    log = api.client.server.app[ENGINE].parts.log
    before, left = await log.last_position(), traces(api)
    listed = await api.data("GET", "/sandbox?includeDeleted=true")
    body = await api.call("POST", "/sandbox", json={"resources": {"memory": asked}}, expect=400)
    assert body["code"] == "INVALID_INPUT" and re.fullmatch(
        rf"resources\.memory: {asked} is more than any sandbox can have on this host \(at most {most}\)",
        body["message"]), body
    assert await log.last_position() == before, "a refused create recorded an event"
    assert await api.data("GET", "/sandbox?includeDeleted=true") == listed
    assert traces(api) == left, "a refused create left a directory or a cgroup"


async def test_a_sandbox_larger_than_the_host_could_ever_hold_is_a_400(api: Api) -> None:
    """More than the host's memory (MemTotal): a 503 was retried by the clients for ~30 s
    (docs/wire.md), though no wait helps (a typo like 4096Gi). Now a 400 naming the field."""
    await refused_as_too_large(api, "4096Gi", r"[0-9.]+[GM]i")


async def test_a_sandbox_larger_than_the_commit_limit_is_a_400_and_a_full_host_a_503(make_api: AppFactory) -> None:
    api = await make_api(memory_commit_limit="1Gi")
    await refused_as_too_large(api, "2Gi", "1Gi")
    await api.data("POST", "/sandbox", json={"resources": {"memory": "768Mi"}}, expect=201)
    # 512Mi fits the empty host: while it is full, a 503 (a wait helps)
    await refused(api, "POST", "/sandbox",
                  re.escape("no room for a sandbox of 512Mi memory: the host has 256Mi memory free; "
                            "try again once sandboxes end"), json={"resources": {"memory": "512Mi"}})


async def test_two_creates_at_once_do_not_both_take_the_last_room(make_api: AppFactory) -> None:
    api = await make_api(max_sandboxes=2)
    await api.data("POST", "/sandbox", json={}, expect=201)
    statuses = []
    for resp in await asyncio.gather(*(api.client.post("/sandbox", json={}, headers=AUTH) for _ in range(4))):
        statuses.append(resp.status)
        await resp.read()
    assert sorted(statuses) == [201, 503, 503, 503], statuses
    assert len(await api.client.server.app[ENGINE].parts.driver.alive()) == 2


async def test_creates_a_quota_refuses_hold_no_room_from_other_tenants(make_api: AppFactory) -> None:
    """The host's room is held from the check until the sandbox is made; a create refused in
    between (its organization's quota) gives it back at once. Held until it lapsed, a tenant at
    its quota sending creates kept every other tenant's out."""
    api = await make_api(max_sandboxes=3)
    attacker = bearer((await new_key(api, await new_org(api, "attacker"), "member"))["secret"])
    await api.data("PATCH", "/orgs/org_attacker/quota", json={"sandboxes": 1})
    await api.data("POST", "/sandbox", json={}, headers=attacker, expect=201)
    for _ in range(4):
        over = await api.call("POST", "/sandbox", json={}, headers=attacker, expect=403)
        assert over["code"] == "QUOTA_EXCEEDED", over
    for _ in range(2):
        await api.data("POST", "/sandbox", json={}, expect=201)


async def test_a_paused_sandbox_keeps_its_room_for_its_resume(make_api: AppFactory) -> None:
    """A resume makes no sandbox, so it is never refused: a paused one (frozen, or filesystem
    only, with no process) is counted as it was, and its room is not another create's."""
    api = await make_api(max_sandboxes=2)
    frozen = (await api.data("POST", "/sandbox", json={}, expect=201))["sandboxId"]
    asleep = (await api.data("POST", "/sandbox", json={}, expect=201))["sandboxId"]
    await api.call("POST", f"/sandbox/{frozen}/pause")
    await api.call("POST", f"/sandbox/{asleep}/pause", json={"memory": False})
    await refused(api, "POST", "/sandbox", re.escape(FULL), json={})
    for sid in (frozen, asleep):
        await api.call("POST", f"/sandbox/{sid}/resume")
        ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["true"]})
        assert (await api.wait_execution(ex["executionId"]))["exitCode"] == 0
    await refused(api, "POST", "/sandbox", re.escape(FULL), json={})
