"""A command still running when its sandbox ends has one outcome, however the sandbox ends
(a destroy, its timeout, a oneshot's destroy) and however the end and the command's own
report of its kill interleave: ``cancelled``, error ``sandbox ended: <why the sandbox ended>``,
the same in the execution API and in exactly one ``execution:finished`` event of the sandbox's
log, recorded before the sandbox's end event. Each way is tried at several delays after the
execute (before the driver launched the command, just after, long after), to hit the timings
that made three outcomes before (``cancelled``/``cancelled``; ``cancelled``/``sandbox ended``
with no end event; rarely ``failed``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.api.conftest import AUTH, Api

# The service decides the outcome whatever the driver: every driver that runs a real process
# (local, node, nomad) and the fake, on both profiles where it is cheap.
EVERYWHERE = ("fake-embedded", "fake-production", "local-embedded", "node-embedded", "nomad-production")
DELAYS = (0.0, 0.02, 0.1, 0.3)  # seconds between the execute's answer and the end

DESTROYED = "sandbox ended: destroyed on request"


async def _ended_as(api: Api, sid: str, execution_id: str, error: str) -> dict[str, Any]:
    """The execution as the HTTP API answers it and as the events API records it: the same,
    once (every started execution gets exactly one end event, before the sandbox's end)."""
    ex = await api.data("GET", f"/sandbox/execution/{execution_id}?wait=20s")
    assert ex["status"] == "cancelled" and ex.get("error") == error, ex
    # How long it ran, as for any other end: from its start to the end recorded for it.
    assert isinstance(ex.get("durationMs"), int) and 0 <= ex["durationMs"] < 20_000, ex
    events = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]
    types = [e["type"] for e in events]
    ends = [e for e in events if e["type"] == "execution:finished" and e["event"]["executionId"] == execution_id]
    assert len(ends) == 1, types
    assert ends[0]["event"]["status"] == ex["status"] and ends[0]["event"].get("error") == ex["error"], (ends, ex)
    assert ex.get("exitCode") == ends[0]["event"].get("exitCode"), (ends, ex)
    started = next(i for i, e in enumerate(events)
                   if e["type"] == "execution:started" and e["event"]["executionId"] == execution_id)
    assert started < events.index(ends[0]) < types.index("lifecycle:terminated"), types
    listed = (await api.data("GET", f"/sandbox/sandboxes/{sid}/executions"))["executions"]
    assert [(x["status"], x.get("error")) for x in listed if x["executionId"] == execution_id] == [
        ("cancelled", error)], listed
    return ex


async def _started(api: Api, sid: str, delay: float) -> str:
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sleep", "30"]})
    await asyncio.sleep(delay)
    return str(ex["executionId"])


@pytest.mark.runs_on(*EVERYWHERE)
async def test_a_destroy_ends_a_running_command_one_way_whenever_it_lands(api: Api) -> None:
    for delay in DELAYS:
        sid = (await api.call("POST", "/sandbox", json={}, expect=201))["data"]["sandboxId"]
        execution_id = await _started(api, sid, delay)
        t0 = time.monotonic()
        await api.call("DELETE", f"/sandbox/{sid}")
        assert time.monotonic() - t0 < 20
        await _ended_as(api, sid, execution_id, DESTROYED)


@pytest.mark.runs_on(*EVERYWHERE)
async def test_a_oneshot_destroyed_under_its_command_ends_it_one_way(api: Api) -> None:
    for delay in DELAYS:
        created = (await api.call("POST", "/sandbox", expect=201,
                                  json={"command": {"exec": ["sleep", "30"], "mode": "oneshot"}}))["data"]
        sid = created["sandboxId"]
        await api.data("GET", f"/sandbox/status/{sid}?waitForStatus=running&waitMs=10000")
        await asyncio.sleep(delay)
        await api.call("DELETE", f"/sandbox/{sid}")
        await _ended_as(api, sid, created["executionId"], DESTROYED)
        # Ended once, by the destroy: not also "terminated" by its command's kill meanwhile.
        events = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]
        ends = [e["event"] for e in events if e["type"] == "lifecycle:terminated"]
        assert [(e["reason"], e["deleted"]) for e in ends] == [("destroyed on request", True)], ends


@pytest.mark.runs_on("local-embedded", "node-embedded", "nomad-production")  # drivers that pause a running command
async def test_a_sandbox_timeout_ends_a_running_command_one_way(api: Api) -> None:
    """A sandbox paused with its command running and ended at its paused timeout."""
    for delay in DELAYS[1:]:
        sid = (await api.call("POST", "/sandbox", json={"timeout": {"paused": "1s"}}, expect=201))["data"]["sandboxId"]
        ex = await api.data("POST", f"/sandbox/{sid}/execute",
                            json={"command": ["sh", "-c", "touch started; exec sleep 30"]})
        deadline = time.monotonic() + 10  # launched, so that the pause freezes it rather than ends it
        while (await api.client.get(f"/fs/{sid}?path=started", headers=AUTH)).status != 200:
            assert time.monotonic() < deadline, "the command did not start within 10 s"
            await asyncio.sleep(0.02)
        await asyncio.sleep(delay)
        await api.call("POST", f"/sandbox/{sid}/pause")
        status = await api.data("GET", f"/sandbox/status/{sid}?waitForStatus=terminated&waitMs=15000")
        assert status["status"] == "terminated", status
        await _ended_as(api, sid, ex["executionId"], "sandbox ended: paused timeout (1s) reached")


@pytest.mark.runs_on(*EVERYWHERE)
async def test_an_end_that_read_the_sandbox_idle_still_ends_a_command_started_since_one_way(api: Api) -> None:
    """The reaper reads a sandbox idle at its idle timeout and ends it; a command started between
    that read and the end (an execute landing just then) is ended as a busy sandbox's are:
    ``cancelled``, saying the timeout ended it, never what the driver's kill left of it (a
    ``failed`` "sandbox not found", or ``cancelled`` "cancelled"). Driven through the service's
    end as the reaper calls it, so that the race is not left to chance."""
    from hutch.api.keys import ENGINE
    from hutch.core.lifecycle import Terminate

    engine = api.client.server.app[ENGINE]
    for delay in DELAYS:
        sid = (await api.call("POST", "/sandbox", json={}, expect=201))["data"]["sandboxId"]
        execution_id = await _started(api, sid, delay)
        await engine.control.end(sid, Terminate(reason="idle timeout (1s) reached"))
        await _ended_as(api, sid, execution_id, "sandbox ended: idle timeout (1s) reached")
