"""A server stopping while a command runs: it stops within seconds, the command recorded as cut
short (``Executions._run`` records the end as its task is cancelled), on either profile."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.api.conftest import STORE, AppFactory
from tests.api.test_cancel import running

STOP_SECONDS = 5.0  # an idle server stops in well under a second; the end's append is one Produce


@pytest.mark.runs_on(*STORE)
async def test_a_server_stopping_under_a_running_command_stops_promptly_and_records_it(
        make_api: AppFactory) -> None:
    api = await make_api()
    _, ex = await running(api, ["sleep", "60"])

    began = time.monotonic()
    async with asyncio.timeout(STOP_SECONDS * 4):  # a hang fails here, not at the suite's timeout
        await api.client.close()
    assert time.monotonic() - began < STOP_SECONDS

    again = await make_api()  # the same log and store: what the stopping server recorded
    ended = await again.data("GET", f"/sandbox/execution/{ex['executionId']}")
    assert ended["status"] == "failed" and "shut down" in ended["error"], ended


@pytest.mark.runs_on("fake-production")
async def test_a_server_left_running_a_command_stops_before_its_database_and_topic_go(
        make_api: AppFactory) -> None:
    # What every production API test with a command still running leaves to the fixtures:
    # make_api stops its servers first (else the end's append waits on a dropped topic).
    api = await make_api()
    await running(api, ["sleep", "60"])
