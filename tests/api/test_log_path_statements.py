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


@pytest.fixture(params=["fake"])
def driver_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("profile", ["production"], indirect=True)  # the embedded one has no PostgreSQL
async def test_a_oneshot_sends_no_reset_statements(api: Api, profile: dict[str, str]) -> None:
    before = _statements()
    body = {"command": {"exec": ["echo", "hi"], "mode": "oneshot"}}
    created = await api.data("POST", "/sandbox", json=body, expect=201)
    sid = created["sandboxId"]
    assert await api.stream(created["stdoutStreamUrl"]) == b"hi\n"  # read through the output pool
    for _ in range(100):
        if (await api.data("GET", f"/sandbox/{sid}"))["status"] in ("terminated", "completed", "failed"):
            break
        await asyncio.sleep(0.05)
    sent = {k: v - before.get(k, 0) for k, v in _statements().items() if v != before.get(k, 0)}
    assert any(store == "replica registry" for store, _ in sent), sent  # the pools were used
    assert any(store == "output streams" for store, _ in sent), sent
    resets = {k: v for k, v in sent.items() if k[1].startswith("select pg_advisory_unlock_all")}
    assert resets == {}, sent
