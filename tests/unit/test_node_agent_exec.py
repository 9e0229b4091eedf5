"""The agent's exec answer: a silent command's headers, result and end travel together (one
write, one wakeup of the API); output is framed as it comes, and an API side that goes away
while the command still prints cancels it and ends the handler."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from hutch.core.driver_types import ExecRequest, ExecResult, OutputSink
from hutch.drivers.node import wire
from hutch.node.app import make_app
from hutch.node.config import NodeSettings

SECRET = b"s" * 32


class _Driver:
    def __init__(self, chatty: bool) -> None:
        self.chatty = chatty
        self.cancelled = asyncio.Event()

    def set_listener(self, listener: Any) -> None:
        pass

    async def exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult:
        if not self.chatty:
            return ExecResult(exit_code=3)
        while not self.cancelled.is_set():
            sink.write("stdout", b"y\n" * 4096)
            await asyncio.sleep(0.005)
        sink.write("stdout", b"after the cancel\n")  # output still comes while it is killed
        return ExecResult(exit_code=137, cancelled=True)

    async def cancel(self, execution_id: str) -> None:
        self.cancelled.set()


def _app(tmp_path: Path, driver: _Driver, handled: asyncio.Event) -> web.Application:
    settings = NodeSettings(name="t1", host="127.0.0.1", port=0, data_dir=tmp_path, runtime_cache=tmp_path, secret=SECRET)
    app = make_app(settings, driver, "0" * 64, own_driver=False)  # type: ignore[arg-type]

    @web.middleware
    async def seen(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        finally:
            handled.set()

    app.middlewares.insert(0, seen)
    return app


async def _post(client: Any) -> Any:
    url = "/v1/sandboxes/sbx_a/exec"
    data = wire.json.dumps({"execution_id": "exe_1", "argv": ["true"]}).encode()
    headers = {**wire.sign(SECRET, "POST", url, body=wire.body_digest(data)), "Content-Type": "application/json"}
    return await client.post(url, data=data, headers=headers)


async def test_a_silent_command_is_answered_whole(aiohttp_client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    client = await aiohttp_client(_app(tmp_path, _Driver(chatty=False), asyncio.Event()))
    resp = await _post(client)
    assert resp.status == 200
    assert resp.headers.get("Transfer-Encoding") is None  # not streamed: sized, in one piece
    [(kind, payload)] = wire.FrameReader().feed(await resp.read())
    assert (kind, wire.json.loads(payload)["exitCode"]) == (wire.RESULT, 3)


async def test_an_api_side_gone_mid_output_ends_the_handler(aiohttp_client, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    driver, handled = _Driver(chatty=True), asyncio.Event()
    client = await aiohttp_client(_app(tmp_path, driver, handled))
    resp = await _post(client)
    assert resp.headers.get("Transfer-Encoding") == "chunked"  # output streams as it comes
    await resp.content.readexactly(wire.HEADER.size)
    resp.close()  # the API side goes away
    await asyncio.wait_for(driver.cancelled.wait(), 10)
    await asyncio.wait_for(handled.wait(), 10)
