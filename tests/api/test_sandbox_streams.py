"""A sandbox's own output streams (service/sandbox_streams.py): what ``@agentuity/runtime``'s
``ctx.sandbox`` reads as an interactive sandbox's stdout and stderr."""

from __future__ import annotations

import asyncio

import pytest

from tests.api.conftest import REAL, STORE, WIRE, Api


def _path(url: str) -> str:
    return "/" + url.split("://", 1)[1].split("/", 1)[1]


async def _run(api: Api, sid: str, script: str) -> None:
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", script]})
    assert (await api.wait_execution(ex["executionId"]))["status"] == "completed"


@pytest.mark.runs_on(*STORE, *REAL)  # real output, live, in both output stores
async def test_a_sandbox_stream_carries_every_execution_and_ends_with_the_sandbox(api: Api) -> None:
    created = await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201)
    sid = created["sandboxId"]
    assert "executionId" not in created  # no command: the streams are the sandbox's own
    out_url, err_url = created["stdoutStreamUrl"], created["stderrStreamUrl"]
    assert created["stdoutStreamId"] != created["stderrStreamId"]
    assert out_url.endswith("/streams/" + created["stdoutStreamId"])
    info = await api.data("GET", f"/sandbox/{sid}")  # connect() reads these
    assert (info["stdoutStreamUrl"], info["stderrStreamUrl"]) == (out_url, err_url)

    # A reader that starts before anything ran follows along, live.
    resp = await api.client.get(_path(out_url))
    assert resp.status == 200
    await _run(api, sid, "echo one; echo e1 >&2")
    assert await asyncio.wait_for(resp.content.readline(), 10) == b"one\n"
    await _run(api, sid, "true")  # no output at all
    await _run(api, sid, "echo two; echo e2 >&2")
    assert await asyncio.wait_for(resp.content.readline(), 10) == b"two\n"
    assert not resp.content.at_eof()  # the sandbox lives: more may come

    await api.call("DELETE", f"/sandbox/{sid}")
    assert await asyncio.wait_for(resp.content.read(), 10) == b""  # ends with the sandbox
    # Afterwards the same bytes, at once, in the order the commands ran.
    assert await api.stream(out_url) == b"one\ntwo\n"
    assert await api.stream(err_url) == b"e1\ne2\n"


@pytest.mark.runs_on(*STORE)  # the service's queue, both output stores
async def test_commands_queued_behind_a_running_one_keep_their_order(api: Api) -> None:
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    url = (await api.data("GET", f"/sandbox/{sid}"))["stdoutStreamUrl"]
    first = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", "sleep 0.5; echo a"]})
    second = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["sh", "-c", "echo b"]})
    for ex in (first, second):
        await api.wait_execution(ex["executionId"])
    await api.call("DELETE", f"/sandbox/{sid}")
    assert await asyncio.wait_for(api.stream(url), 10) == b"a\nb\n"


@pytest.mark.runs_on(*WIRE)  # the stream id's MAC
async def test_a_forged_sandbox_stream_id_is_404(api: Api) -> None:
    created = await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201)
    real = created["stdoutStreamId"]
    forged = real[:-1] + ("0" if real[-1] != "0" else "1")
    assert (await api.client.get(f"/streams/{forged}")).status == 404
    await api.call("DELETE", f"/sandbox/{created['sandboxId']}")
