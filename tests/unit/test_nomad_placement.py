"""drivers/nomad/placement.py: a placed task counts as running once its client says so.

The Nomad client tells the servers a new allocation runs up to a second late (its "typical"
updates are batched), so ``place`` also knocks on the task through an alloc exec. A fake
client stands for Nomad here (the layer above it is what is tested); tests/nomad and
tests/cluster place real jobs through the same code.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hutch.core.errors import DriverFailure
from hutch.drivers.nomad import placement
from hutch.drivers.nomad.client import ExecFailed

JOB = {"Job": {"ID": "hutch-x-sbx_1"}}


def alloc(status: str, task_state: str = "pending", events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"ID": "alloc-1", "ClientStatus": status, "NodeName": "hutch-c2",
            "TaskStates": {"sandbox": {"State": task_state, "Events": events or []}}}


class FakeNomad:
    """The server answers ``states`` to successive blocking queries (the last one for ever,
    blocking as Nomad does when nothing changes); the client refuses ``refusals`` knocks."""

    def __init__(self, states: list[list[dict[str, Any]]], refusals: int | None) -> None:
        self.states = states
        self.refusals = refusals  # None: the task never starts as far as the client knows
        self.knocks = 0
        self.queries = 0
        self.registered: list[dict[str, Any]] = []

    async def register(self, job: dict[str, Any]) -> dict[str, Any]:
        self.registered.append(job)
        return {}

    async def job(self, job_id: str) -> dict[str, Any]:
        return {"ID": job_id, "Status": "pending"}

    async def blocking_get(self, path: str, index: int, wait: str = "30s", **params: str) -> tuple[Any, int]:
        if path == "/v1/job/hutch-x-sbx_1/evaluations":  # no allocation yet: placement asks why
            return [{"FailedTGAllocs": None}], 1
        assert path == "/v1/job/hutch-x-sbx_1/allocations"
        if index >= len(self.states):  # nothing new: a blocking query holds
            await asyncio.sleep(3600)
        self.queries += 1
        return self.states[index], index + 1

    async def exec(self, alloc_id: str, task: str, command: list[str], **_: Any) -> int:
        assert (alloc_id, task) == ("alloc-1", "sandbox")
        assert command[0] == "hutch-exec:v1"  # a plugin verb: nothing starts in the sandbox
        self.knocks += 1
        if self.refusals is None or self.knocks <= self.refusals:
            raise ExecFailed('task "sandbox" not started yet.')
        return 1


def leftover_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]


async def test_the_client_saying_the_task_runs_is_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "KNOCK_EVERY", 0.001)
    nomad = FakeNomad([[alloc("pending")]], refusals=3)  # the server never hears it runs
    assert await asyncio.wait_for(placement.place(nomad, JOB), 5) == "alloc-1"  # type: ignore[arg-type]
    assert nomad.knocks == 4
    await asyncio.sleep(0)
    assert leftover_tasks() == []  # the blocking query still waiting is cancelled


async def test_the_server_saying_it_runs_is_enough_too() -> None:
    nomad = FakeNomad([[alloc("pending")], [alloc("running", "running")]], refusals=None)
    assert await asyncio.wait_for(placement.place(nomad, JOB), 5) == "alloc-1"  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert leftover_tasks() == []  # and the knocking (begun at "pending") stops


async def test_a_task_that_fails_to_start_fails_the_create_while_knocks_are_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "KNOCK_EVERY", 0.001)
    failed = alloc("failed", "dead", [{"Type": "Driver Failure", "DisplayMessage": "image not found"}])
    nomad = FakeNomad([[alloc("pending")], [failed]], refusals=None)
    with pytest.raises(DriverFailure, match="image not found"):
        await asyncio.wait_for(placement.place(nomad, JOB), 5)  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert leftover_tasks() == []


async def test_no_knock_before_the_server_has_placed_an_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "KNOCK_EVERY", 0.001)
    nomad = FakeNomad([[], [], [alloc("pending")]], refusals=0)
    assert await asyncio.wait_for(placement.place(nomad, JOB), 5) == "alloc-1"  # type: ignore[arg-type]
    assert nomad.queries == 3 and nomad.knocks == 1


async def test_knocks_slow_down_on_a_task_slow_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """An image pulled for a minute is not knocked on every 40 ms."""
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(placement.asyncio, "sleep", sleep)
    nomad = FakeNomad([[alloc("pending")]], refusals=12)
    assert await asyncio.wait_for(placement._knock(nomad, "alloc-1"), 5) == "alloc-1"  # type: ignore[arg-type]
    assert slept[0] == placement.KNOCK_EVERY and slept == sorted(slept)
    assert slept[-1] == placement.KNOCK_MAX and len(slept) == 12
