"""stdin as Agentuity's stream service carries it: POST /streams, PUT /streams/{id} (a streamed
body), stream.stdin in a create (its initial command) or an execute; 100 MiB through with flat
server memory on the real drivers."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator

import pytest

from tests.api.conftest import AUTH, NODE, REAL, STORE, WIRE, Api


async def new_stdin(api: Api) -> str:
    resp = await api.client.post("/streams", json={"name": "sandbox-stdin-test"}, headers=AUTH)
    body = await resp.json()
    assert resp.status == 201 and body["id"].startswith("stin_"), body  # {id} at the top, as the client reads it
    return body["id"]


async def upload(api: Api, stream_id: str, data: bytes | AsyncIterator[bytes]) -> dict:
    resp = await api.client.put(f"/streams/{stream_id}", data=data, headers=AUTH)
    assert resp.status == 200, await resp.text()
    return (await resp.json())["data"]


@pytest.mark.runs_on(*STORE, *REAL)  # real processes reading it; the streams' records in both stores
async def test_stdin_reaches_an_execution_and_a_oneshot_command(api: Api) -> None:
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    stdin = await new_stdin(api)
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["cat"], "stream": {"stdin": stdin}})
    assert (await upload(api, stdin, b"hello\nworld\n"))["bytes"] == 12
    assert (await api.wait_execution(ex["executionId"]))["status"] == "completed"
    assert await api.stream(ex["stdoutStreamUrl"]) == b"hello\nworld\n"
    # The upload may come first: it waits for its command.
    stdin = await new_stdin(api)
    sending = asyncio.ensure_future(upload(api, stdin, b"early\n"))
    await asyncio.sleep(0.2)
    created = await api.data("POST", "/sandbox", expect=201, json={
        "runtime": "base:latest", "command": {"exec": ["cat"], "mode": "oneshot"}, "stream": {"stdin": stdin}})
    await sending
    assert await api.stream(created["stdoutStreamUrl"]) == b"early\n"
    # "ignore" (what run() sends to skip stdin): the command reads end-of-file at once.
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["cat"], "stream": {"stdin": "ignore"}})
    assert (await api.wait_execution(ex["executionId"]))["status"] == "completed"
    # A stream is one command's: unknown or used ones are refused naming the field.
    bad = await api.call("POST", f"/sandbox/{sid}/execute", json={"command": ["cat"], "stream": {"stdin": stdin}},
                         expect=400)
    assert bad["field"] == "stream.stdin" and "POST /streams" in bad["message"]
    resp = await api.client.put(f"/streams/{stdin}", data=b"x")  # uploading needs the key
    assert resp.status == 401


@pytest.mark.runs_on(*WIRE, *REAL, *NODE)  # a real process that stops reading (node: stdin attached by a second request)
async def test_a_command_that_stops_reading_ends_the_upload(api: Api, driver_name: str) -> None:
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    stdin = await new_stdin(api)
    # Exits with its stdin still streaming in: on nomad that races Nomad's own exec handler
    # (the plugin's exits.go), so its last output and exit are checked too.
    command = ["sh", "-c", "head -c 10; echo; echo end >&2"] if driver_name != "fake" else ["true"]
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": command, "stream": {"stdin": stdin}})

    async def endless() -> AsyncIterator[bytes]:
        for _ in range(10_000):  # 640 MiB if nobody stopped it
            yield b"y" * 65536

    sent = await asyncio.wait_for(upload(api, stdin, endless()), 60)
    assert sent["bytes"] < 64 * 2**20, sent
    done = await api.wait_execution(ex["executionId"])
    assert done["status"] == "completed", (done.get("error"), done)
    if driver_name != "fake":
        assert await api.stream(ex["stdoutStreamUrl"]) == b"y" * 10 + b"\n"
        assert await api.stream(ex["stderrStreamUrl"]) == b"end\n"


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.runs_on(*REAL, *NODE)  # the real drivers stream it; the fake's "cat" is an echo in memory
async def test_100_mib_of_stdin_goes_through_with_flat_memory(api: Api) -> None:
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    stdin = await new_stdin(api)
    ex = await api.data("POST", f"/sandbox/{sid}/execute",
                        json={"command": ["sha256sum"], "stream": {"stdin": stdin}, "timeout": "120s"})
    digest = hashlib.sha256()
    block = os.urandom(65536)
    before = _rss()
    peak = before

    async def data() -> AsyncIterator[bytes]:
        nonlocal peak
        for _ in range(1600):  # 100 MiB
            digest.update(block)
            peak = max(peak, _rss())
            yield block

    assert (await upload(api, stdin, data()))["bytes"] == 100 * 2**20
    done = await api.wait_execution(ex["executionId"])
    assert done["status"] == "completed", (done.get("error"), done)
    assert (await api.stream(ex["stdoutStreamUrl"])).split()[0].decode() == digest.hexdigest()
    assert peak - before < 40 * 2**20, f"memory grew {(peak - before) / 2**20:.0f} MiB for 100 MiB of stdin"
