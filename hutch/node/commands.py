"""Commands: exec answers a framed stream (drivers/node/wire.py); streamed stdin arrives on
a second request (``PUT /v1/executions/{eid}/stdin``); cancel, signal; batch file writes."""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from hutch.core import phases
from hutch.core.driver_types import ExecRequest, ExecResult, FileWrite, Stream
from hutch.core.errors import HutchError
from hutch.core.serde import converter
from hutch.drivers.local.driver import LocalDriver
from hutch.drivers.node import wire
from hutch.node.keys import DRIVER, STREAMED

log = logging.getLogger(__name__)

STDIN_DEPTH = 8  # chunks queued ahead of the command: TCP holds the rest back
GONE_CHECK = 1.0  # seconds between looks at a silent command's connection
FRAMES = "application/x-hutch-frames"


class StdinSlot:
    """Where an exec with ``"stdin": "attach"`` meets the request that streams its stdin
    (either may arrive first)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(STDIN_DEPTH)
        self.done = asyncio.Event()  # the execution ended: nothing more is wanted

    async def chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self.queue.get()) is not None:
            yield chunk

    async def put(self, chunk: bytes | None) -> bool:
        while not self.done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.queue.put(chunk), 1.0)
                return True
        return False


SLOTS = web.AppKey("stdin_slots", dict)


def _slot(app: web.Application, eid: str) -> StdinSlot:
    slots: dict[str, StdinSlot] = app[SLOTS]
    return slots.setdefault(eid, StdinSlot())


class _FrameSink:
    """The OutputSink of one exec: frames queued on the loop, written by the handler."""

    def __init__(self) -> None:
        self.pending: collections.deque[bytes] = collections.deque()
        self.ready = asyncio.Event()

    def write(self, stream: Stream, data: bytes) -> None:
        self.pending.append(wire.frame(wire.STDOUT if stream == "stdout" else wire.STDERR, data))
        self.ready.set()


async def _timed_exec(driver: LocalDriver, req: ExecRequest, sink: _FrameSink) -> ExecResult:
    with phases.span("agent: exec, the local driver's whole"):
        return await driver.exec(req, sink)


async def exec_command(request: web.Request) -> web.StreamResponse:
    driver, sid = request.app[DRIVER], request.match_info["id"]
    body = await request.json()
    eid = str(body["execution_id"])
    stdin_mode = body.get("stdin")
    slot: StdinSlot | None = None
    stdin: bytes | AsyncIterator[bytes] | None = None
    if stdin_mode == "attach":
        slot = _slot(request.app, eid)
        stdin = slot.chunks()
    elif isinstance(stdin_mode, str):
        stdin = base64.b64decode(stdin_mode)
    req = ExecRequest(execution_id=eid, sandbox_id=sid, argv=[str(a) for a in body["argv"]],
                      env={str(k): str(v) for k, v in (body.get("env") or {}).items()},
                      cwd=body.get("cwd"), timeout=body.get("timeout"), stdin=stdin)
    # Headers go with the first frame, not ahead of the command: a silent command's whole
    # answer (headers, result, end) is one write and one wakeup of the API, not three.
    resp: web.StreamResponse | None = None
    sink = _FrameSink()
    task = asyncio.ensure_future(_timed_exec(driver, req, sink))
    broken = False
    try:
        while True:
            if sink.pending and not broken and resp is None:
                resp = web.StreamResponse(headers={"Content-Type": FRAMES})
                try:
                    await resp.prepare(request)
                except ConnectionError:
                    broken = True
                    await driver.cancel(eid)
            while sink.pending and not broken:
                assert resp is not None
                try:
                    await resp.write(sink.pending.popleft())
                except ConnectionError:
                    # The API side is gone: nothing runs unwatched.
                    broken = True
                    await driver.cancel(eid)
            if task.done() and (broken or not sink.pending):  # broken: what is left goes nowhere
                break
            sink.ready.clear()
            waiter = asyncio.ensure_future(sink.ready.wait())
            await asyncio.wait({waiter, task}, timeout=GONE_CHECK, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if not broken and (request.transport is None or request.transport.is_closing()):
                # The API side went away while the command was silent: nothing runs unwatched.
                broken = True
                await driver.cancel(eid)
        try:
            last = wire.json_frame(wire.RESULT, converter.unstructure(task.result()))
        except HutchError as err:
            last = wire.json_frame(wire.ERROR, {**err.to_wire(), "status": err.status or 500})
        if resp is None:
            return web.Response(body=last, headers={"Content-Type": FRAMES})
        if not broken:
            with contextlib.suppress(ConnectionError):
                await resp.write_eof(last)  # the result and the end in one write
    finally:
        if not task.done():  # the handler itself was cancelled
            await driver.cancel(eid)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
        if slot is not None:
            slot.done.set()
            request.app[SLOTS].pop(eid, None)
    assert resp is not None  # answered above when no frame came first
    return resp


async def attach_stdin(request: web.Request) -> web.Response:
    eid = request.match_info["eid"]
    slot = _slot(request.app, eid)
    try:
        async for chunk in request.content.iter_chunked(64 << 10):
            if not await slot.put(chunk):
                break
        await slot.put(None)
    finally:
        if slot.done.is_set():
            request.app[SLOTS].pop(eid, None)
    return web.json_response({"ok": True})


async def cancel(request: web.Request) -> web.Response:
    await request.app[DRIVER].cancel(request.match_info["eid"])
    return web.json_response({"ok": True})


async def signal(request: web.Request) -> web.Response:
    body = await request.json()
    await request.app[DRIVER].signal(request.match_info["eid"], int(body["signum"]))
    return web.json_response({"ok": True})


async def write_files(request: web.Request) -> web.Response:
    body = await request.json()
    files = [FileWrite(path=str(f["path"]), content=base64.b64decode(f["content"]), mode=int(f.get("mode", 0o644)))
             for f in body["files"]]
    await request.app[DRIVER].write_files(request.match_info["id"], files)
    return web.json_response({"ok": True})


def add_routes(app: web.Application) -> None:
    app[SLOTS] = {}
    r = app.router
    r.add_post("/v1/sandboxes/{id}/exec", exec_command)
    r.add_put("/v1/executions/{eid}/stdin", attach_stdin, name=STREAMED + "stdin")
    r.add_post("/v1/executions/{eid}/cancel", cancel)
    r.add_post("/v1/executions/{eid}/signal", signal)
    r.add_post("/v1/sandboxes/{id}/files", write_files)
