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

from hutch.core.models import ExecutionState
from hutch.core.output import OutputStreams
from hutch.projections.base import ProjectionStore
from hutch.service.changes import Changes
from hutch.service.stream_ids import StreamIds

# A safety net only: changes wake the reader at once through the projector's listener.
_RECHECK_SECONDS = 1.0


def is_sandbox_stream(owner_id: str) -> bool:
    return owner_id.startswith("sbx_")


class SandboxOutput:
    """Unscoped on purpose: the stream id is the capability (routes/streams.py), so the
    projections are read as they are, not through ``Reads``."""

    def __init__(self, changes: Changes, store: ProjectionStore, outputs: OutputStreams, streams: StreamIds) -> None:
        self._changes, self._store, self._outputs, self._streams = changes, store, outputs, streams

    async def follow(self, sandbox_id: str, stream: str) -> AsyncIterator[bytes]:
        """The bytes of ``stream`` ("stdout"/"stderr") of every execution of the sandbox so far,
        then new ones as they come, ending when the sandbox has ended."""
        done: set[str] = set()
        changes = self._changes.listen(sandbox_id=sandbox_id, limit=1)
        try:
            while True:
                _drain(changes)  # what happened before the reads below is in them
                # Read the sandbox before its executions: an ended sandbox has no new ones after.
                sandbox = await self._store.get_sandbox(sandbox_id)
                ended = sandbox is None or sandbox.status.is_final
                pending = [x for x in reversed(await self._store.list_executions(sandbox_id))
                           if x.execution_id not in done]
                progressed = False
                for execution in pending:
                    stream_id = self._streams.derive(execution.execution_id, stream)
                    if not await self._readable(execution, stream_id):
                        break  # queued: its stream opens when it starts; keep the order
                    async for chunk in self._outputs.read(stream_id):
                        yield chunk
                    done.add(execution.execution_id)
                    progressed = True
                if progressed:
                    continue
                if ended and not pending:
                    return
                if ended and pending and not await self._any_readable(pending, stream):
                    return  # ended with commands that never started (they were cancelled with it)
                await _next_change(changes)
        finally:
            self._changes.unlisten(changes)

    async def execution_output(self, execution_id: str, stream: str) -> AsyncIterator[bytes]:
        """One execution's ``stream`` to its end, waiting first for a queued execution to start
        (its stream opens then: reading it before would read an empty stream)."""
        stream_id = self._streams.derive(execution_id, stream)
        execution = await self._store.get_execution(execution_id)
        if execution is not None:
            changes = self._changes.listen(sandbox_id=execution.sandbox_id, limit=1)
            try:
                while True:
                    _drain(changes)
                    execution = await self._store.get_execution(execution_id)
                    if execution is None or await self._readable(execution, stream_id):
                        break
                    await _next_change(changes)
            finally:
                self._changes.unlisten(changes)
        async for chunk in self._outputs.read(stream_id):
            yield chunk

    async def _any_readable(self, pending: Iterable[ExecutionState], stream: str) -> bool:
        """Stops at the first: on PostgreSQL each check is a query."""
        for execution in pending:
            if await self._readable(execution, self._streams.derive(execution.execution_id, stream)):
                return True
        return False

    async def _readable(self, execution: ExecutionState, stream_id: str) -> bool:
        """Its bytes can be read to their end now: the stream is open (read follows it to its
        close) or the execution has ended (its bytes, if any, are all saved: its streams closed first)."""
        return execution.status.is_final or await self._outputs.is_open(stream_id)


def _drain(changes: asyncio.Queue) -> None:
    while not changes.empty():
        changes.get_nowait()


async def _next_change(changes: asyncio.Queue) -> None:
    """The sandbox's next event (its listener takes no other), or the safety net's time."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_RECHECK_SECONDS):
            await changes.get()
