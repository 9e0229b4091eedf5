"""A local sandbox whose init is killed from the host (an operator's kill -9, the OOM killer)
is recorded failed with a reason, through the API server (drivers/local/endwatch.py)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from hutch.api.keys import ENGINE
from hutch.drivers.local.driver import LocalDriver
from tests.api.conftest import Api
from tests.api.test_lifecycle import new_sandbox


@pytest.mark.parametrize("driver_name", ["local"])
@pytest.mark.parametrize("profile", [{}])  # the embedded profile
async def test_kill_9_of_a_sandbox_init_fails_the_sandbox_with_a_reason(api: Api) -> None:
    sid = await new_sandbox(api)
    driver = api.client.app[ENGINE].parts.driver
    assert isinstance(driver, LocalDriver)
    os.kill(driver._registry.running(sid).init_pid, signal.SIGKILL)
    t0 = time.monotonic()
    status = await api.data("GET", f"/sandbox/status/{sid}?waitForStatus=failed&waitMs=5000")
    assert status["status"] == "failed", status
    assert time.monotonic() - t0 < 5
    events = (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?direction=desc&limit=1"))["events"]
    assert events[0]["type"] == "lifecycle:failed"
    assert "init" in events[0]["event"]["reason"] and "without a destroy" in events[0]["event"]["reason"]
    await api.call("DELETE", f"/sandbox/{sid}")  # a failed sandbox still deletes cleanly
