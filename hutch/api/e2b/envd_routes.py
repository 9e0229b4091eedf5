"""envd's process service (e2b-dev/E2B spec/envd/process/process.proto) over Connect: Start
(a command's start, output and end as a server stream), Connect (to one still running), List
and SendSignal; and envd's ``GET /health``. A command is a hutch execution of the sandbox the
request's token opens (api/e2b/server.py), so it is recorded, limited and metered as any.

What envd's ProcessConfig asks (environment, working directory) is given to the command by
wrapping it: ``env NAME=VALUE … sh -c 'cd -- "$0" && exec "$@"' DIR CMD ARGS…``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from aiohttp import web

from hutch.api.e2b import codec, connect
from hutch.api.e2b import process_messages as msg
from hutch.api.e2b.access import SANDBOX_KEY, envd, still_valid
from hutch.api.e2b.processes import MAX_TAG, Process, Processes, kept_bytes
from hutch.api.e2b.terminals import PtyProcess
from hutch.api.keys import ENGINE
from hutch.core.errors import HutchError, InvalidInput, SandboxNotFound
from hutch.core.models import ExecutionState, ExecutionStatus, SandboxStatus
from hutch.service.engine import Engine
from hutch.service.output import RAW_OUTPUT, StreamOptions
from hutch.service.requests import ExecuteRequest
from hutch.service.terminals import check_size

log = logging.getLogger("hutch.api.e2b")
routes = web.RouteTableDef()
PROCESSES: web.AppKey[Processes] = web.AppKey("e2b_processes", Processes)
KEEPALIVE_DEFAULT = 50.0  # seconds between keep-alive events on a quiet stream
_SIGKILL, _SIGTERM = 9, 15
_CWD_SCRIPT = 'cd -- "$0" && exec "$@"'
STDIN_CHUNKS = 16  # pieces of SendInput queued for a command that has not read them yet
STDIN_PIECE = 2**16
# how long a SendInput waits for room before it is refused
STDIN_WAIT_SECONDS = connect.seconds_setting("HUTCH_E2B_STDIN_WAIT_SECONDS", 30.0)
STDIN_POLL_SECONDS = 5.0  # how often a stdin nobody closed looks whether its command ended


@routes.get("/health")
@envd
async def health(request: web.Request) -> web.Response:
    """envd's probe: the SDK asks it after a broken stream (and for ``is_running``) to tell a
    sandbox gone from a connection lost. A sandbox that ended or is paused answers as E2B's
    proxy does for one it cannot reach: 502, "… was not found"."""
    sandbox_id = request[SANDBOX_KEY]
    sb = await request.app[ENGINE].reads.require(sandbox_id)
    if sb.status not in (SandboxStatus.IDLE, SandboxStatus.RUNNING, SandboxStatus.CREATING):
        return web.json_response({"code": 502, "message": f"The sandbox {sandbox_id} was not found"}, status=502)
    return web.Response(status=204)


# ------------------------------------------------------------------ messages


def _selector(msg: dict[str, Any]) -> tuple[int | None, str | None]:
    selector = msg.get("process")
    if not selector or (selector.get("pid") is None and selector.get("tag") is None):
        raise InvalidInput("process: which process (its pid or its tag) is required", field="process")
    return selector.get("pid"), selector.get("tag")


def _info(proc: Process) -> dict[str, Any]:
    config = {"cmd": proc.cmd, "args": list(proc.args), "envs": proc.envs, "cwd": proc.cwd}
    return {"config": config, "pid": proc.pid, "tag": proc.tag}


def _ending(ex: ExecutionState) -> dict[str, Any]:
    """envd's EndEvent for how the command ended: a signal's end has exit code -1, as Go says."""
    if ex.status is ExecutionStatus.COMPLETED and ex.exit_code is not None:
        return {"exit_code": ex.exit_code, "exited": True, "status": f"exit status {ex.exit_code}"}
    if ex.status is ExecutionStatus.CANCELLED:
        return {"exit_code": -1, "exited": False, "status": "signal: killed"}
    return {"exit_code": ex.exit_code if ex.exit_code is not None else -1, "exited": False,
            "status": "signal: killed" if ex.exit_code else "failed", "error": ex.error or ex.status.value}


class _Events:
    """Writes ProcessEvents to an open stream in the call's encoding, while the key lives."""

    def __init__(self, request: web.Request, response: web.StreamResponse, is_json: bool) -> None:
        self.request, self.response, self.is_json = request, response, is_json

    async def send(self, **event: Any) -> None:
        still_valid(self.request)  # Unauthorized ends the stream: nothing more told to a revoked key
        await self.response.write(connect.envelope(codec.encode(msg.EVENT_RESPONSE, {"event": event}, self.is_json)))


# ------------------------------------------------------------------ the command line


def _argv(cmd: str, args: list[str], envs: dict[str, str], cwd: str | None) -> tuple[str, ...]:
    if not cmd:
        raise InvalidInput("process.cmd: required", field="process.cmd")
    argv: tuple[str, ...] = (cmd, *args)
    if cwd:
        argv = ("/bin/sh", "-c", _CWD_SCRIPT, cwd, *argv)
    if envs:
        for name in envs:
            if not name or "=" in name or "\0" in name:
                raise InvalidInput(f"process.envs: {name!r} is not an environment variable name",
                                   field="process.envs")
        argv = ("/usr/bin/env", *(f"{k}={v}" for k, v in envs.items()), *argv)
    return argv


# ------------------------------------------------------------------ streaming a command


async def _output(request: web.Request, execution_id: str) -> AsyncIterator[tuple[str, bytes]]:
    """stdout and stderr as they arrive, interleaved, until both close."""
    engine = request.app[ENGINE]
    queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(maxsize=64)

    async def pump(name: str) -> None:
        async for chunk in engine.output.read(engine.streams.derive(execution_id, name)):
            await queue.put((name, chunk))

    async def both() -> None:
        try:
            await asyncio.gather(pump("stdout"), pump("stderr"))
        finally:
            await queue.put(None)

    task = asyncio.create_task(both())
    try:
        while (item := await queue.get()) is not None:
            yield item
        await task  # a reader's error is the stream's
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def _keepalive_interval(request: web.Request) -> float:
    with contextlib.suppress(ValueError):
        return max(1.0, float(request.headers.get("Keepalive-Ping-Interval", KEEPALIVE_DEFAULT)))
    return KEEPALIVE_DEFAULT


async def _follow_pty(request: web.Request, events: _Events, pty: PtyProcess) -> None:
    """What the terminal writes from now on, then its end."""
    interval = _keepalive_interval(request)
    queue = pty.follow()
    try:
        while True:
            try:
                async with asyncio.timeout(interval):
                    item = await queue.get()
            except TimeoutError:
                await events.send(keepalive={})
                continue
            if item is None:
                await connect.end_stream(events.response, connect.RpcError(
                    "resource_exhausted", "this stream fell too far behind the terminal's output"))
                return
            kind, value = item
            if kind == "end":
                code = int(value)
                await events.send(end={"exit_code": code, "exited": code >= 0, "status": f"exit status {code}"})
                await connect.end_stream(events.response)
                return
            await events.send(data={"pty": value})
    finally:
        pty.leave(queue)


async def _follow(request: web.Request, events: _Events, proc: Process) -> None:
    """Output, keep-alives on a quiet stream, then how it ended; the stream ends after."""
    if proc.pty is not None:
        await _follow_pty(request, events, proc.pty)
        return
    assert proc.execution_id is not None
    engine = request.app[ENGINE]
    interval = _keepalive_interval(request)
    chunks = _output(request, proc.execution_id).__aiter__()
    pending: asyncio.Future[tuple[str, bytes]] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(chunks.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                await events.send(keepalive={})
                continue
            got, pending = pending, None
            try:
                stream, data = got.result()
            except StopAsyncIteration:
                break
            await events.send(data={stream: data})
    finally:
        if pending is not None:
            pending.cancel()
        await chunks.aclose()  # type: ignore[attr-defined]
    ex = await engine.reads.get_execution(proc.execution_id, wait=30.0)
    sb = await engine.reads.require(ex.sandbox_id)
    if sb.status.is_final or sb.status is SandboxStatus.STOPPING:  # envd's stream breaks so: the SDK probes /health
        await connect.end_stream(events.response, connect.RpcError(
            "unavailable", f"the command's sandbox {ex.sandbox_id} ended while it ran ({sb.status.value})"))
        return
    if ex.status is ExecutionStatus.TIMEOUT:
        await connect.end_stream(events.response, connect.RpcError("deadline_exceeded", ex.error or "timed out"))
        return
    await events.send(end=_ending(ex))
    await connect.end_stream(events.response)


async def _serve_stream(request: web.Request, call: connect.Call, begin: Awaitable[Process]) -> web.StreamResponse:
    """Open the stream once the command is known; an error before that is a unary-style answer."""
    proc = await begin
    with request.app[PROCESSES].following(proc):
        events = _Events(request, await connect.open_stream(request, call.is_json), call.is_json)
        try:
            await events.send(start={"pid": proc.pid})
            await _follow(request, events, proc)
        except ConnectionResetError:
            return events.response  # the client left: the command goes on, as envd's does
        except Exception as err:
            if not isinstance(err, HutchError):
                log.exception("the stream of process %s failed", proc.pid)
            with contextlib.suppress(ConnectionResetError):
                await connect.end_stream(events.response, err)
        return events.response


async def _call(request: web.Request, schema: codec.Schema) -> tuple[connect.Call, dict[str, Any]]:
    call = await connect.read_request(request)
    return call, codec.decode(schema, call.message, call.is_json)


@routes.post("/process.Process/Start")
@envd
async def start(request: web.Request) -> web.StreamResponse:
    call, req = await _call(request, msg.START_REQUEST)
    if not call.streaming:
        raise InvalidInput("Start is a server stream: send application/connect+json or +proto", field="Content-Type")
    config = req.get("process")
    if config is None:
        raise InvalidInput("process: required", field="process")
    cmd, args, envs, cwd = config.get("cmd", ""), config.get("args", []), config.get("envs", {}), config.get("cwd")
    tag = req.get("tag")
    if tag is not None and len(tag) > MAX_TAG:
        raise InvalidInput(f"tag: at most {MAX_TAG} characters, got {len(tag)}", field="tag")
    deadline = connect.timeout_ms(request)
    sandbox_id = request[SANDBOX_KEY]
    engine = request.app[ENGINE]
    processes = request.app[PROCESSES]
    processes.prune(lambda p: _alive(engine, p))
    room = processes.room(sandbox_id, kept_bytes(cmd, args, envs, cwd, tag))
    if req.get("pty") is not None:
        rows, cols = _size(req["pty"])
        if not cmd:
            raise InvalidInput("process.cmd: required", field="process.cmd")

        async def open_pty() -> Process:
            with room:
                pty = await PtyProcess.open(engine, sandbox_id, (cmd, *args), rows=rows, cols=cols, cwd=cwd, env=envs)
                return processes.add(sandbox_id, None, cmd=cmd, args=tuple(args), envs=envs, cwd=cwd, tag=tag, pty=pty)

        return await _serve_stream(request, call, open_pty())

    async def begin() -> Process:
        with room:
            return await _begin()

    async def _begin() -> Process:
        stdin: asyncio.Queue[bytes | None] | None = None
        options = RAW_OUTPUT
        if req.get("stdin"):
            stdin = asyncio.Queue(maxsize=STDIN_CHUNKS)
            options = StreamOptions(stdin=engine.inputs.create("e2b-stdin"))
        ex, _ = await engine.executions.execute(
            sandbox_id, ExecuteRequest(command=_argv(cmd, args, envs, cwd), files=[], stream=options,
                                       timeout=deadline / 1000 if deadline else 0))
        if stdin is not None:
            assert options.stdin is not None
            engine.background.spawn(engine.inputs.upload(options.stdin, _stdin_chunks(engine, ex.execution_id, stdin)),
                                    f"e2b-stdin-{ex.execution_id}")
        return processes.add(sandbox_id, ex.execution_id, cmd=cmd, args=tuple(args), envs=envs, cwd=cwd, tag=tag,
                             stdin=stdin)

    return await _serve_stream(request, call, begin())


async def _stdin_chunks(engine: Engine, execution_id: str,
                        queue: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
    """What SendInput sends, as the upload of the command's stdin stream; it ends at
    CloseStdin, or once the command has ended (nobody closed it)."""
    while True:
        try:
            async with asyncio.timeout(STDIN_POLL_SECONDS):
                chunk = await queue.get()
        except TimeoutError:
            if engine.executions.running(execution_id):
                continue
            return
        if chunk is None:
            return
        yield chunk


def _size(pty: dict[str, Any]) -> tuple[int, int]:
    size = pty.get("size") or {}
    rows, cols = size.get("rows") or 24, size.get("cols") or 80
    check_size(rows, cols)
    return rows, cols


def _alive(engine: Engine, proc: Process) -> bool:
    if proc.pty is not None:
        return proc.pty.running
    return proc.execution_id is not None and engine.executions.running(proc.execution_id)


async def _running(request: web.Request, req: dict[str, Any]) -> Process:
    pid, tag = _selector(req)
    sandbox_id = request[SANDBOX_KEY]
    proc = request.app[PROCESSES].find(sandbox_id, pid=pid, tag=tag)
    if proc is None or not _alive(request.app[ENGINE], proc):
        name = f"pid {pid}" if pid is not None else f"tag {tag!r}"
        raise connect.RpcError("not_found", f"process with {name} not found in sandbox {sandbox_id}")
    return proc


@routes.post("/process.Process/Connect")
@envd
async def connect_process(request: web.Request) -> web.StreamResponse:
    call, req = await _call(request, msg.CONNECT_REQUEST)
    if not call.streaming:
        raise InvalidInput("Connect is a server stream: send application/connect+json or +proto", field="Content-Type")
    return await _serve_stream(request, call, _running(request, req))


@routes.post("/process.Process/List")
@envd
async def list_processes(request: web.Request) -> web.Response:
    call, _ = await _call(request, msg.EMPTY)
    engine, sandbox_id = request.app[ENGINE], request[SANDBOX_KEY]
    if (await engine.reads.require(sandbox_id)).status.is_final:  # an ended sandbox is gone, as on every route
        raise SandboxNotFound(f"sandbox {sandbox_id} not found", sandbox_id=sandbox_id)
    procs = [p for p in request.app[PROCESSES].of(sandbox_id) if _alive(engine, p)]
    return connect.unary(codec.encode(msg.LIST_RESPONSE, {"processes": [_info(p) for p in procs]}, call.is_json),
                         call.is_json)


@routes.post("/process.Process/SendSignal")
@envd
async def send_signal(request: web.Request) -> web.Response:
    """SIGKILL and SIGTERM both end the command's whole process tree (hutch's cancel)."""
    call, req = await _call(request, msg.SEND_SIGNAL_REQUEST)
    signal = req.get("signal")
    if signal not in (_SIGKILL, _SIGTERM):
        raise InvalidInput(f"signal: expected SIGNAL_SIGKILL or SIGNAL_SIGTERM, got {signal!r}", field="signal")
    proc = await _running(request, req)
    if proc.pty is not None:
        await proc.pty.kill()
    else:
        assert proc.execution_id is not None
        await request.app[ENGINE].executions.cancel(proc.execution_id, why=f"killed over the E2B wire (signal {signal})")
    return connect.unary(codec.encode(msg.EMPTY, {}, call.is_json), call.is_json)


def _open_stdin(proc: Process) -> asyncio.Queue[bytes | None]:
    if proc.stdin is None:
        raise connect.RpcError("failed_precondition", f"process {proc.pid} was started without stdin; "
                               "start it with stdin=True to send it input")
    return proc.stdin


@routes.post("/process.Process/SendInput")
@envd
async def send_input(request: web.Request) -> web.Response:
    call, req = await _call(request, msg.SEND_INPUT_REQUEST)
    given = req.get("input") or {}
    proc = await _running(request, req)
    if given.get("pty") is not None:
        if proc.pty is None:
            raise connect.RpcError("failed_precondition", f"process {proc.pid} has no terminal; send stdin")
        try:  # a terminal whose program reads no input fills its line buffer: the write would wait for ever
            async with asyncio.timeout(STDIN_WAIT_SECONDS):
                await proc.pty.terminal.write(given["pty"])
        except TimeoutError:
            raise connect.RpcError("resource_exhausted", f"process {proc.pid}'s terminal has not read its input "
                                   f"for {STDIN_WAIT_SECONDS:g} s; send it again once it reads") from None
        return connect.unary(codec.encode(msg.EMPTY, {}, call.is_json), call.is_json)
    data = given.get("stdin", b"")
    taken = 0
    try:  # a command not reading its stdin holds the sender back, for a while
        async with asyncio.timeout(STDIN_WAIT_SECONDS):
            # In pieces: the queue's bound is then in bytes (STDIN_CHUNKS x STDIN_PIECE), not in
            # messages of up to 4 MiB each (16 of those held 64 MiB per command).
            for taken in range(0, len(data), STDIN_PIECE):
                await _open_stdin(proc).put(data[taken:taken + STDIN_PIECE])
    except TimeoutError:
        raise connect.RpcError("resource_exhausted", f"process {proc.pid} has not read its stdin for "
                               f"{STDIN_WAIT_SECONDS:g} s; {taken} of the {len(data)} bytes sent were taken, "
                               "nothing more is until it reads") from None
    return connect.unary(codec.encode(msg.EMPTY, {}, call.is_json), call.is_json)


@routes.post("/process.Process/CloseStdin")
@envd
async def close_stdin(request: web.Request) -> web.Response:
    call, req = await _call(request, msg.CLOSE_STDIN_REQUEST)
    proc = await _running(request, req)
    await _open_stdin(proc).put(None)
    return connect.unary(codec.encode(msg.EMPTY, {}, call.is_json), call.is_json)


@routes.post("/process.Process/Update")
@envd
async def update(request: web.Request) -> web.Response:
    """A terminal's new size."""
    call, req = await _call(request, msg.UPDATE_REQUEST)
    proc = await _running(request, req)
    if req.get("pty") is not None:
        if proc.pty is None:
            raise connect.RpcError("failed_precondition", f"process {proc.pid} has no terminal to resize")
        rows, cols = _size(req["pty"])
        await proc.pty.terminal.resize(rows, cols)
    return connect.unary(codec.encode(msg.EMPTY, {}, call.is_json), call.is_json)


@routes.route("*", "/process.Process/{method}")
@envd
async def other(request: web.Request) -> web.Response:
    method = request.match_info["method"]
    raise connect.RpcError("unimplemented", f"process.Process/{method} is not supported by hutch yet (docs/e2b.md)")

