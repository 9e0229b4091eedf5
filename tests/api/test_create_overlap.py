"""A create's way to its start on a single replica: the driver makes the sandbox (an idle
pid 1, nothing of the tenant's runs) before or while its ``Create`` is appended, so the way
awaits one durable write instead of two in series. Without a sandbox quota the sandbox is made
first and recorded created and started (and its command started) in one append; under a quota,
whose lock holds until the ``Create`` is in, the two overlap. Nothing is started before the
``Start`` is in the log, and a create the log refuses leaves no sandbox in the driver."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from hutch.api.keys import ENGINE
from hutch.core.errors import QuotaExceeded
from hutch.core.events import Encoded, Event
from hutch.core.runtimes import DEFAULT_RUNTIME
from hutch.drivers.base import ProvisionRequest
from tests.api.conftest import Api


def watch(api: Api, monkeypatch: pytest.MonkeyPatch, *, slow_create: float = 0.0) -> list[str]:
    """What the log and the driver are asked, in order (a Create's append slowed by ``slow_create``)."""
    engine = api.client.server.app[ENGINE]
    log, lifecycle = engine.recorder._log, engine.provisioning._lifecycle
    append, provision, settled = log.append, lifecycle.provision, lifecycle.settled
    seen: list[str] = []

    async def slow_append(events: Sequence[Event | Encoded]) -> list[int]:
        kinds = "+".join((e.event if isinstance(e, Encoded) else e).type for e in events)  # the recorder's are encoded
        seen.append("append " + kinds)
        if kinds.startswith("create"):
            await asyncio.sleep(slow_create)
        positions = await append(events)
        seen.append("appended " + kinds)
        return positions

    async def watched(req: ProvisionRequest) -> None:
        seen.append("provision")
        await provision(req)
        seen.append("provisioned")

    def watched_settled(sandbox_id: str) -> None:
        seen.append("settled")
        settled(sandbox_id)

    monkeypatch.setattr(log, "append", slow_append)
    monkeypatch.setattr(lifecycle, "provision", watched)
    monkeypatch.setattr(lifecycle, "settled", watched_settled)
    return seen


@pytest.mark.runs_on("fake-embedded")
async def test_a_sandbox_is_made_then_recorded_created_and_started_in_one_append(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = watch(api, monkeypatch)
    created = await api.data("POST", "/sandbox", json={}, expect=201)
    assert created["status"] == "idle"
    # Recorded, and nothing to launch: the driver hears so (the warm pool's refill need not wait).
    assert seen == ["provision", "provisioned", "append create+lifecycle:started",
                    "appended create+lifecycle:started", "settled"], seen
    seen.clear()
    body = {"command": {"exec": ["echo", "hi"], "mode": "oneshot"}}
    created = await api.data("POST", "/sandbox", json=body, expect=201)
    assert seen[:4] == ["provision", "provisioned", "append create+lifecycle:started+execution:started",
                        "appended create+lifecycle:started+execution:started"], seen
    assert "settled" not in seen, "a create with a command is settled by its command's launch, in the driver"
    assert await api.stream(created["stdoutStreamUrl"]) == b"hi\n"
    listed = (await api.data("GET", f"/sandbox/sandboxes/{created['sandboxId']}/events?limit=100"))["events"]
    assert [e["type"] for e in listed][:3] == ["create", "lifecycle:started", "execution:started"]


@pytest.mark.runs_on("fake-embedded")
async def test_under_a_sandbox_quota_the_driver_makes_it_while_its_create_is_appended(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = api.client.server.app[ENGINE]
    monkeypatch.setattr(engine.quotas, "limits_sandboxes", lambda org: True)
    seen = watch(api, monkeypatch, slow_create=0.3)
    created = await api.data("POST", "/sandbox", json={}, expect=201)
    assert created["status"] == "idle"
    assert seen[:3] == ["append create", "provision", "provisioned"], seen
    assert seen[3:] == ["appended create", "append lifecycle:started", "appended lifecycle:started", "settled"], seen
    await api.call("DELETE", f"/sandbox/{created['sandboxId']}")


@pytest.mark.runs_on("local-embedded")
async def test_creates_without_a_command_leave_the_warm_pool_free_to_refill_on_saturated_cores(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """A create with no command holds the local driver's refill back only until it is recorded:
    held until the hold lapsed, sequential creates found the pool empty and made their own
    sandbox on the request's path (98 % of them, 7 ms more each, docs/benchmarks.md)."""
    from hutch.drivers.local import pool as pool_module

    driver = api.client.server.app[ENGINE].provisioning._lifecycle
    assert driver._pool.size == 2, "the warm pool is on by default (cgroup v1, as root)"
    monkeypatch.setattr(pool_module, "cores_to_spare", lambda: False)  # the refill waits for quiet
    monkeypatch.setattr(pool_module, "REFILL_DEFER_MAX", 60.0)  # ... and for nothing else
    monkeypatch.setattr(pool_module, "EMPTY_DEFER_MAX", 60.0)
    driver._quiet._hold_max = 60  # only the create's being recorded ends its hold
    made = []
    for _ in range(4):
        created = await api.data("POST", "/sandbox", json={}, expect=201)
        assert created["status"] == "idle"
        made.append(created["sandboxId"])
        deadline = asyncio.get_running_loop().time() + 20
        while len(driver._pool.idle.get(DEFAULT_RUNTIME, ())) < driver._pool.size or driver._pool._filling:
            assert asyncio.get_running_loop().time() < deadline, \
                f"the pool holds {len(driver._pool.idle.get(DEFAULT_RUNTIME, ()))} of {driver._pool.size} after 20 s"
            await asyncio.sleep(0.02)
        assert not driver._quiet.busy, "the answered create still holds the driver"
    for sid in made:
        await api.call("DELETE", f"/sandbox/{sid}")


@pytest.mark.runs_on("fake-embedded")
@pytest.mark.parametrize("limited", [False, True], ids=["no quota", "a sandbox quota"])
@pytest.mark.parametrize("body", [{}, {"command": {"exec": ["echo", "hi"], "mode": "oneshot"}}],
                         ids=["idle", "oneshot"])
async def test_a_create_the_log_refuses_leaves_no_sandbox_in_the_driver(
        api: Api, monkeypatch: pytest.MonkeyPatch, limited: bool, body: dict[str, object]) -> None:
    engine = api.client.server.app[ENGINE]
    if limited:
        monkeypatch.setattr(engine.quotas, "limits_sandboxes", lambda org: True)
    lifecycle = engine.provisioning._lifecycle
    before = await lifecycle.alive()

    async def meter(org: str, size: int, refuse: bool) -> None:
        await asyncio.sleep(0.05)  # the driver is under way meanwhile
        raise QuotaExceeded("storage quota exceeded (test)")

    monkeypatch.setattr(engine.recorder, "meter", meter)
    err = await api.call("POST", "/sandbox", json=body, expect=403)
    assert "storage quota" in err["message"]
    assert await lifecycle.alive() == before
    assert (await api.data("GET", "/sandbox"))["sandboxes"] == []


@pytest.mark.runs_on("fake-embedded")
@pytest.mark.parametrize("body", [{}, {"command": {"exec": ["echo", "hi"], "mode": "oneshot"}}],
                         ids=["idle", "oneshot"])
async def test_a_replica_whose_lease_may_have_lapsed_records_no_sandbox_it_made(
        api: Api, monkeypatch: pytest.MonkeyPatch, body: dict[str, object]) -> None:
    """Stalled past its lease while the driver made the sandbox, a replica may have been taken
    over, and the survivor ends what no event records (service/takeover.py): appending it now
    could record a sandbox that is gone. Ended and not recorded, answered 503 to try again."""
    engine = api.client.server.app[ENGINE]
    lifecycle = engine.provisioning._lifecycle
    before = await lifecycle.alive()
    seen = watch(api, monkeypatch)
    monkeypatch.setattr(engine.replicas, "current", lambda: False)
    err = await api.call("POST", "/sandbox", json=body, expect=503)
    assert err["code"] == "REPLICA_UNAVAILABLE" and "lease" in err["message"], err
    assert seen == ["provision", "provisioned"], seen  # made, then nothing appended
    assert await lifecycle.alive() == before
    assert (await api.data("GET", "/sandbox"))["sandboxes"] == []


@pytest.mark.parametrize("body", [{}, {"command": {"exec": ["echo", "hi"], "mode": "oneshot"}}],
                         ids=["idle", "oneshot"])
async def test_a_create_recorded_after_a_survivor_discarded_it_is_answered_failed_not_made(
        api: Api, monkeypatch: pytest.MonkeyPatch, body: dict[str, object]) -> None:
    """A replica's append of a sandbox it made lands after a survivor recorded that sandbox
    ended (``lifecycle:discarded``: its lease lapsed meanwhile, service/takeover.py). The log
    folds the sandbox failed with the survivor's reason, its command failed unrun; the client
    is answered 503 saying so, not handed a sandbox that is gone, and nothing of it is left."""
    from hutch.core import ids
    from hutch.core.events import SandboxDiscarded, encoded

    engine = api.client.server.app[ENGINE]
    log, lifecycle = engine.recorder._log, engine.provisioning._lifecycle
    before = await lifecycle.alive()
    append = log.append
    why = "the replica running it (r9) was lost before it recorded the sandbox, which the replica that took it over ended"

    async def survivor_first(events: Sequence[Event | Encoded]) -> list[int]:
        first = events[0].event if isinstance(events[0], Encoded) else events[0]
        if first.type == "create":
            discard = Event(ids.new_id("event"), first.sandbox_id, first.created_at, SandboxDiscarded(reason=why))
            await append([encoded(discard)])
        return await append(events)

    monkeypatch.setattr(log, "append", survivor_first)
    err = await api.call("POST", "/sandbox", json=body, expect=503)
    assert err["code"] == "REPLICA_UNAVAILABLE" and "was ended, not made" in err["message"] and why in err["message"]
    sid = err["message"].split()[1]
    sb = await api.data("GET", f"/sandbox/{sid}")
    assert sb["status"] == "failed" and why in sb["reason"], sb
    executions = (await api.data("GET", f"/sandbox/sandboxes/{sid}/executions"))["executions"]
    assert all(ex["status"] == "failed" for ex in executions), executions
    assert len(executions) == (1 if body else 0)
    events = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events"))["events"]
    assert [e["type"] for e in events][:3] == ["lifecycle:discarded", "create", "lifecycle:started"], events
    assert events[0]["event"] == {"reason": why}
    history = await api.data("GET", f"/sandbox/sandboxes/{sid}/history")
    assert history, history  # the timeline starts at its create: the discard alone is no sandbox
    assert await lifecycle.alive() == before
