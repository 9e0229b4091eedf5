"""Can one tenant take the local driver's warm pool from the others? Tenant A, with a member key
and no quota, creates sandboxes of a memory size of its own; tenant B then creates one as most
do (the server's default size). The pool is filled for one memory size per runtime (a pooled
sandbox's /dev is sized when it starts), so whose size it is filled for decides who is served
from it.

In process (the API over the local driver, embedded profile), a claim's result seen by
wrapping the pool's ``claim``: B's create is served from the pool or made from scratch.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hutch.api.keys import ENGINE
from hutch.core.runtimes import DEFAULT_RUNTIME
from tests.api.conftest import Api
from tests.api.test_tenancy import bearer, new_key, new_org


async def settled(pool: Any) -> None:
    """The pool full and not filling (what a refill leaves once done)."""
    deadline = asyncio.get_running_loop().time() + 60
    while len(pool.idle.get(DEFAULT_RUNTIME, ())) < pool.size or pool._filling:
        assert asyncio.get_running_loop().time() < deadline, "the pool did not settle within 60 s"
        await asyncio.sleep(0.05)


@pytest.mark.runs_on("local-embedded")
async def test_another_tenants_memory_sizes_leave_the_pool_to_the_default(api: Api) -> None:
    driver = api.client.server.app[ENGINE].provisioning._lifecycle
    pool = driver._pool
    assert pool.size == 2, "the warm pool is on by default (cgroup v1, as root)"
    a = bearer((await new_key(api, await new_org(api, "attacker"), "member"))["secret"])
    b = bearer((await new_key(api, await new_org(api, "victim"), "member"))["secret"])
    claimed: list[bool] = []
    claim = pool.claim

    async def seen(req: Any) -> Any:
        got = await claim(req)
        claimed.append(got is not None)
        return got

    pool.claim = seen
    made = [(b, await api.data("POST", "/sandbox", json={}, headers=b, expect=201))]  # B's first: the pool fills
    await settled(pool)
    for _ in range(2):  # A, at a size of its own (not the pool's to keep)
        made.append((a, await api.data("POST", "/sandbox", json={"resources": {"memory": "600Mi"}}, headers=a,
                                       expect=201)))
        await settled(pool)
    claimed.clear()
    made.append((b, await api.data("POST", "/sandbox", json={}, headers=b, expect=201)))
    assert claimed == [True], "B's create was made from scratch: A's sizes had taken the pool"
    for key, sb in made:
        await api.call("DELETE", f"/sandbox/{sb['sandboxId']}", headers=key)
