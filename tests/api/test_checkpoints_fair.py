"""One organization's checkpoints never hold another's back for long. A checkpoint copies the
sandbox's files on the host (as long as they are large) in a few threads for the whole server
(drivers/local/checkpoints.py); an organization asking for many at once filled that queue, and
another organization's one checkpoint waited behind all of them. Each organization now has at
most two under way (service/checkpoints.py): what it asks beyond waits in its own queue, so
another's waits behind at most two copies, whatever the first asked.

The fake driver, its copies held until the test lets each go: the order they begin in is
what the threads of a real driver would be handed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from hutch.api.keys import ENGINE
from tests.api.conftest import Api


@pytest.mark.runs_on("fake-embedded")
async def test_an_organizations_checkpoint_waits_behind_at_most_two_of_anothers(api: Api) -> None:
    await api.data("POST", "/orgs", json={"name": "other"}, expect=201)
    other = {"Authorization": f"Bearer {(await api.data('POST', '/keys?orgId=org_other', json={'role': 'member'}, expect=201))['secret']}"}
    mine = [(await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
            for _ in range(6)]
    theirs = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201, headers=other))["sandboxId"]

    driver = api.client.app[ENGINE].parts.driver
    copy = driver.checkpoint
    began: list[str] = []
    go: dict[str, asyncio.Event] = {}
    moved = asyncio.Event()

    async def until(seen: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not seen():
                moved.clear()
                await moved.wait()

    async def held(sandbox_id: str, checkpoint_id: str) -> None:
        began.append(sandbox_id)
        moved.set()
        go[sandbox_id] = asyncio.Event()
        await go[sandbox_id].wait()
        await copy(sandbox_id, checkpoint_id)

    driver.checkpoint = held
    asked = [asyncio.create_task(api.data("POST", f"/sandbox/{sid}/checkpoint", json={"name": "c"}, expect=201))
             for sid in mine]
    await until(lambda: len(began) >= 2)
    await asyncio.sleep(0.2)
    assert len(began) == 2, f"one organization has at most two under way: {began}"
    asked.append(asyncio.create_task(api.data("POST", f"/sandbox/{theirs}/checkpoint", json={"name": "c"},
                                              expect=201, headers=other)))
    await until(lambda: theirs in began)
    assert began.index(theirs) == 2, f"the other organization's began next: {began}"
    async with asyncio.timeout(20):
        while not all(t.done() for t in asked):  # each let go as it begins
            for event in list(go.values()):
                event.set()
            await asyncio.wait(asked, timeout=0.05)
    assert sorted(began) == sorted([*mine, theirs]), "every checkpoint was taken"
    for task in asked:
        task.result()
