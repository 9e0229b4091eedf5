"""E2B's wire counts toward an organization's requests at once (api/at_once.py), shared with
hutch's own routes: a command's output stream, a watch or a download held over E2B's wire
holds a server socket as a long-poll does, and only hutch's routes were counted, so a tenant
could take the server's file descriptors past its bound through the E2B port."""

from __future__ import annotations

from typing import Any

import pytest

from hutch.api.at_once import SETTING, AtOnce
from hutch.api.e2b.server import create_e2b_app
from hutch.api.keys import ENGINE, TENANTS
from tests.api.conftest import KEY, AppFactory


@pytest.fixture
def driver_name() -> str:
    return "fake"


@pytest.mark.runs_on("fake-embedded")
async def test_e2b_requests_count_toward_the_organizations_share(make_api: AppFactory, aiohttp_client: Any) -> None:
    api = await make_api()
    tenants = api.client.server.app[TENANTS]
    at_once = AtOnce(2)
    e2b = await aiohttp_client(create_e2b_app(api.client.server.app[ENGINE], tenants, at_once=at_once))
    made = await (await e2b.post("/sandboxes", headers={"X-API-Key": KEY},
                                 json={"templateID": "base", "timeout": 300})).json()
    wire, token = made["sandboxID"], made["envdAccessToken"]
    org = tenants.authenticate(KEY).org_id
    envd = {"E2b-Sandbox-Id": wire, "X-Access-Token": token}
    with at_once.slot(org), at_once.slot(org):  # its share held elsewhere (long-polls on hutch's routes)
        for path, headers in ((f"/sandboxes/{wire}", {"X-API-Key": KEY}), ("/files?path=/etc/hostname", envd)):
            got = await e2b.get(path, headers=headers)
            assert got.status == 429, (path, got.status, await got.text())  # served before, uncounted
            assert SETTING in (await got.json())["message"]
    assert at_once.held(org) == 0
    got = await e2b.get(f"/sandboxes/{wire}", headers={"X-API-Key": KEY})
    assert got.status == 200, await got.text()
    bad = await e2b.get("/files?path=/etc/hostname", headers={**envd, "X-Access-Token": "key_x.forged"})
    assert bad.status == 401  # a forged token counts against no one, and is refused by its route
