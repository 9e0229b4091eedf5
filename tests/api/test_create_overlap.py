"""A create's driver work overlaps its ``Create`` append on a single replica: the driver makes
the sandbox (an idle pid 1, nothing of the tenant's runs) while the event is written, so the
way to its start awaits the longer of the two instead of both. Nothing is started before the
``Start`` append, and a create the log refuses leaves no sandbox in the driver."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from hutch.api.keys import ENGINE
from hutch.core.errors import QuotaExceeded
from hutch.core.events import Event
from hutch.drivers.base import ProvisionRequest
from tests.api.conftest import Api


@pytest.mark.runs_on("fake-embedded")
async def test_the_driver_makes_the_sandbox_while_its_create_is_appended(api: Api,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    engine = api.client.server.app[ENGINE]
    log, lifecycle = engine.recorder._log, engine.provisioning._lifecycle
    append, provision = log.append, lifecycle.provision
    seen: list[str] = []

    async def slow_append(events: Sequence[Event]) -> list[int]:
        kinds = [e.type for e in events]
        seen.append("append " + "+".join(kinds))
        if "create" in kinds:
            await asyncio.sleep(0.3)
        positions = await append(events)
        seen.append("appended " + "+".join(kinds))
        return positions

    async def watched(req: ProvisionRequest) -> None:
        seen.append("provision")
        await provision(req)
        seen.append("provisioned")

    monkeypatch.setattr(log, "append", slow_append)
    monkeypatch.setattr(lifecycle, "provision", watched)
    created = await api.data("POST", "/sandbox", json={}, expect=201)
    assert created["status"] == "idle"
    assert seen[:3] == ["append create", "provision", "provisioned"], seen
    assert seen[3:] == ["appended create", "append lifecycle:started", "appended lifecycle:started"], seen
    await api.call("DELETE", f"/sandbox/{created['sandboxId']}")


@pytest.mark.runs_on("fake-embedded")
async def test_a_create_the_log_refuses_leaves_no_sandbox_in_the_driver(api: Api) -> None:
    engine = api.client.server.app[ENGINE]
    lifecycle = engine.provisioning._lifecycle
    before = await lifecycle.alive()
    admit = engine.recorder.meter

    async def meter(org: str, size: int, refuse: bool) -> None:
        await asyncio.sleep(0.05)  # the driver is under way meanwhile
        if refuse:
            raise QuotaExceeded("storage quota exceeded (test)")
        await admit(org, size, refuse)

    engine.recorder.meter = meter
    try:
        err = await api.call("POST", "/sandbox", json={}, expect=403)
    finally:
        engine.recorder.meter = admit
    assert "storage quota" in err["message"]
    assert await lifecycle.alive() == before
    assert (await api.data("GET", "/sandbox"))["sandboxes"] == []
