"""E2B's timeout with autoPause, reached while a command runs on a driver that cannot freeze a
running command: the reaper waited for the commands to end before pausing, so one that never
ended kept the sandbox running past its timeout for ever (the rootless driver, which cannot
freeze at all, did the same). A timeout is a limit: the sandbox is paused filesystem-only where
the driver can (its files kept, its commands ended saying why), else ended, naming why."""

from __future__ import annotations

import pytest

from hutch.api.e2b.access import hutch_id
from hutch.api.e2b.server import create_e2b_app
from hutch.api.keys import ENGINE, TENANTS
from tests.api.conftest import KEY, AppFactory


@pytest.fixture
def driver_name() -> str:
    return "fake"  # pauses, but freezes no running command (Capabilities.pause_running false)


@pytest.mark.runs_on("fake-embedded")
async def test_a_command_that_never_ends_does_not_outlive_the_timeout(make_api: AppFactory, aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    api = await make_api()
    e2b = await aiohttp_client(create_e2b_app(api.client.server.app[ENGINE], api.client.server.app[TENANTS]))
    resp = await e2b.post("/sandboxes", headers={"X-API-Key": KEY},
                          json={"templateID": "base", "timeout": 2, "autoPause": True})
    made = await resp.json()
    assert resp.status == 201, made
    sid = hutch_id(made["sandboxID"])
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sleep", "3600"]})
    found = await api.data("GET", f"/sandbox/status/{sid}?waitForStatus=terminated&waitMs=8000")
    assert found["status"] == "terminated", found  # it ran on before, past its timeout
    ended = await api.wait_execution(ex["executionId"])
    assert ended["status"] != "running", ended
    sb = await api.data("GET", f"/sandbox/{sid}")
    # Why: the timeout, and what kept it from pausing ("timeout" alone is in every sandbox's
    # text, its spec's key: the reason itself is read).
    assert sb["reason"].startswith("timeout (2s) reached") and "has commands running" in sb["reason"], sb
