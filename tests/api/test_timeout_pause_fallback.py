"""E2B's timeout with autoPause, reached while a command runs on a driver that cannot freeze a
running command: the reaper waited for the commands to end before pausing, so one that never
ended kept the sandbox running past its timeout for ever (the rootless driver, which cannot
freeze at all, did the same). A timeout is a limit: the sandbox is paused filesystem-only where
the driver can (its files kept, its commands ended saying why), else ended, naming why."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hutch.api.e2b.access import hutch_id
from hutch.api.e2b.server import create_e2b_app
from hutch.api.keys import ENGINE, TENANTS
from tests.api.conftest import KEY, AppFactory


@pytest.fixture
def driver_name() -> str:
    return "fake"  # pauses, but freezes no running command (Capabilities.pause_running false)


async def autopausing(e2b: Any, *, timeout: int) -> tuple[str, str]:
    """A sandbox made through E2B's API with ``autoPause`` and ``timeout`` seconds: its id, and
    E2B's id of it."""
    resp = await e2b.post("/sandboxes", headers={"X-API-Key": KEY},
                          json={"templateID": "base", "timeout": timeout, "autoPause": True})
    made = await resp.json()
    assert resp.status == 201, made
    return hutch_id(made["sandboxID"]), made["sandboxID"]


@pytest.mark.runs_on("fake-embedded")
async def test_a_command_that_never_ends_does_not_outlive_the_timeout(make_api: AppFactory, aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    api = await make_api()
    e2b = await aiohttp_client(create_e2b_app(api.client.server.app[ENGINE], api.client.server.app[TENANTS]))
    sid, _ = await autopausing(e2b, timeout=2)
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sleep", "3600"]})
    found = await api.data("GET", f"/sandbox/status/{sid}?waitForStatus=terminated&waitMs=8000")
    assert found["status"] == "terminated", found  # it ran on before, past its timeout
    ended = await api.wait_execution(ex["executionId"])
    assert ended["status"] != "running", ended
    sb = await api.data("GET", f"/sandbox/{sid}")
    # Why: the timeout, and what kept it from pausing ("timeout" alone is in every sandbox's
    # text, its spec's key: the reason itself is read).
    assert sb["reason"].startswith("timeout (2s) reached") and "has commands running" in sb["reason"], sb


@pytest.mark.runs_on("fake-embedded")
@pytest.mark.parametrize("fallback_fails", [False, True], ids=["fallback-refused", "fallback-failed"])
async def test_a_timeout_set_anew_as_the_reaper_falls_back_keeps_the_sandbox(
        make_api: AppFactory, aiohttp_client, monkeypatch: pytest.MonkeyPatch, fallback_fails: bool) -> None:  # type: ignore[no-untyped-def]
    """The user sets a new timeout just as the reaper's pause is refused (the command runs):
    the fallback went on from what the reaper had read, ending (or pausing filesystem-only,
    its commands killed) a sandbox whose timeout is a minute away now. Each pause is decided
    on the sandbox as it is then, under its lock: one no longer due is left to its new time.
    ``fallback_fails``: the filesystem-only fallback then fails too, and the end that followed
    went on from the old read as well; it is decided under the lock in the same way."""
    api = await make_api()
    engine = api.client.server.app[ENGINE]
    e2b = await aiohttp_client(create_e2b_app(engine, api.client.server.app[TENANTS]))
    sid, wire = await autopausing(e2b, timeout=2)
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sleep", "3600"]})
    pause = engine.control.pause
    fallbacks: list[bool] = []

    async def pause_as_the_user_sets_a_timeout(sandbox_id: str, **kwargs: Any) -> Any:
        if kwargs.get("memory") is False and not fallbacks:  # the reaper's fallback, once
            fallbacks.append(True)
            got = await e2b.post(f"/sandboxes/{wire}/timeout", headers={"X-API-Key": KEY},
                                 json={"timeout": 60})
            assert got.status == 204, await got.text()
            if fallback_fails:
                raise RuntimeError("the fallback's own bug")
        return await pause(sandbox_id, **kwargs)

    monkeypatch.setattr(engine.control, "pause", pause_as_the_user_sets_a_timeout)
    for _ in range(100):  # the reaper's turn: 2 s from the create
        if fallbacks:
            break
        await asyncio.sleep(0.1)
    assert fallbacks, "the reaper did not fall back"
    await asyncio.sleep(0.5)
    sb = await api.data("GET", f"/sandbox/{sid}")
    assert sb["status"] == "running", sb
    assert (await api.data("GET", f"/sandbox/execution/{ex['executionId']}"))["status"] == "running"


@pytest.mark.runs_on("fake-embedded")
async def test_a_pause_failing_in_the_drivers_own_words_ends_the_sandbox(
        make_api: AppFactory, aiohttp_client, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A driver's pause that raised an error not hutch's (a bug of its own) failed the reap, which
    was then tried again for ever, the sandbox kept past its timeout. Such a pause is a failed
    pause: the sandbox is ended, its reason naming the error."""
    api = await make_api()
    engine = api.client.server.app[ENGINE]

    async def broken(sandbox_id: str, *, memory: bool = True) -> None:
        raise RuntimeError("the driver's own bug")

    monkeypatch.setattr(engine.parts.driver, "pause", broken)
    e2b = await aiohttp_client(create_e2b_app(engine, api.client.server.app[TENANTS]))
    sid, _ = await autopausing(e2b, timeout=1)
    found = await api.data("GET", f"/sandbox/status/{sid}?waitForStatus=terminated&waitMs=8000")
    assert found["status"] == "terminated", found
    sb = await api.data("GET", f"/sandbox/{sid}")
    assert "RuntimeError: the driver's own bug" in sb["reason"], sb


@pytest.mark.runs_on("fake-embedded")
async def test_a_fallback_pause_failing_in_its_own_words_ends_the_sandbox(
        make_api: AppFactory, aiohttp_client, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The filesystem-only pause the reaper falls back on raised an error not hutch's: the reap
    failed, and was retried for ever (its timeout passed, the sandbox running on). It is ended,
    its reason naming both failures."""
    api = await make_api()
    engine = api.client.server.app[ENGINE]
    e2b = await aiohttp_client(create_e2b_app(engine, api.client.server.app[TENANTS]))
    sid, _ = await autopausing(e2b, timeout=2)
    await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sleep", "3600"]})
    pause = engine.control.pause

    async def fallback_broken(sandbox_id: str, **kwargs: Any) -> Any:
        if kwargs.get("memory") is False:
            raise RuntimeError("the fallback's own bug")
        return await pause(sandbox_id, **kwargs)

    monkeypatch.setattr(engine.control, "pause", fallback_broken)
    found = await api.data("GET", f"/sandbox/status/{sid}?waitForStatus=terminated&waitMs=8000")
    assert found["status"] == "terminated", found
    reason = (await api.data("GET", f"/sandbox/{sid}"))["reason"]
    assert "has commands running" in reason and \
        "pausing it filesystem-only failed: RuntimeError: the fallback's own bug" in reason, reason


@pytest.mark.runs_on("fake-embedded")
async def test_a_timeout_call_without_its_timeout_is_a_400_naming_it(make_api: AppFactory, aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    """E2B's set_timeout body requires ``timeout``; one without it set the default (300 s)
    in silence, cutting a sandbox given an hour down to five minutes. Now a 400 naming it."""
    api = await make_api()
    e2b = await aiohttp_client(create_e2b_app(api.client.server.app[ENGINE], api.client.server.app[TENANTS]))
    sid, wire = await autopausing(e2b, timeout=3600)
    got = await e2b.post(f"/sandboxes/{wire}/timeout", headers={"X-API-Key": KEY}, json={})
    assert got.status == 400, await got.text()
    assert "timeout: required" in (await got.json())["message"]
    assert (await api.data("GET", f"/sandbox/{sid}"))["timeout"]["idle"] == "3600s"
