"""Reading an execution's output streams: capture, forward to sinks, or interleave.

The stream URLs are read through :meth:`hutch._connection.Connection.stream` (which decides
where the API key may be sent)."""

from __future__ import annotations

import asyncio
import codecs
import inspect
import io
import time
from collections.abc import AsyncIterator, Callable
from typing import IO, Any, Literal

from hutch._connection import Connection
from hutch.models import OutputChunk

#: Where streamed output goes: a callable taking ``bytes`` (sync or async), a binary
#: file (``sys.stdout.buffer``) or a text file (``sys.stdout``; decoded as UTF-8).
OutputSink = Callable[[bytes], Any] | IO[bytes] | IO[str]
Stream = Literal["stdout", "stderr"]


class _Sink:
    """Adapts an :data:`OutputSink` to ``await write(bytes)``."""

    def __init__(self, target: OutputSink) -> None:
        self._target = target
        self._decoder: codecs.IncrementalDecoder | None = None
        if isinstance(target, io.TextIOBase) or (
            hasattr(target, "write") and hasattr(target, "encoding")
        ):
            self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    async def write(self, data: bytes) -> None:
        if hasattr(self._target, "write"):
            self._to_file(self._decoder.decode(data) if self._decoder else data)
            return
        target: Any = self._target  # a callable, sync or async
        result = target(data)
        if inspect.isawaitable(result):
            await result

    async def close(self) -> None:
        if self._decoder is not None:
            tail = self._decoder.decode(b"", final=True)
            if tail:
                self._to_file(tail)

    def _to_file(self, payload: bytes | str) -> None:
        # A binary or a text file; __init__ chose bytes or str to match.
        target: Any = self._target
        if payload:
            target.write(payload)
        if hasattr(target, "flush"):
            target.flush()


class OutputCollector:
    """Reads stdout/stderr stream URLs concurrently, capturing and/or forwarding chunks."""

    def __init__(
        self,
        connection: Connection,
        stdout_url: str | None,
        stderr_url: str | None,
        *,
        stdout: OutputSink | None = None,
        stderr: OutputSink | None = None,
        capture: bool = True,
    ) -> None:
        self._connection = connection
        self.combined = stdout_url is not None and stdout_url == stderr_url
        self._stdout_url = stdout_url
        self._stderr_url = None if self.combined else stderr_url
        self._sinks = (
            _Sink(stdout) if stdout is not None else None,
            _Sink(stderr) if stderr is not None else None,
        )
        self._capture = capture
        self.out = bytearray()
        self.err = bytearray()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_progress = time.monotonic()

    def start(self) -> None:
        if self._stdout_url:
            self._tasks.append(
                asyncio.create_task(self._pump(self._stdout_url, self.out, self._sinks[0]))
            )
        if self._stderr_url:
            self._tasks.append(
                asyncio.create_task(self._pump(self._stderr_url, self.err, self._sinks[1]))
            )

    async def _pump(self, url: str, buf: bytearray, sink: _Sink | None) -> None:
        async for chunk in self._connection.stream(url):
            self._last_progress = time.monotonic()
            if self._capture:
                buf.extend(chunk)
            if sink is not None:
                await sink.write(chunk)
        if sink is not None:
            await sink.close()

    async def drain(self, idle_timeout: float | None) -> None:
        """Wait for every stream to reach EOF; give up on streams silent for ``idle_timeout``."""
        pending = {t for t in self._tasks if not t.done()}
        while pending:
            _, pending = await asyncio.wait(pending, timeout=1.0)
            if (
                idle_timeout is not None
                and pending
                and time.monotonic() - self._last_progress > idle_timeout
            ):
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                break
        for task in self._tasks:
            if task.done() and not task.cancelled() and (error := task.exception()) is not None:
                raise error

    async def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def text(self) -> tuple[str, str]:
        out = self.out.decode("utf-8", errors="replace")
        err = out if self.combined else self.err.decode("utf-8", errors="replace")
        return out, err


async def interleave(
    connection: Connection, stdout_url: str | None, stderr_url: str | None
) -> AsyncIterator[OutputChunk]:
    """Yield :class:`OutputChunk` s from stdout and stderr, interleaved as they arrive, until both end."""
    queue: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
    streams: list[tuple[Stream, str | None]] = [("stdout", stdout_url)]
    if stderr_url != stdout_url:
        streams.append(("stderr", stderr_url))
    urls = [(name, url) for name, url in streams if url]

    async def pump(name: Stream, url: str) -> None:
        try:
            async for chunk in connection.stream(url):
                await queue.put(OutputChunk(name, chunk))
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(name, url)) for name, url in urls]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
                continue
            yield item
        for task in tasks:
            if (error := task.exception()) is not None:
                raise error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
