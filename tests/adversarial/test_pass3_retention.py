"""Third adversarial pass on issue 32 (what the server keeps for a tenant): an attacker with a
member key of an organization whose storage quota is small, looking for bytes the server
keeps, or holds, past what the fix of sec-retain bounds (command output: quota, cut,
retention; argv: its first 4 KiB in the log). In process, fake driver, on both profiles
(embedded: files and SQLite; production: PostgreSQL and Kafka)."""

from __future__ import annotations

import pytest

from hutch.service import input_streams
from tests.adversarial.test_output_quota import Tenant, tenant
from tests.api.conftest import AppFactory, make_api, profile  # noqa: F401  (fixtures)


@pytest.fixture
def driver_name() -> str:
    return "fake"


async def create_stdin(t: Tenant) -> tuple[int, str]:
    resp = await t.api.client.post("/streams", json={"name": "in"}, headers=t.auth)
    return resp.status, str((await resp.json()).get("id"))


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
