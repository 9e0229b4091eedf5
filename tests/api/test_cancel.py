"""Cancelling a command: explicitly (``POST /sandbox/execution/{id}/cancel``), and when every
client waiting for it went away (the real client's ``AbortSignal`` only drops its
connections) unless one comes back within the grace."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from hutch.api.keys import ENGINE
from tests.api.conftest import AUTH, REAL, STORE, Api, AppFactory

GRACE = 0.6


async def running(api: Api, command: list[str]) -> tuple[str, dict]:
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": command})
    for _ in range(100):
        if (await api.data("GET", f"/sandbox/execution/{ex['executionId']}"))["status"] == "running":
            break
        await asyncio.sleep(0.05)
    return sid, ex


async def ended(api: Api, execution_id: str, within: float = 10.0) -> dict:
    """Polls without ``wait``: a long-poll would itself be a waiter coming back."""
    for _ in range(int(within / 0.1)):
        ex = await api.data("GET", f"/sandbox/execution/{execution_id}")
        if ex["status"] not in ("queued", "running"):
            return ex
        await asyncio.sleep(0.1)
    return ex


async def with_grace(make_api: AppFactory) -> Api:
    api = await make_api()
    api.client.app[ENGINE].watchers.grace = GRACE
    return api


async def leave_early(api: Api, path: str, after: float = 0.3) -> None:
    """A client that starts waiting, then goes away (an aborted fetch)."""
    url = api.client.make_url(path)

    async def wait_for_it(session: aiohttp.ClientSession) -> None:
        async with session.get(url, headers=AUTH) as resp:
            await resp.read()

    async with aiohttp.ClientSession() as session:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(wait_for_it(session), after)


@pytest.mark.runs_on(*STORE, *REAL)  # a real process tree ended; the record in both stores
async def test_cancel_ends_the_whole_tree_and_the_sandbox_lives_on(api: Api, driver_name: str) -> None:
    sid, ex = await running(api, ["sh", "-c", "sleep 300 & sleep 301"])
    done = await api.data("POST", f"/sandbox/execution/{ex['executionId']}/cancel")
    assert (done["status"], done.get("error")) == ("cancelled", "cancelled on request"), done
    assert done["durationMs"] < 10_000
    if driver_name != "fake":  # the fake driver runs no processes to look at
        ps = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["ps", "-eo", "args"]})
        await api.wait_execution(ps["executionId"])
        assert b"sleep 30" not in await api.stream(ps["stdoutStreamUrl"])
    again = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["echo", "alive"]})
    assert (await api.wait_execution(again["executionId"]))["status"] == "completed"
    # Cancelling what has ended answers it as it is; an unknown id is 404.
    assert (await api.data("POST", f"/sandbox/execution/{ex['executionId']}/cancel"))["status"] == "cancelled"
    finished = await api.data("POST", f"/sandbox/execution/{again['executionId']}/cancel")
    assert finished["status"] == "completed"
    await api.call("POST", "/sandbox/execution/exec_doesnotexist0000000000/cancel", expect=404)


@pytest.mark.runs_on(*STORE)  # the service's watchers (the cancel itself: above)
async def test_a_command_whose_waiter_left_is_cancelled_after_the_grace(make_api: AppFactory) -> None:
    api = await with_grace(make_api)
    _, ex = await running(api, ["sleep", "60"])
    await leave_early(api, f"/sandbox/execution/{ex['executionId']}?wait=30s")
    done = await ended(api, ex["executionId"])
    assert done["status"] == "cancelled" and "went away" in done["error"], done


@pytest.mark.runs_on(*STORE)  # the service's watchers
async def test_a_stream_reader_that_left_cancels_the_command_too(make_api: AppFactory) -> None:
    api = await with_grace(make_api)
    _, ex = await running(api, ["sleep", "60"])
    path = "/" + ex["stdoutStreamUrl"].split("://", 1)[1].split("/", 1)[1]
    await leave_early(api, path)
    done = await ended(api, ex["executionId"])
    assert done["status"] == "cancelled", done


@pytest.mark.runs_on(*STORE)  # the service's watchers
async def test_a_waiter_that_comes_back_within_the_grace_keeps_the_command(make_api: AppFactory) -> None:
    api = await with_grace(make_api)
    _, ex = await running(api, ["sleep", "60"])
    await leave_early(api, f"/sandbox/execution/{ex['executionId']}?wait=30s")
    # Back at once (a retry after a dropped connection), and it stays past the grace.
    still = await api.data("GET", f"/sandbox/execution/{ex['executionId']}?wait={int(GRACE * 3000)}ms")
    assert still["status"] == "running"
    assert (await api.data("GET", f"/sandbox/execution/{ex['executionId']}"))["status"] == "running"
    await api.data("POST", f"/sandbox/execution/{ex['executionId']}/cancel")


@pytest.mark.runs_on(*STORE)  # the service's watchers
async def test_fire_and_forget_commands_and_jobs_are_never_abandoned(make_api: AppFactory) -> None:
    api = await with_grace(make_api)
    sid, ex = await running(api, ["sleep", "60"])  # nobody ever waits for it
    job = await api.data("POST", f"/sandbox/sandboxes/{sid}/jobs", json={"command": ["sleep", "60"]}, expect=201)
    job_path = "/" + job["stdoutStreamUrl"].split("://", 1)[1].split("/", 1)[1]
    await leave_early(api, job_path)  # a job's reader leaving stops nothing: jobs outlive requests
    await asyncio.sleep(GRACE * 3)
    assert (await api.data("GET", f"/sandbox/execution/{ex['executionId']}"))["status"] == "running"
    assert (await api.data("GET", f"/sandbox/sandboxes/{sid}/jobs/{job['jobId']}"))["status"] == "running"
    await api.data("POST", f"/sandbox/execution/{ex['executionId']}/cancel")
