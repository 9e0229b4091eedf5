"""The command path reads this process's own live sandboxes from what its projector folded
(service/reads.py ``Reads.observe``), not from the store: the same state, no round trip."""

from __future__ import annotations

import asyncio

import pytest

from hutch.api.keys import ENGINE
from hutch.core import counters
from tests.api.conftest import STORE, Api


def _store_reads() -> int:
    return sum(value for name, labels, value in counters.counts()
               if name == "hutch_store_statements_total" and labels.get("kind") == "select sandboxes")


@pytest.mark.runs_on(*STORE)  # the reads are the service's, whatever the driver
async def test_own_live_sandbox_is_folded_alike_and_read_without_the_store(api: Api,
                                                                          profile: dict[str, str]) -> None:
    engine = api.client.app[ENGINE]
    sid = (await api.data("POST", "/sandbox", json={"env": {"A": "1"}}, expect=201))["sandboxId"]
    await api.data("GET", f"/sandbox/{sid}")

    before = _store_reads()
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["echo", "hi"]})
    assert (await api.wait_execution(ex["executionId"]))["status"] == "completed"
    await api.call("PATCH", f"/sandbox/env/{sid}", json={"env": {"B": "2"}})
    await api.call("POST", f"/sandbox/{sid}/pause")
    await api.call("POST", f"/sandbox/{sid}/resume")
    # Commands, their decisions and the idle timer's re-arming read the folded state.
    assert _store_reads() == before

    folded, stored = await engine.reads.sandbox(sid), await engine.parts.store.get_sandbox(sid)
    assert folded == stored and folded is not None and folded.spec.env == {"A": "1", "B": "2"}

    await api.call("DELETE", f"/sandbox/{sid}")
    # Deleted: nothing kept for it (the stores archive it); its later reads are the store's.
    assert sid not in engine.reads._folded
    await api.call("GET", f"/sandbox/{sid}", expect=404)
    assert (await engine.parts.store.get_sandbox(sid)).status.is_final


@pytest.mark.runs_on(*STORE)
async def test_ended_sandboxes_stay_folded_alike_up_to_a_bound(api: Api, profile: dict[str, str]) -> None:
    engine = api.client.app[ENGINE]
    engine.reads.ended_kept = 1
    ended = []
    for _ in range(2):
        body = {"command": {"exec": ["true"], "mode": "oneshot"}}
        sid = (await api.data("POST", "/sandbox", json=body, expect=201))["sandboxId"]
        for _ in range(200):
            if (await engine.parts.store.get_sandbox(sid)).status.is_final:
                break
            await asyncio.sleep(0.05)
        ended.append(sid)
    older, newer = ended
    before = _store_reads()
    folded = await engine.reads.sandbox(newer)
    assert _store_reads() == before  # the one just ended is answered here ...
    assert folded == await engine.parts.store.get_sandbox(newer) and folded is not None and folded.status.is_final
    assert older not in engine.reads._folded  # ... the one before it was dropped (bound 1)


def _execution_reads() -> int:
    return sum(value for name, labels, value in counters.counts()
               if name == "hutch_store_statements_total" and labels.get("kind") == "select executions")


@pytest.mark.runs_on(*STORE)
async def test_own_executions_are_folded_alike_and_read_without_the_store(api: Api,
                                                                          profile: dict[str, str]) -> None:
    engine = api.client.app[ENGINE]
    body = {"command": {"exec": ["echo", "hi"], "mode": "oneshot"}}
    created = await api.data("POST", "/sandbox", json=body, expect=201)
    sid, initial = created["sandboxId"], created["executionId"]
    await api.wait_execution(initial)
    sb = (await api.data("POST", "/sandbox", json={}, expect=201))["sandboxId"]

    before = _execution_reads()
    ex = await api.data("POST", f"/sandbox/{sb}/execute", json={"command": ["echo", "hi"]})
    final = await api.wait_execution(ex["executionId"])  # a long-poll: read, woken, read again
    assert final["status"] == "completed"
    assert (await api.wait_execution(initial))["status"] == "completed"  # of a sandbox that ended
    assert _execution_reads() == before

    for eid in (initial, ex["executionId"]):
        folded, stored = await engine.reads.execution(eid), await engine.parts.store.get_execution(eid)
        assert folded == stored and folded.status.is_final
    assert sid in engine.reads._folded

    await api.call("DELETE", f"/sandbox/{sb}")
    # Deleted: nothing kept of its executions either; the store answers them.
    assert ex["executionId"] not in engine.reads._executions
    assert (await api.wait_execution(ex["executionId"]))["status"] == "completed"
    if profile:  # PostgreSQL counts its statements
        assert _execution_reads() > before
