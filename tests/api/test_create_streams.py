"""A create's command streams are opened beside its owner row and the driver's provision, not
after them (on PostgreSQL each is a round trip: in series they were two before the append), and
a create that fails before its command runs leaves them closed, whatever step failed."""

from __future__ import annotations

import asyncio

import pytest

from hutch.api.keys import ENGINE
from hutch.core.errors import QuotaExceeded
from hutch.core.output import OutputWriter, StreamOwner
from hutch.core.replicas import Tenant
from hutch.drivers.base import ProvisionRequest
from tests.api.conftest import Api

ONESHOT = {"command": {"exec": ["echo", "hi"], "mode": "oneshot"}}


def opened_streams(api: Api, monkeypatch: pytest.MonkeyPatch, seen: list[str]) -> list[str]:
    """The ids of the streams the output store is asked to open, in order (and "open" in ``seen``)."""
    outputs = api.client.server.app[ENGINE].parts.outputs
    open_ = outputs.open
    ids: list[str] = []

    async def watched(stream_id: str, owner: StreamOwner | None = None) -> OutputWriter:
        ids.append(stream_id)
        seen.append("open")
        return await open_(stream_id, owner)

    monkeypatch.setattr(outputs, "open", watched)
    return ids


@pytest.mark.runs_on("fake-production")
async def test_a_creates_streams_open_while_its_owner_row_is_written(
        api: Api, profile: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    engine = api.client.server.app[ENGINE]
    seen: list[str] = []
    ids = opened_streams(api, monkeypatch, seen)
    own = engine.replicas.own

    async def slow_own(sandbox_id: str, tenant: Tenant | None = None) -> None:
        seen.append("own")
        await asyncio.sleep(0.2)  # a slow commit: the streams' open goes meanwhile
        await own(sandbox_id, tenant)
        seen.append("owned")

    monkeypatch.setattr(engine.replicas, "own", slow_own)
    created = await api.data("POST", "/sandbox", json=ONESHOT, expect=201)
    assert seen.index("open") < seen.index("owned"), seen
    assert len(ids) == 2, ids  # stdout and stderr, once each
    assert await api.stream(created["stdoutStreamUrl"]) == b"hi\n"
    assert (await api.wait_execution(created["executionId"]))["status"] == "completed"
    for stream_id in ids:
        assert not await engine.parts.outputs.is_open(stream_id)


async def _refused_by_the_log(engine: object, monkeypatch: pytest.MonkeyPatch) -> int:
    async def meter(org: str, size: int, refuse: bool) -> None:
        raise QuotaExceeded("storage quota exceeded (test)")

    monkeypatch.setattr(engine.recorder, "meter", meter)  # type: ignore[attr-defined]
    return 403


async def _provision_fails(engine: object, monkeypatch: pytest.MonkeyPatch) -> int:
    async def broken(req: ProvisionRequest) -> None:
        await asyncio.sleep(0.05)  # the streams' open is done by now
        raise RuntimeError("no room (test)")

    monkeypatch.setattr(engine.provisioning._lifecycle, "provision", broken)  # type: ignore[attr-defined]
    return 502


async def _owner_row_fails(engine: object, monkeypatch: pytest.MonkeyPatch) -> int:
    from hutch.core.errors import ReplicaUnavailable

    async def broken(sandbox_id: str, tenant: Tenant | None = None) -> None:
        await asyncio.sleep(0.05)
        raise ReplicaUnavailable("the replica registry is away (test)")

    monkeypatch.setattr(engine.replicas, "own", broken)  # type: ignore[attr-defined]
    return 503


@pytest.mark.runs_on("fake-embedded", "fake-production")
@pytest.mark.parametrize("fail", [_refused_by_the_log, _provision_fails, _owner_row_fails],
                         ids=["log refuses", "provision fails", "owner row fails"])
async def test_a_create_that_fails_before_its_command_runs_leaves_its_streams_closed(
        api: Api, profile: dict[str, str], monkeypatch: pytest.MonkeyPatch, fail: object) -> None:
    engine = api.client.server.app[ENGINE]
    ids = opened_streams(api, monkeypatch, [])
    expect = await fail(engine, monkeypatch)  # type: ignore[operator]
    await api.call("POST", "/sandbox", json=ONESHOT, expect=expect)
    assert len(ids) == 2, ids
    for stream_id in ids:
        assert not await engine.parts.outputs.is_open(stream_id), f"{stream_id} left open by a failed create"
    assert not any(engine.executions.running(i) for i in engine.executions._tasks)
