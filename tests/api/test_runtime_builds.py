"""Building a catalog runtime ahead of its first use, with its progress (fake driver: scripted)."""

from __future__ import annotations

import json

import pytest

from hutch.api.keys import ENGINE
from tests.api.conftest import AUTH, WIRE, Api, AppFactory


async def _events(api: Api, name: str) -> list[dict]:
    resp = await api.client.post(f"/sandbox/runtimes/{name}/build", headers=AUTH)
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    return [json.loads(line[6:]) for line in (await resp.text()).splitlines() if line.startswith("data: ")]


@pytest.mark.runs_on(*WIRE)  # the driver's build, streamed: no store
async def test_a_build_streams_its_steps_then_done(make_api: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_FAKE_UNBUILT", "bun:1")
    api = await make_api()
    before = {r["name"]: r for r in (await api.data("GET", "/sandbox/runtimes"))["runtimes"]}
    assert before["bun:1"]["available"] is False
    events = await _events(api, "bun:1")
    assert [e["line"] for e in events[:-1]] == ["bun:1: [1/2] fake step", "bun:1: [2/2] fake step"]
    assert events[-1] == {"done": True, "available": True}
    after = {r["name"]: r for r in (await api.data("GET", "/sandbox/runtimes"))["runtimes"]}
    assert after["bun:1"]["available"] is True
    assert (await _events(api, "bun:1")) == [{"done": True, "available": True}]  # built: at once


@pytest.mark.runs_on(*WIRE)  # the driver's build, streamed: no store
async def test_unknown_runtimes_and_failed_builds(make_api: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUTCH_FAKE_UNBUILT", "bun:1")
    api = await make_api()
    missing = await api.call("POST", "/sandbox/runtimes/cobol:1/build", expect=404)
    assert "cobol:1" in missing["message"] and "known runtimes" in missing["message"]
    api.client.server.app[ENGINE].parts.driver.fail_build = "mirror unreachable"  # type: ignore[attr-defined]
    events = await _events(api, "bun:1")
    assert events[-1] == {"error": "mirror unreachable"}
