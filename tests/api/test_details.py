"""Details the seeds name: checkpoints by name, ``stream.timestamps`` and ``"ignore"``, fields
hutch cannot honour refused by name (never silently ignored), and the resource usage a
sandbox's get shows."""

from __future__ import annotations

import re

import pytest

from tests.api.conftest import NODE, REAL, STORE, WIRE, Api


async def new_sandbox(api: Api) -> str:
    return (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]


async def run(api: Api, sid: str, command: list[str], **extra: object) -> tuple[dict, bytes, bytes]:
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": command, **extra})
    done = await api.wait_execution(ex["executionId"])
    return done, await api.stream(ex["stdoutStreamUrl"]), await api.stream(ex["stderrStreamUrl"])


@pytest.mark.runs_on(*STORE)  # names resolved over the store (real restores: test_files.py)
async def test_checkpoints_restore_and_delete_by_name(api: Api) -> None:
    sid = await new_sandbox(api)
    await api.data("POST", f"/fs/{sid}", json={"files": [{"path": "f.txt", "content": "YmVmb3Jl"}]})  # "before"
    await api.data("POST", f"/sandbox/{sid}/checkpoint", json={"name": "my-checkpoint"}, expect=201)
    await api.data("POST", f"/fs/{sid}", json={"files": [{"path": "f.txt", "content": "YWZ0ZXI="}]})  # "after"
    await api.call("POST", f"/sandbox/{sid}/checkpoint/my-checkpoint/restore")
    assert (await run(api, sid, ["cat", "f.txt"]))[1] == b"before"
    await api.call("DELETE", f"/sandbox/{sid}/checkpoint/my-checkpoint")
    assert (await api.data("GET", f"/sandbox/checkpoints/{sid}"))["checkpoints"] == []
    gone = await api.call("POST", f"/sandbox/{sid}/checkpoint/my-checkpoint/restore", expect=404)
    assert "no checkpoint has that id or name" in gone["message"]


@pytest.mark.runs_on(*WIRE, *REAL)  # lines as real processes write them
async def test_stream_timestamps_prefix_each_line_and_ignore_discards(api: Api) -> None:
    sid = await new_sandbox(api)
    done, out, err = await run(api, sid, ["sh", "-c", "echo one; echo two; echo oops >&2"],
                               stream={"timestamps": True, "stderr": "ignore"})
    assert done["status"] == "completed"
    lines = out.decode().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["one", "two"], out
    for line in lines:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z .*", line), line
    assert err == b""
    # Without them, bytes as written.
    assert (await run(api, sid, ["echo", "plain"], stream={"timestamps": False}))[1] == b"plain\n"


@pytest.mark.runs_on(*WIRE)  # refused while parsing
async def test_fields_hutch_cannot_honour_are_refused_by_name(api: Api) -> None:
    sid = await new_sandbox(api)
    # stdout to a stream is Agentuity's, not hutch's: refused by name, never ignored.
    refused = await api.call("POST", f"/sandbox/{sid}/execute",
                             json={"command": ["true"], "stream": {"stdout": "str_abc"}}, expect=501)
    assert refused["message"].startswith("stream.stdout") and refused["field"] == "stream.stdout", refused
    # stdin from a stream hutch never made: a 400 that names the field (tests/api/test_stdin.py has the rest).
    unknown = await api.call("POST", f"/sandbox/{sid}/execute",
                             json={"command": ["true"], "stream": {"stdin": "str_abc"}}, expect=400)
    assert unknown["field"] == "stream.stdin" and "str_abc" in unknown["message"], unknown
    refused = await api.call("POST", "/sandbox", json={"runtime": "base:latest", "scopes": ["services:read"]},
                             expect=501)
    assert refused["field"] == "scopes"
    bad = await api.call("POST", f"/sandbox/{sid}/execute", json={"command": ["true"], "stream": {"timestamps": "yes"}},
                         expect=400)
    assert bad["field"] == "stream.timestamps"
    # stdin "ignore" is what run() sends when asked to skip stdin: accepted.
    await api.data("POST", f"/sandbox/{sid}/execute", json={"command": ["true"], "stream": {"stdin": "ignore"}})


@pytest.mark.runs_on(*WIRE, *REAL, *NODE)  # the real drivers' accounting (the node driver's end: one call); the fake has none
async def test_get_shows_what_a_sandbox_used(api: Api, driver_name: str) -> None:
    sid = await new_sandbox(api)
    await run(api, sid, ["sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"])
    live = await api.data("GET", f"/sandbox/{sid}")
    await api.call("DELETE", f"/sandbox/{sid}")
    ended = await api.data("GET", f"/sandbox/{sid}?includeDeleted=true")
    if driver_name == "fake":  # the fake driver runs no processes to account for
        assert "cpuTimeMs" not in live
        return
    assert live.get("cpuTimeMs", 0) > 0 and live.get("memoryPeakBytes", 0) > 0, live
    assert ended.get("cpuTimeMs", -1) >= live["cpuTimeMs"] and ended.get("memoryByteSec", 0) > 0, ended
