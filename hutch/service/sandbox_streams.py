"""A sandbox's own output streams: every execution's stdout (or stderr), one after another.

``@agentuity/runtime``'s ``ctx.sandbox`` reads an interactive sandbox's output from the
``stdoutStreamId``/``stderrStreamId`` of the create answer (and ``connect`` from the
``stdoutStreamUrl`` of a get): the sandbox's console, not one command's. hutch keeps output
per execution (service/output.py), so a sandbox stream is composed on read: the bytes of each
execution in the order they were made, following the running one, then waiting for the
next, until the sandbox has ended and its last execution's stream has closed. Its id is
derived from the sandbox id like an execution's (service/stream_ids.py), so it is the same kind
of capability and needs no state.

Reading it is not waiting on any command: a reader that leaves cancels nothing (unlike an
execution's stream, api/watchers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING

from hutch.core.models import ExecutionState

if TYPE_CHECKING:
    from hutch.service.engine import Engine

# A safety net only: changes wake the reader at once through the projector's listener.
_RECHECK_SECONDS = 1.0


def is_sandbox_stream(owner_id: str) -> bool:
    return owner_id.startswith("sbx_")


async def follow(engine: Engine, sandbox_id: str, stream: str) -> AsyncIterator[bytes]:
    """The bytes of ``stream`` ("stdout"/"stderr") of every execution of the sandbox so far,
    then new ones as they come, ending when the sandbox has ended."""
    done: set[str] = set()
    changes = engine.parts.projector.listen(sandbox_id=sandbox_id, limit=1)
    try:
        while True:
            _drain(changes)  # what happened before the reads below is in them
            # Read the sandbox before its executions: an ended sandbox has no new ones after.
            sandbox = await engine.parts.store.get_sandbox(sandbox_id)
            ended = sandbox is None or sandbox.status.is_final
            pending = [x for x in reversed(await engine.parts.store.list_executions(sandbox_id))
                       if x.execution_id not in done]
            progressed = False
            for execution in pending:
                stream_id = engine.streams.derive(execution.execution_id, stream)
                if not await _readable(engine, execution, stream_id):
                    break  # queued: its stream opens when it starts; keep the order
                async for chunk in engine.parts.outputs.read(stream_id):
                    yield chunk
                done.add(execution.execution_id)
                progressed = True
            if progressed:
                continue
            if ended and not pending:
                return
            if ended and pending and not await _any_readable(engine, pending, stream):
                return  # ended with commands that never started (they were cancelled with it)
            await _next_change(changes)
    finally:
        engine.parts.projector.unlisten(changes)


async def execution_output(engine: Engine, execution_id: str, stream: str) -> AsyncIterator[bytes]:
    """One execution's ``stream`` to its end, waiting first for a queued execution to start
    (its stream opens then: reading it before would read an empty stream)."""
    stream_id = engine.streams.derive(execution_id, stream)
    execution = await engine.parts.store.get_execution(execution_id)
    if execution is not None:
        changes = engine.parts.projector.listen(sandbox_id=execution.sandbox_id, limit=1)
        try:
            while True:
                _drain(changes)
                execution = await engine.parts.store.get_execution(execution_id)
                if execution is None or await _readable(engine, execution, stream_id):
                    break
                await _next_change(changes)
        finally:
            engine.parts.projector.unlisten(changes)
    async for chunk in engine.parts.outputs.read(stream_id):
        yield chunk


async def _any_readable(engine: Engine, pending: Iterable[ExecutionState], stream: str) -> bool:
    """Stops at the first: on PostgreSQL each check is a query."""
    for execution in pending:
        if await _readable(engine, execution, engine.streams.derive(execution.execution_id, stream)):
            return True
    return False


async def _readable(engine: Engine, execution: ExecutionState, stream_id: str) -> bool:
    """Its bytes can be read to their end now: the stream is open (read follows it to its
    close) or the execution has ended (its bytes, if any, are all saved: its streams closed first)."""
    return execution.status.is_final or await engine.parts.outputs.is_open(stream_id)


def _drain(changes: asyncio.Queue) -> None:
    while not changes.empty():
        changes.get_nowait()


async def _next_change(changes: asyncio.Queue) -> None:
    """The sandbox's next event (its listener takes no other), or the safety net's time."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_RECHECK_SECONDS):
            await changes.get()
