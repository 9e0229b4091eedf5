"""Time travel (service/history.py): a sandbox as of any of its events, folded from the log."""

from __future__ import annotations

import pytest

from tests.api.conftest import STORE, Api


@pytest.mark.runs_on(*STORE)  # folded from either log
async def test_a_sandbox_as_of_each_of_its_events(api: Api) -> None:
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest", "env": {"STAGE": "one"}},
                          expect=201))["sandboxId"]
    await api.data("GET", f"/sandbox/{sid}?waitForStatus=idle&waitMs=30000")
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["echo", "hi"]})
    await api.wait_execution(ex["executionId"])
    await api.data("PATCH", f"/sandbox/env/{sid}", json={"env": {"STAGE": "two", "EXTRA": "x"}})

    steps = (await api.data("GET", f"/sandbox/sandboxes/{sid}/history"))["history"]
    kinds = [s["type"] for s in steps if s["type"] != "runtime:build"]
    assert kinds == ["create", "lifecycle:started", "execution:started", "execution:finished", "env"]
    by_type = {s["type"]: s for s in steps}
    assert by_type["create"]["status"] == "creating" and by_type["lifecycle:started"]["status"] == "idle"
    assert by_type["execution:started"]["status"] == "running" and by_type["env"]["status"] == "idle"

    before = await api.data("GET", f"/sandbox/{sid}?asOf={by_type['execution:started']['eventId']}")
    assert before["status"] == "running" and before["env"] == {"STAGE": "one"}
    assert before["asOf"]["type"] == "execution:started" and before["executions"] == 1
    after = await api.data("GET", f"/sandbox/{sid}?asOf={by_type['env']['eventId']}")
    assert after["env"] == {"STAGE": "two", "EXTRA": "x"}
    at_time = await api.data("GET", f"/sandbox/{sid}?asOf={by_type['lifecycle:started']['createdAt']}")
    assert at_time["asOf"]["position"] >= by_type["lifecycle:started"]["position"]

    await api.call("DELETE", f"/sandbox/{sid}")
    gone = await api.data("GET", f"/sandbox/{sid}?asOf={by_type['create']['eventId']}")  # history outlives it
    assert gone["status"] == "creating"
    assert "not an event" in (await api.call("GET", f"/sandbox/{sid}?asOf=evt_{'0' * 26}", expect=404))["message"]
    assert "asOf" in (await api.call("GET", f"/sandbox/{sid}?asOf=yesterday", expect=400))["message"]
    assert "did not exist yet" in (await api.call("GET", f"/sandbox/{sid}?asOf=2000-01-01T00:00:00Z",
                                                 expect=404))["message"]
