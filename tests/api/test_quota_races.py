"""Concurrent creates against a sandbox quota: the organization's lock is what holds it.

Only organizations with a sandbox quota take that lock (service/quotas.py), so this is the test
that fails if the lock is dropped for them too."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.api.conftest import STORE, Api
from tests.api.test_tenancy import bearer, new_key, new_org

LIMIT = 2
ATTEMPTS = 8


async def create(api: Api, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    resp = await api.client.post("/sandbox", headers=headers, json={})
    return resp.status, await resp.json()


@pytest.mark.runs_on(*STORE)  # the organization's lock over either store
async def test_concurrent_creates_cannot_pass_a_sandbox_quota(api: Api) -> None:
    await new_org(api, "alpha")
    admin = bearer((await new_key(api, "org_alpha", "admin"))["secret"])
    await api.data("PATCH", "/orgs/org_alpha/quota", json={"sandboxes": LIMIT})  # the operator sets it

    answers = await asyncio.gather(*(create(api, admin) for _ in range(ATTEMPTS)))

    made = [body["data"]["sandboxId"] for status, body in answers if status == 201]
    refused = [body for status, body in answers if status != 201]
    assert len(made) == LIMIT, answers
    assert all(body["code"] == "QUOTA_EXCEEDED" and body["quota"] == "sandboxes" for body in refused), refused
    org = await api.data("GET", "/orgs/org_alpha", headers=admin)
    assert org["usage"]["sandboxes"] == LIMIT

