"""The async client against the in-test fake of the wire: requests sent, results parsed,
errors mapped, output streamed, long-polls looped."""

from __future__ import annotations

import asyncio
import base64
import io

import pytest

from hutch import (
    FileToWrite,
    Network,
    Resources,
    SandboxClient,
    Timeouts,
)
from hutch import errors as e
from tests.sdk.fakewire import FakeWire, Script, Step

# ------------------------------------------------------------------ run


async def test_run_sends_a_oneshot_create_and_returns_exit_code_and_output(
    client: SandboxClient, wire: FakeWire
) -> None:
    wire.script = lambda argv: Script(
        [
            Step("stdout", b"hello "),
            Step("stderr", b"careful\n", 0.01),
            Step("stdout", b"world\n", 0.01),
        ],
        exit_code=3,
    )
    result = await client.run(
        ["python3", "main.py"],
        runtime="python:3.13",
        files={"main.py": "print(1)", "data.bin": b"\x00\x01"},
        env={"A": "1"},
        timeout="30s",
        resources={"memory": "256Mi", "cpu": "500m"},
        network=True,
    )
    assert result.exit_code == 3
    assert result.stdout == "hello world\n"
    assert result.stderr == "careful\n"
    assert result.sandbox_id.startswith("sbx_")
    assert result.execution_id is not None
    assert result.status == "completed"
    assert result.duration_ms >= 0

    [create] = wire.calls("POST", "/sandbox")
    body = create["json"]
    assert body["command"]["exec"] == ["python3", "main.py"]
    assert body["command"]["mode"] == "oneshot"
    files = {f["path"]: base64.b64decode(f["content"]) for f in body["command"]["files"]}
    assert files == {"main.py": b"print(1)", "data.bin": b"\x00\x01"}
    assert body["runtime"] == "python:3.13"
    assert body["env"] == {"A": "1"}
    assert body["timeout"] == {"execution": "30s"}
    assert body["resources"] == {"memory": "256Mi", "cpu": "500m"}
    assert body["network"] == {"enabled": True}
    assert create["headers"]["Authorization"] == "Bearer k"
    # Success does not DELETE: a one-shot sandbox ends itself.
    assert not wire.calls("DELETE", "/sandbox")


async def test_run_forwards_output_to_sinks_as_it_streams(
    client: SandboxClient, wire: FakeWire
) -> None:
    first_seen = asyncio.Event()  # "b" is produced only once the client has "a"
    wire.script = lambda argv: Script(
        [Step("stdout", b"a"), Step("stdout", b"b", after=first_seen.wait), Step("stderr", "é".encode())]
    )
    seen: list[bytes] = []

    async def on_stdout(chunk: bytes) -> None:
        seen.append(chunk)
        first_seen.set()

    text = io.StringIO()
    result = await client.run(["x"], stdout=on_stdout, stderr=text)
    assert b"".join(seen) == b"ab"
    assert len(seen) == 2  # chunks arrive as they are produced, not at the end
    assert text.getvalue() == "é"
    assert result.stdout == "ab"


async def test_run_writes_to_binary_sinks(client: SandboxClient, wire: FakeWire) -> None:
    sink = io.BytesIO()
    await client.run(["echo", "hi"], stdout=sink)
    assert sink.getvalue() == b"hi\n"


async def test_run_long_polls_again_while_the_execution_is_still_running(
    client: SandboxClient, wire: FakeWire
) -> None:
    client.long_poll = "50ms"
    wire.script = lambda argv: Script([Step("stdout", b"done\n", 0.3)], exit_code=0)
    result = await client.run(["slow"])
    assert result.stdout == "done\n"
    polls = wire.calls("GET", "/sandbox/execution/")
    assert len(polls) >= 3
    assert all(p["query"]["wait"] == "50ms" for p in polls)


async def test_wait_does_not_spin_when_the_server_ignores_wait(
    client: SandboxClient, wire: FakeWire
) -> None:
    wire.ignore_wait = True
    wire.script = lambda argv: Script([], delay=0.4)
    await client.run(["slow"])
    assert len(wire.calls("GET", "/sandbox/execution/")) < 15


async def test_run_takes_exit_code_from_sandbox_status_when_execution_lacks_it(
    client: SandboxClient, wire: FakeWire
) -> None:
    wire.omit_exit_code = True
    wire.script = lambda argv: Script([], exit_code=7)
    result = await client.run(["x"])
    assert result.exit_code == 7
    status_calls = wire.calls("GET", "/sandbox/status/")
    assert status_calls
    assert status_calls[-1]["query"]["waitForStatus"] == "terminated,failed"


async def test_run_without_execution_id_waits_for_streams_then_status(
    client: SandboxClient, wire: FakeWire
) -> None:
    wire.omit_execution_id = True
    wire.script = lambda argv: Script([Step("stdout", b"x")], exit_code=4)
    result = await client.run(["x"])
    assert (result.stdout, result.exit_code, result.execution_id) == ("x", 4, None)


async def test_cancelled_run_destroys_its_sandbox(client: SandboxClient, wire: FakeWire) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await client.run(["sleep", "30"])
    [delete] = wire.calls("DELETE", "/sandbox/")
    assert delete["path"].startswith("/sandbox/sbx_")


async def test_run_refuses_a_string_command(client: SandboxClient) -> None:
    with pytest.raises(e.InvalidInput, match="command"):
        await client.run("echo hi")  # type: ignore[arg-type]


async def test_snapshot_and_runtime_together_are_refused_client_side(client: SandboxClient) -> None:
    with pytest.raises(e.InvalidInput) as info:
        await client.create(snapshot="snp_1", runtime="bun:1")
    assert info.value.field == "snapshot"


# ------------------------------------------------------------------ interactive


async def test_create_execute_and_destroy(client: SandboxClient, wire: FakeWire) -> None:
    sandbox = await client.create(
        runtime="base:latest",
        name="dev",
        resources=Resources(memory="1Gi", cpu="1000m"),
        network=Network(enabled=True, port=3000),
        timeout=Timeouts(idle="10m", execution="2m"),
        files=[FileToWrite("a.txt", "A")],
        metadata={"team": "x"},
    )
    body = wire.calls("POST", "/sandbox")[0]["json"]
    assert body["resources"] == {"memory": "1Gi", "cpu": "1000m"}
    assert body["network"] == {"enabled": True, "port": 3000}
    assert body["timeout"] == {"idle": "10m", "execution": "2m"}
    assert body["files"] == [{"path": "a.txt", "content": base64.b64encode(b"A").decode()}]
    assert "command" not in body
    assert sandbox.status == "idle"

    execution = await sandbox.execute(["echo", "hi", "there"], timeout=5)
    assert execution.status == "completed"
    assert execution.exit_code == 0
    assert execution.stdout == "hi there\n"
    assert execution.stderr == ""
    assert execution.auto_resumed is False
    assert execution.stdout_stream_url
    assert execution.stdout_stream_url.startswith("http")
    sent = wire.calls("POST", f"/sandbox/{sandbox.id}/execute")[0]["json"]
    assert sent == {"command": ["echo", "hi", "there"], "timeout": "5s"}

    failing = await sandbox.execute(["fail", "2"], capture=False)
    assert (failing.exit_code, failing.stdout, failing.stderr) == (2, None, None)

    info = await sandbox.get()
    assert info.executions == 2
    assert info.status == "idle"
    await sandbox.destroy()
    assert wire.sandboxes[sandbox.id]["status"] == "terminated"


async def test_execute_streams_to_callbacks(client: SandboxClient, wire: FakeWire) -> None:
    sandbox = await client.create()
    out: list[bytes] = []
    err: list[bytes] = []
    execution = await sandbox.execute(["fail"], stdout=out.append, stderr=err.append, capture=False)
    assert (out, err, execution.exit_code) == ([], [b"boom\n"], 1)


async def test_start_iterates_interleaved_output_then_waits(
    client: SandboxClient, wire: FakeWire
) -> None:
    wire.script = lambda argv: Script(
        [Step("stdout", b"1"), Step("stderr", b"2", 0.02), Step("stdout", b"3", 0.02)], exit_code=5
    )
    sandbox = await client.create()
    handle = await sandbox.start(["x"])
    chunks = [(c.stream, c.data) async for c in handle.output()]
    assert chunks == [("stdout", b"1"), ("stderr", b"2"), ("stdout", b"3")]
    final = await handle.wait()
    assert (final.execution_id, final.exit_code) == (handle.execution_id, 5)


async def test_sandbox_context_manager_destroys(client: SandboxClient, wire: FakeWire) -> None:
    async with await client.create() as sandbox:
        await sandbox.execute(["echo"])
    assert wire.sandboxes[sandbox.id]["status"] == "terminated"


async def test_execute_on_busy_sandbox_raises_sandbox_busy(
    client: SandboxClient, wire: FakeWire
) -> None:
    sandbox = await client.create()
    wire.busy = True
    with pytest.raises(e.SandboxBusy) as info:
        await sandbox.execute(["echo"])
    assert info.value.status == 409
    assert info.value.code == "SANDBOX_BUSY"
    assert isinstance(info.value, e.Conflict)


async def test_connect_binds_to_existing_sandbox(client: SandboxClient, wire: FakeWire) -> None:
    created = await client.create(name="keep")
    again = await client.connect(created.id)
    assert again.id == created.id
    assert again.info is not None
    assert again.info.name == "keep"
    result = await again.execute(["echo", "ok"])
    assert result.stdout == "ok\n"


async def test_pause_reads_top_level_fields(client: SandboxClient) -> None:
    sandbox = await client.create()
    paused = await sandbox.pause()
    assert (paused.status, paused.terminates_at) == ("suspended", "2025-01-02T00:00:00Z")


# ------------------------------------------------------------------ reads


async def test_get_parses_camel_case_into_snake_case(client: SandboxClient, wire: FakeWire) -> None:
    sandbox = await client.create(runtime="python:3.13", resources={"memory": "512Mi"})
    info = await client.get(sandbox.id)
    assert info.sandbox_id == sandbox.id
    assert info.created_at == "2025-01-01T00:00:00.000Z"
    assert info.runtime is not None
    assert info.runtime.name == "python:3.13"
    assert info.resources is not None
    assert info.resources.memory == "512Mi"
    assert info.org == {"id": "org_local", "name": "local"}


async def test_list_sends_filters_and_paging(client: SandboxClient, wire: FakeWire) -> None:
    for _ in range(3):
        await client.create()
    page = await client.list(status="idle", limit=2, offset=1, project_id="p1", direction="asc")
    assert page.total == 3
    assert len(page.sandboxes) == 2
    query = wire.calls("GET", "/sandbox")[-1]["query"]
    assert query == {
        "status": "idle",
        "limit": "2",
        "offset": "1",
        "projectId": "p1",
        "direction": "asc",
    }
    everything = [s.sandbox_id async for s in client.iter_sandboxes(page_size=2)]
    assert len(everything) == 3


async def test_events_executions_and_runtimes(client: SandboxClient, wire: FakeWire) -> None:
    sandbox = await client.create()
    await sandbox.execute(["echo", "x"])
    await sandbox.destroy()

    events = await client.list_events(sandbox.id, limit=10, direction="desc")
    assert [ev.type for ev in events] == ["destroy", "create"]
    assert events[0].event_id
    assert events[0].sandbox_id == sandbox.id
    assert events[0].event == {}
    assert wire.calls("GET", f"/sandbox/sandboxes/{sandbox.id}/events")[0]["query"] == {
        "limit": "10",
        "direction": "desc",
    }

    [execution] = await client.list_executions(sandbox.id, limit=5)
    assert execution.command == ["echo", "x"]
    assert execution.exit_code == 0
    assert execution.done
    fetched = await client.get_execution(execution.execution_id, wait="1s")
    assert fetched == execution
    assert wire.calls("GET", "/sandbox/execution/")[-1]["query"] == {"wait": "1s"}

    runtimes = await client.list_runtimes(limit=10, sort="name")
    assert runtimes.total == 2
    base = runtimes.runtimes[0]
    assert base.requirements is not None
    assert base.requirements.network_enabled is False


# ------------------------------------------------------------------ errors


async def test_http_errors_carry_message_code_and_status(client: SandboxClient) -> None:
    with pytest.raises(e.SandboxNotFound) as info:
        await client.get("sbx_missing")
    err = info.value
    assert (err.message, err.code, err.status) == ("sandbox not found", "SANDBOX_NOT_FOUND", 404)
    assert isinstance(err, e.NotFound)
    assert isinstance(err, e.SandboxError)

    with pytest.raises(e.ExecutionNotFound):
        await client.get_execution("exe_missing")


async def test_wrong_key_is_unauthorized(client: SandboxClient) -> None:
    client.api_key = "wrong"
    with pytest.raises(e.Unauthorized) as info:
        await client.list()
    assert info.value.status == 401
    assert info.value.message == "invalid API key"


@pytest.mark.parametrize(
    ("status", "body", "expected", "message"),
    [
        (
            200,
            {"success": False, "message": "gone", "code": "SANDBOX_TERMINATED"},
            e.SandboxTerminated,
            "gone",
        ),
        (
            400,
            {
                "success": False,
                "message": "resources.memory: bad",
                "code": "INVALID_INPUT",
                "field": "resources.memory",
            },
            e.InvalidInput,
            "resources.memory: bad",
        ),
        (404, {"error": "plain error text"}, e.NotFound, "plain error text"),
        (
            409,
            {"success": False, "message": "nope", "code": "INVALID_STATE"},
            e.InvalidState,
            "nope",
        ),
        (500, "<html>oops</html>", e.ServerError, "<html>oops</html>"),
        (503, {}, e.ServiceUnavailable, "the server is unavailable"),
        (
            501,
            {"success": False, "message": "no pause here", "code": "NOT_SUPPORTED"},
            e.NotSupported,
            "no pause here",
        ),
    ],
)
async def test_error_mapping(
    client: SandboxClient, wire: FakeWire, status: int, body: object, expected: type, message: str
) -> None:
    wire.fail_next = (status, body)
    with pytest.raises(expected) as info:
        await client.list()
    assert info.value.message == message
    assert info.value.status == status


async def test_field_is_kept_on_invalid_input(client: SandboxClient, wire: FakeWire) -> None:
    wire.fail_next = (
        400,
        {"success": False, "message": "m", "code": "INVALID_INPUT", "field": "timeout.idle"},
    )
    with pytest.raises(e.InvalidInput) as info:
        await client.create()
    assert info.value.field == "timeout.idle"


async def test_unexpected_shape_is_a_server_error_naming_the_model(
    client: SandboxClient, wire: FakeWire
) -> None:
    wire.fail_next = (200, {"success": True, "data": {"status": "idle"}})
    with pytest.raises(e.ServerError, match="SandboxInfo") as info:
        await client.get("sbx_1")
    assert info.value.code == "BAD_RESPONSE"


async def test_unreachable_server_is_connection_failed() -> None:
    async with SandboxClient("http://127.0.0.1:9", api_key="k") as c:
        with pytest.raises(
            e.ConnectionFailed, match=r"cannot reach hutch server at http://127\.0\.0\.1:9"
        ):
            await c.list()


async def test_closed_client_refuses_calls(client: SandboxClient) -> None:
    await client.close()
    with pytest.raises(RuntimeError, match="closed"):
        await client.list()


async def test_text_sinks_decode_utf8_split_across_chunks(
    client: SandboxClient, wire: FakeWire
) -> None:
    encoded = "héllo".encode()
    wire.script = lambda argv: Script(
        [Step("stdout", encoded[:2]), Step("stdout", encoded[2:], 0.02)]
    )
    text = io.StringIO()
    result = await client.run(["x"], stdout=text)
    assert text.getvalue() == "héllo"
    assert result.stdout == "héllo"


async def test_idle_connections_are_let_go_before_a_servers_head_deadline_closes_them() -> None:
    """A hutch server closes a connection that sends no request head for
    HUTCH_REQUEST_HEAD_SECONDS; aiohttp's client keeps one idle for 15 s by default, so a POST
    sent on it as the server closed it would fail (a POST is not retried). The SDK's client and
    a replica's relays to another (the port proxy's session) let theirs go sooner."""
    from hutch.api.routes import proxy
    from hutch.service.config import Config

    deadline = Config.__attrs_attrs__.request_head_seconds.default  # type: ignore[attr-defined]
    async with SandboxClient("http://127.0.0.1:9", "k") as client:
        connector = client.connection._http().connector
        assert connector is not None
        assert connector._keepalive_timeout < deadline
    assert deadline > proxy.IDLE_SECONDS
