"""A catalog runtime that is not built yet is built at its first use, as ``docker run`` pulls
an image it lacks: the create answers at once with the sandbox ``creating`` (a command
``queued``), the build's steps are events on the sandbox, execute / streams / waits hold
until it is ready, concurrent creates share one build, and a failed build ends the
sandbox ``failed`` in the build's own words while the next create tries again.

The engine's side runs on the fake driver (a scripted build) on both profiles; the real
builds (the local driver's rootfs from Debian, the nomad driver's image push) are in
``test_first_use_real.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from hutch.api.keys import ENGINE
from hutch.drivers.fake.driver import FakeDriver
from tests.api.conftest import Api, AppFactory

RUNTIME = "node:lts"


@pytest.fixture
def driver_name() -> str:
    return "fake"


async def fake_with_unbuilt(make_api: AppFactory, **build: object) -> tuple[Api, FakeDriver]:
    api = await make_api()
    driver = api.client.app[ENGINE].parts.driver
    assert isinstance(driver, FakeDriver)
    driver.unbuilt = {RUNTIME}
    for key, value in build.items():
        setattr(driver, key, value)
    return api, driver


async def events_of(api: Api, sid: str) -> list[dict]:
    return (await api.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100"))["events"]


async def test_a_create_builds_the_runtime_and_answers_creating(make_api: AppFactory) -> None:
    api, driver = await fake_with_unbuilt(make_api, build_seconds=0.6)
    listed = {r["name"]: r for r in (await api.data("GET", "/sandbox/runtimes"))["runtimes"]}
    assert listed[RUNTIME]["available"] is False and "building" not in listed[RUNTIME]
    created = await api.data("POST", "/sandbox", json={"runtime": RUNTIME}, expect=201)
    sid = created["sandboxId"]
    assert created["status"] == "creating"
    listed = {r["name"]: r for r in (await api.data("GET", "/sandbox/runtimes"))["runtimes"]}
    assert listed[RUNTIME]["building"] is True
    # Execute holds until the sandbox is ready, then runs.
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["echo", "after the build"]})
    done = await api.wait_execution(ex["executionId"])
    assert done["status"] == "completed"
    assert await api.stream(ex["stdoutStreamUrl"]) == b"after the build\n"
    types = [e["type"] for e in await events_of(api, sid)]
    assert types[:4] == ["create", "runtime:build", "runtime:build", "lifecycle:started"], types
    progress = [e["event"]["message"] for e in await events_of(api, sid) if e["type"] == "runtime:build"]
    assert progress == [f"{RUNTIME}: [1/2] fake step", f"{RUNTIME}: [2/2] fake step"]
    assert driver.builds_started == 1
    # Built now: the next create is ready at once and builds nothing.
    again = await api.data("POST", "/sandbox", json={"runtime": RUNTIME}, expect=201)
    assert again["status"] == "idle" and driver.builds_started == 1


async def test_concurrent_creates_share_one_build(make_api: AppFactory) -> None:
    api, driver = await fake_with_unbuilt(make_api, build_seconds=0.5)
    made = await asyncio.gather(*[api.data("POST", "/sandbox", json={"runtime": RUNTIME}, expect=201)
                                  for _ in range(5)])
    for sb in made:
        ready = await api.data("GET", f"/sandbox/{sb['sandboxId']}?waitForStatus=idle&waitMs=10000")
        assert ready["status"] == "idle"
    assert driver.builds_started == 1


async def test_a_oneshot_run_queues_its_command_behind_the_build(make_api: AppFactory) -> None:
    api, _ = await fake_with_unbuilt(make_api, build_seconds=0.5)
    created = await api.data("POST", "/sandbox", expect=201, json={
        "runtime": RUNTIME, "command": {"exec": ["echo", "hello"], "mode": "oneshot"}})
    assert created["status"] == "creating"
    queued = await api.data("GET", f"/sandbox/execution/{created['executionId']}")
    assert queued["status"] == "queued"
    # The stream URL, read at once, waits for the command instead of reading nothing.
    out = await api.stream(created["stdoutStreamUrl"])
    assert out == b"hello\n"
    done = await api.wait_execution(created["executionId"])
    assert (done["status"], done["exitCode"]) == ("completed", 0)
    ended = await api.data("GET", f"/sandbox/{created['sandboxId']}?waitForStatus=terminated&waitMs=10000"
                                  "&includeDeleted=true")
    assert ended["status"] == "terminated"


async def test_a_failed_build_fails_the_sandbox_in_its_words_and_the_next_create_retries(
    make_api: AppFactory,
) -> None:
    api, driver = await fake_with_unbuilt(make_api, fail_build="mmdebstrap failed (exit 1): E: no route to mirror")
    created = await api.data("POST", "/sandbox", expect=201, json={
        "runtime": RUNTIME, "command": {"exec": ["echo", "never"], "mode": "oneshot"}})
    sid = created["sandboxId"]
    failed = await api.data("GET", f"/sandbox/{sid}?waitForStatus=failed&waitMs=10000")
    assert failed["status"] == "failed"
    ex = await api.wait_execution(created["executionId"])
    assert ex["status"] == "failed" and "E: no route to mirror" in ex["error"]
    assert await api.stream(created["stdoutStreamUrl"]) == b""  # closed, not left hanging
    assert RUNTIME not in {r["name"] for r in (await api.data("GET", "/sandbox/runtimes"))["runtimes"]
                           if r["available"]}
    # Execute on it says why it cannot run.
    refused = await api.call("POST", f"/sandbox/{sid}/execute", json={"command": ["true"]}, expect=409)
    assert "failed" in refused["message"]
    driver.fail_build = None
    again = await api.data("POST", "/sandbox", json={"runtime": RUNTIME}, expect=201)
    ready = await api.data("GET", f"/sandbox/{again['sandboxId']}?waitForStatus=idle&waitMs=10000")
    assert ready["status"] == "idle" and driver.builds_started == 2


async def test_a_sandbox_destroyed_during_its_build_is_never_made(make_api: AppFactory) -> None:
    api, driver = await fake_with_unbuilt(make_api, build_seconds=0.6)
    created = await api.data("POST", "/sandbox", json={"runtime": RUNTIME}, expect=201)
    await api.call("DELETE", f"/sandbox/{created['sandboxId']}")
    await asyncio.sleep(1.0)
    assert created["sandboxId"] not in driver.sandboxes
    assert RUNTIME in driver.runtimes_available()  # the build itself went on, for whoever comes next
