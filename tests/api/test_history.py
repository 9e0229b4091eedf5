"""Time travel (service/history.py): a sandbox as of any of its events, folded from the log."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from hutch.api.keys import ENGINE
from hutch.core.eventlog.base import EventLog
from hutch.core.events import Event
from hutch.service import history
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


class CountingLog:
    """The log as History reads it, counting the events each read hands back."""

    def __init__(self, log: EventLog) -> None:
        self.log, self.events = log, 0

    async def read(self, after: int = 0, **kw: Any) -> list[Event]:
        got = await self.log.read(after, **kw)
        self.events += len(got)
        return got


@pytest.mark.runs_on(*STORE)
async def test_as_of_reads_the_history_only_as_far_as_the_point_asked(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived sandbox's many events: an early ``asOf`` reads a page of them, not all (it
    read every one, at each request)."""
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    await api.data("GET", f"/sandbox/{sid}?waitForStatus=idle&waitMs=30000")
    early = (await api.data("GET", f"/sandbox/sandboxes/{sid}/history"))["history"]
    await asyncio.sleep(1.1)  # past the (shortened) slack: later events are made after it
    many = 3 * history.FIRST_PAGE
    for i in range(many):
        await api.data("PATCH", f"/sandbox/env/{sid}", json={"env": {"N": str(i)}})
    monkeypatch.setattr(history, "CLOCK_SLACK", dt.timedelta(seconds=1))  # not 10 min, for a short test
    engine_history = api.client.server.app[ENGINE].history
    counting = CountingLog(engine_history._log)
    monkeypatch.setattr(engine_history, "_log", counting)

    create = early[0]
    assert create["type"] == "create"
    then = await api.data("GET", f"/sandbox/{sid}?asOf={create['eventId']}")
    assert then["status"] == "creating" and then["asOf"]["eventId"] == create["eventId"]
    # A page at most, and the last event twice (is the present asked? ``History._present``)
    assert counting.events <= history.FIRST_PAGE + 2, f"{counting.events} events read for the sandbox's first"
    counting.events = 0
    at = await api.data("GET", f"/sandbox/{sid}?asOf={early[-1]['createdAt']}")
    assert at["asOf"]["position"] >= early[-1]["position"] and at["env"] == {}
    assert counting.events <= history.FIRST_PAGE + 2, f"{counting.events} events read for a time before the many"
    counting.events = 0
    # The present, from the projection store: its last event read twice, no more; and as the fold says.
    now = await api.data("GET", f"/sandbox/{sid}?asOf=2999-01-01T00:00:00Z")
    assert now["env"] == {"N": str(many - 1)} and counting.events <= 2, counting.events
    counting.events = 0
    last = await api.data("GET", f"/sandbox/{sid}?asOf={now['asOf']['eventId']}")
    assert last == now and counting.events <= 2, counting.events

    async def no_present(sandbox_id: str) -> None:
        return None

    monkeypatch.setattr(engine_history, "_present", no_present)
    assert await api.data("GET", f"/sandbox/{sid}?asOf={now['asOf']['eventId']}") == now  # folded: the same
    counting.events = 0
    future = f"evt_{'z' * 26}"  # an id of a time to come: no event yet, nothing read
    assert "not an event" in (await api.call("GET", f"/sandbox/{sid}?asOf={future}", expect=404))["message"]
    assert counting.events == 0


@pytest.mark.runs_on(*STORE)
async def test_the_timeline_comes_in_pages(api: Api) -> None:
    """A long timeline was one answer, folded in one go; now pages of ``limit`` steps, each
    naming where the next begins (``next``), which together are the whole."""
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    await api.data("GET", f"/sandbox/{sid}?waitForStatus=idle&waitMs=30000")
    for i in range(5):
        await api.data("PATCH", f"/sandbox/env/{sid}", json={"env": {"N": str(i)}})
    whole = await api.data("GET", f"/sandbox/sandboxes/{sid}/history")
    assert whole["next"] is None and len(whole["history"]) >= 7
    paged: list[dict[str, Any]] = []
    query = "limit=2"
    while True:
        page = await api.data("GET", f"/sandbox/sandboxes/{sid}/history?{query}")
        assert len(page["history"]) <= 2
        paged += page["history"]
        if page["next"] is None:
            break
        assert page["next"] == page["history"][-1]["position"]
        query = f"limit=2&after={page['next']}"
    assert paged == whole["history"]
    for bad in ("0", "10001", "x", "-1", "1e3"):
        body = await api.call("GET", f"/sandbox/sandboxes/{sid}/history?limit={bad}", expect=400)
        assert body["message"].startswith("limit: expected"), body
    body = await api.call("GET", f"/sandbox/sandboxes/{sid}/history?after=soon", expect=400)
    assert body["message"].startswith("after: expected"), body


class ManyEvents:
    """A log holding one sandbox's create and ``n`` env changes, read as History reads it."""

    def __init__(self, n: int) -> None:
        from hutch.core.events import SandboxCreated, SandboxEnvChanged
        from hutch.core.models import SandboxSpec

        made = "2026-11-30T00:00:00.000Z"
        self.events = [Event("evt_0", "sbx_many", made, SandboxCreated(spec=SandboxSpec(runtime="base:latest", runtime_id="srt")),
                             position=1)]
        self.events += [Event(f"evt_{i}", "sbx_many", made, SandboxEnvChanged(set={"N": str(i)}), position=i + 1)
                        for i in range(1, n + 1)]

    async def read(self, after: int = 0, *, sandbox_id: str | None = None, limit: int | None = None,
                   reverse: bool = False) -> list[Event]:
        later = [e for e in self.events if (e.position or 0) > after]
        return later[:limit] if limit is not None else later


class AnyoneSees:
    async def require(self, sandbox_id: str, include_deleted: bool = False) -> None:
        return None


async def test_a_long_fold_lets_other_requests_run() -> None:
    """Folded in one go, 6,000 events held the loop 0.23 s; now it has a turn every
    ``YIELD_EVERY`` events (and a log read at most every ``MAX_PAGE``)."""
    n = 10 * history.YIELD_EVERY
    timeline = history.History(ManyEvents(n), AnyoneSees())  # type: ignore[arg-type]
    turns = 0
    done = False

    async def ticker() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    turns = 0
    steps, following = await timeline.timeline("sbx_many", limit=history.MAX_STEPS)
    done = True
    await tick
    assert len(steps) == n + 1 and following is None
    assert turns >= n // history.YIELD_EVERY, f"the loop turned {turns} times in a fold of {n} events"
