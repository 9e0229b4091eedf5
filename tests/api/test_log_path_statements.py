"""What a one-shot costs in PostgreSQL statements (hutch.core.counters): the pools whose
sessions keep no state release a connection without asyncpg's reset statement."""

from __future__ import annotations

import asyncio

import pytest

from hutch.core import counters
from tests.api.conftest import Api


def _statements() -> dict[tuple[str, str], int]:
    return {(labels["store"], labels["kind"]): value for name, labels, value in counters.counts()
            if name == "hutch_store_statements_total"}


async def _ended(api: Api, sandbox_id: str) -> None:
    for _ in range(200):
        if (await api.data("GET", f"/sandbox/{sandbox_id}"))["status"] in ("terminated", "completed", "failed"):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"sandbox {sandbox_id} did not end within 10 s")


@pytest.mark.runs_on("fake-production")  # the embedded profile has no PostgreSQL
async def test_a_oneshot_sends_no_reset_statements(api: Api, profile: dict[str, str]) -> None:
    before = _statements()
    body = {"command": {"exec": ["echo", "hi"], "mode": "oneshot"}}
    created = await api.data("POST", "/sandbox", json=body, expect=201)
    assert await api.stream(created["stdoutStreamUrl"]) == b"hi\n"  # read through the output pool
    await _ended(api, created["sandboxId"])
    sent = {k: v - before.get(k, 0) for k, v in _statements().items() if v != before.get(k, 0)}
    assert any(store == "replica registry" for store, _ in sent), sent  # the pools were used
    assert any(store == "output streams" for store, _ in sent), sent
    resets = {k: v for k, v in sent.items() if k[1].startswith("select pg_advisory_unlock_all")}
    assert resets == {}, sent


@pytest.mark.runs_on("fake-production")
async def test_a_commands_two_streams_are_locked_and_released_in_one_statement_each(
        api: Api, profile: dict[str, str]) -> None:
    # `true`: no bytes to save first, so both streams close at once (one with bytes to save
    # releases its lock once they are saved, on its own if the other is done by then).
    body = {"command": {"exec": ["true"], "mode": "oneshot"}}
    created = await api.data("POST", "/sandbox", json=body, expect=201)  # warms the pools
    await api.stream(created["stdoutStreamUrl"])
    before = _statements()
    created = await api.data("POST", "/sandbox", json=body, expect=201)
    assert await api.stream(created["stdoutStreamUrl"]) == b""  # ends once closed
    await _ended(api, created["sandboxId"])  # both streams closed before the command is recorded done
    sent = {k: v - before.get(k, 0) for k, v in _statements().items() if v != before.get(k, 0)}
    session = {kind: n for (store, kind), n in sent.items() if store == "output streams session"}
    assert session.get("select pg_try_advisory_lock") == 1, sent  # stdout and stderr together
    assert session.get("select pg_advisory_unlock") == 1, sent


@pytest.mark.runs_on("fake-production")
async def test_a_create_and_its_oneshot_read_nothing_of_the_projection_store(api: Api, profile: dict[str, str]) -> None:
    # The id is minted as the sandbox is created: nothing can be stored under it yet. What the
    # command path reads after is folded here (service/reads.py), the long-poll's too.
    body = {"command": {"exec": ["true"], "mode": "oneshot"}}
    created = await api.data("POST", "/sandbox", json=body, expect=201)  # warms the pools
    await api.wait_execution(created["executionId"])
    before = _statements()
    created = await api.data("POST", "/sandbox", json=body, expect=201)
    await api.stream(created["stdoutStreamUrl"])
    assert (await api.wait_execution(created["executionId"]))["status"] == "completed"
    sent = {k: v - before.get(k, 0) for k, v in _statements().items() if v != before.get(k, 0)}
    reads = {kind: n for (store, kind), n in sent.items() if store == "projection store" and kind.startswith("select")
             and kind != "select projection_position"}  # the projector's own LOAD
    assert reads == {}, sent


@pytest.mark.runs_on("fake-production")
async def test_a_stream_written_here_is_read_without_asking_postgresql_what_it_knows(
        api: Api, profile: dict[str, str]) -> None:
    # The writer is in this process: whether it is open and how much it saved are known here,
    # so a reader asks PostgreSQL only for bytes saved past its position.
    for argv, out in ((["true"], b""), (["echo", "hi"], b"hi\n")):
        body = {"command": {"exec": argv, "mode": "oneshot"}}
        created = await api.data("POST", "/sandbox", json=body, expect=201)
        await api.wait_execution(created["executionId"])
        before = _statements()
        assert await api.stream(created["stdoutStreamUrl"]) == out  # closed here already
        sent = {k: v - before.get(k, 0) for k, v in _statements().items() if v != before.get(k, 0)}
        assert ("output streams", "select pg_locks") not in sent, sent
        assert sent.get(("output streams", "select hutch_output_chunks"), 0) == (1 if out else 0), sent
