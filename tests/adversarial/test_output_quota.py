"""Command output against the storage quota, as a tenant would spend it: in sequence, all at
once, as jobs, and after its sandboxes are gone (the retention). The fake driver's ``yes N``
writes N bytes, so these run in process on both profiles (files and PostgreSQL output
stores); ``tests/adversarial/test_pass2_local_sandbox.py`` makes the same attack with real
commands on the local driver."""

from __future__ import annotations

import asyncio
import time

import pytest

from hutch.api.keys import ENGINE
from tests.api.conftest import Api, AppFactory, make_api, profile  # noqa: F401  (fixtures)

KIB = 1024
QUOTA = 256 * KIB
# What a record the server makes once the room is spent may take past the quota (a command's
# end: counted in the event log, never refused; ~400 bytes with the fake driver's ids).
END_RECORD = 1024


@pytest.fixture
def driver_name() -> str:
    return "fake"


class Tenant:
    """A member of an organization whose storage quota the operator set to ``QUOTA``."""

    def __init__(self, api: Api, org: str, secret: str) -> None:
        self.api, self.org, self.auth = api, org, {"Authorization": f"Bearer {secret}"}

    async def call(self, method: str, path: str, **kw: object) -> dict:
        return await self.api.call(method, path, headers=self.auth, **kw)  # type: ignore[arg-type]

    async def sandbox(self) -> str:
        return str((await self.call("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["data"]
                   ["sandboxId"])

    async def execute(self, sid: str, size: int) -> tuple[int, dict]:
        """(status, answer) of ``yes size``; once it ran, the answer is the finished execution
        with ``kept``: the bytes its stdout stream keeps."""
        resp = await self.api.client.post(f"/sandbox/{sid}/execute", json={"command": ["yes", str(size)]},
                                          headers=self.auth)
        body = await resp.json()
        if resp.status != 200:
            return resp.status, body
        done = await self.call("GET", f"/sandbox/execution/{body['data']['executionId']}?wait=10s")
        return 200, {**done["data"], "kept": len(await self.api.stream(body["data"]["stdoutStreamUrl"]))}


async def tenant(api: Api, name: str, quota: int | None = QUOTA) -> Tenant:
    org = (await api.data("POST", "/orgs", json={"name": name}, expect=201))["id"]
    await api.data("PATCH", f"/orgs/{org}/quota", json={"snapshotBytes": quota})  # the operator sets it
    secret = (await api.data("POST", f"/keys?orgId={org}", json={"role": "member"}, expect=201))["secret"]
    return Tenant(api, str(org), str(secret))


async def usage(t: Tenant) -> dict:
    return dict((await t.api.data("GET", f"/orgs/{t.org}"))["usage"])


async def test_output_counts_against_the_storage_quota_and_a_full_organization_runs_nothing(
        make_api: AppFactory) -> None:  # noqa: F811
    """Before: every command kept its 16 MiB a stream, counted by nothing. Now: output counts
    from its first byte, a command that passes what is left is cut (``outputTruncated``), and
    an organization with no room left is refused a command or a job (403 QUOTA_EXCEEDED)."""
    api = await make_api()
    t = await tenant(api, "talkative")
    sid = await t.sandbox()
    status, first = await t.execute(sid, 150 * KIB)
    assert status == 200 and first["kept"] == 150 * KIB and not first["outputTruncated"], first
    assert (await usage(t))["outputBytes"] == 150 * KIB
    status, second = await t.execute(sid, 150 * KIB)  # 106 KiB left, less the sandbox's records in the log
    assert status == 200 and second["outputTruncated"], second
    used = await usage(t)
    assert used["outputBytes"] == 150 * KIB + second["kept"], used
    # Cut where the quota ends: past it only by the record of the command's end (never refused).
    assert QUOTA <= used["storageBytes"] <= QUOTA + END_RECORD, used
    status, refused = await t.execute(sid, 1)
    assert status == 403 and refused["code"] == "QUOTA_EXCEEDED" and refused["quota"] == "snapshot_bytes", refused
    assert "command output" in refused["message"], refused
    job = await t.call("POST", f"/sandbox/sandboxes/{sid}/jobs", json={"command": ["yes", "1"]}, expect=403)
    assert job["code"] == "QUOTA_EXCEEDED", job
    # Nor a sandbox: its records in the event log would not fit (they are kept for ever).
    made = await t.call("POST", "/sandbox", json={"runtime": "base:latest", "command": {"exec": ["yes", "10"]}},
                        expect=403)
    assert made["code"] == "QUOTA_EXCEEDED" and "event log" in made["message"], made
    assert (await usage(t))["outputBytes"] == used["outputBytes"]
    # Another organization is not affected; one without a storage quota is counted, never refused.
    quiet = await tenant(api, "quiet")
    assert (await quiet.execute(await quiet.sandbox(), 10))[0] == 200
    free = await tenant(api, "unlimited", quota=None)
    assert (await free.execute(await free.sandbox(), 2 * QUOTA))[1]["kept"] == 2 * QUOTA
    assert (await usage(free))["outputBytes"] == 2 * QUOTA


async def test_a_creates_command_keeps_what_fits(make_api: AppFactory) -> None:  # noqa: F811
    """A create's command is not refused once its sandbox is recorded (the sandbox exists by
    then): it keeps what is left of the quota, and says it was cut."""
    api = await make_api()
    t = await tenant(api, "creator")
    assert (await t.execute(await t.sandbox(), 200 * KIB))[0] == 200
    made = (await t.call("POST", "/sandbox", json={"runtime": "base:latest", "command": {"exec": ["yes", str(QUOTA)]}},
                         expect=201))["data"]
    done = (await t.call("GET", f"/sandbox/execution/{made['executionId']}?wait=10s"))["data"]
    kept = len(await api.stream(made["stdoutStreamUrl"]))
    assert done["outputTruncated"] and 0 < kept < QUOTA - 200 * KIB, (done, kept)
    used = await usage(t)
    assert QUOTA <= used["storageBytes"] <= QUOTA + END_RECORD, used


async def test_commands_at_once_share_what_is_left(make_api: AppFactory) -> None:  # noqa: F811
    """Eight commands started together, each writing more than the whole quota: what they keep
    together stays within it (they take from one budget, not each from what was left)."""
    api = await make_api()
    t = await tenant(api, "crowd")
    sids = [await t.sandbox() for _ in range(2)]
    results = await asyncio.gather(*(t.execute(sids[i % 2], 300 * KIB) for i in range(8)))
    ran = [r for status, r in results if status == 200]
    assert ran and all(status in (200, 403) for status, _ in results), results
    kept = sum(r["kept"] for r in ran)
    assert kept <= QUOTA, f"{kept} bytes kept under a {QUOTA}-byte quota"
    assert (await usage(t))["outputBytes"] == kept


async def test_an_ended_sandboxs_output_is_dropped_after_the_retention(make_api: AppFactory) -> None:  # noqa: F811
    """Output of a sandbox that ended is kept (and counted) for HUTCH_OUTPUT_RETENTION, then
    dropped, with the room it took; a live sandbox's output stays however old."""
    api = await make_api(output_retention="1h")
    engine = api.client.app[ENGINE]
    t = await tenant(api, "forgetful")
    gone, live = await t.sandbox(), await t.sandbox()
    for sid in (gone, live):
        assert (await t.execute(sid, 100 * KIB))[0] == 200
    ex = (await t.call("GET", f"/sandbox/sandboxes/{gone}/executions"))["data"]["executions"][0]
    await t.call("DELETE", f"/sandbox/{gone}")
    assert await engine.parts.outputs.stored(t.org) == 200 * KIB  # ended, within its window: still kept (and counted)
    assert await engine.retention.sweep() == []
    assert await engine.retention.sweep(now=time.time() + 3601) == [gone]
    assert await engine.parts.outputs.stored(t.org) == 100 * KIB and (await usage(t))["outputBytes"] == 100 * KIB
    assert await api.stream(ex["stdoutStreamUrl"]) == b""  # read as an empty stream, not an error
    assert await engine.retention.sweep(now=time.time() + 10**6) == []  # the live one keeps its own
    assert (await t.execute(live, 1))[1]["kept"] == 1
