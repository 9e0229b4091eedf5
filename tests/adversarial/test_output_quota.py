"""Command output, as a tenant would keep it: after its sandboxes are gone (the retention). The fake driver's ``yes N``
writes N bytes, so these run in process on both profiles (files and PostgreSQL output
stores); ``tests/adversarial/test_pass2_local_sandbox.py`` makes the same attack with real
commands on the local driver."""

from __future__ import annotations

import time

import pytest

from hutch.api.keys import ENGINE
from tests.api.conftest import Api, AppFactory, make_api, profile  # noqa: F401  (fixtures)

KIB = 1024
QUOTA = 256 * KIB


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
    assert await engine.outputs.stored(t.org) == 200 * KIB  # ended, within its window: still kept (and counted)
    assert await engine.retention.sweep() == []
    assert await engine.retention.sweep(now=time.time() + 3601) == [gone]
    assert await engine.outputs.stored(t.org) == 100 * KIB
    assert await api.stream(ex["stdoutStreamUrl"]) == b""  # read as an empty stream, not an error
    assert await engine.retention.sweep(now=time.time() + 10**6) == []  # the live one keeps its own
    assert (await t.execute(live, 1))[1]["kept"] == 1
