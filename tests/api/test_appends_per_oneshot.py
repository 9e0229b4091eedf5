"""What a one-shot costs in event-log appends (hutch.core.counters): on production each append
is a Kafka Produce and a projection transaction, awaited in series on the way to the command's
launch. A create that carries a command records the sandbox started and its command started in
one append with its creation (service/provisioning.py: the driver makes the sandbox first), with
other replicas on the log too; the events API still shows every event, in order."""

from __future__ import annotations

import pytest

from hutch.api.keys import ENGINE
from hutch.core import counters
from hutch.core.errors import QuotaExceeded
from tests.api.conftest import STORE, Api


def _counts() -> tuple[int, int]:
    got = {name: value for name, _, value in counters.counts()}
    return got.get("hutch_eventlog_appends_total", 0), got.get("hutch_eventlog_append_events_total", 0)


async def _ended(api: Api, sandbox_id: str) -> None:
    status = await api.data("GET", f"/sandbox/status/{sandbox_id}?waitForStatus=terminated&waitMs=10000")
    assert status["status"] == "terminated", status  # answered once projected: counted before


@pytest.mark.runs_on(*STORE)
async def test_a_oneshot_records_its_start_and_its_commands_start_in_one_append(api: Api) -> None:
    body = {"command": {"exec": ["echo", "hi"], "mode": "oneshot"}}
    await _ended(api, (await api.data("POST", "/sandbox", json=body, expect=201))["sandboxId"])  # warm
    appends, events = _counts()
    created = await api.data("POST", "/sandbox", json=body, expect=201)
    sid = created["sandboxId"]
    assert await api.stream(created["stdoutStreamUrl"]) == b"hi\n"
    await _ended(api, sid)
    # create + started + execution:started; execution:finished; completed + terminated
    assert (_counts()[0] - appends, _counts()[1] - events) == (3, 6)
    listed = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]
    assert [e["type"] for e in listed] == ["create", "lifecycle:started", "execution:started",
                                           "execution:finished", "lifecycle:completed", "lifecycle:terminated"]
    started, running = listed[1], listed[2]
    assert started["createdAt"] == running["createdAt"]  # one append: one moment
    assert listed[0]["createdAt"] == started["createdAt"]
    assert running["event"]["executionId"] == created["executionId"]
    history = (await api.data("GET", f"/sandbox/sandboxes/{sid}/history"))["history"]
    assert [(s["type"], s["status"]) for s in history[:3]] == [
        ("create", "creating"), ("lifecycle:started", "idle"), ("execution:started", "running")]


@pytest.mark.runs_on(*STORE)
async def test_an_interactive_create_with_a_command_starts_both_in_one_append(api: Api) -> None:
    appends, _ = _counts()
    created = await api.data("POST", "/sandbox", json={"command": {"exec": ["echo", "hi"]}}, expect=201)
    sid = created["sandboxId"]
    assert (await api.wait_execution(created["executionId"]))["status"] == "completed"
    # create + started + execution:started; execution:finished
    assert _counts()[0] - appends == 2
    sb = await api.data("GET", f"/sandbox/{sid}")
    assert sb["status"] == "idle"
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["true"]})
    assert (await api.wait_execution(ex["executionId"]))["status"] == "completed"  # it takes commands on
    await api.call("DELETE", f"/sandbox/{sid}")


@pytest.mark.runs_on("fake-embedded")  # the service's choice, whatever the log
async def test_a_refused_command_start_leaves_the_sandbox_started_not_creating(api: Api) -> None:
    """The shared append refused (the command's argv past the storage quota, say): nothing of
    it is written, and the sandbox the driver made is recorded created and started on its own,
    as before (one replica: create, started and the command's start were that one append)."""
    engine = api.client.server.app[ENGINE]
    admit = engine.recorder.meter
    refusable: list[int] = []

    async def meter(org: str, size: int, refuse: bool) -> None:
        refusable.extend([size] if refuse else [])
        if refuse and len(refusable) == 1:  # the append with the command's start; the retry without it passes
            raise QuotaExceeded("storage quota exceeded (test)")
        await admit(org, size, refuse)

    engine.recorder.meter = meter
    body = {"command": {"exec": ["echo", "hi"], "mode": "oneshot"}}
    err = await api.call("POST", "/sandbox", json=body, expect=403)
    assert "storage quota" in err["message"]
    [sb] = (await api.data("GET", "/sandbox"))["sandboxes"]
    assert sb["status"] == "idle"
    types = [e["type"] for e in (await api.data("GET", f"/sandbox/sandboxes/{sb['sandboxId']}/events"))["events"]]
    assert types == ["create", "lifecycle:started"]
    await api.call("DELETE", f"/sandbox/{sb['sandboxId']}")
