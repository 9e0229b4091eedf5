"""What a running command's output goes through on its way to its streams: the stream
options a create or execute gives, and the sink that applies them.

The streams themselves (stdout/stderr bytes of executions, which are not events) are the
``core.output`` port's: plain files under the data dir on the embedded profile
(``blobs.output_files``), chunks in PostgreSQL on the production profile
(``blobs.output_postgres``), picked in ``api.composition``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import attrs

from hutch.core.output import OutputStreams, OutputWriter


@attrs.frozen
class StreamOptions:
    """What ``stream`` in a create (its initial command) or an execute asks of the output."""

    timestamps: bool = False  # each line prefixed with the UTC time its first byte arrived
    ignore: frozenset[str] = frozenset()  # "stdout" / "stderr" given as "ignore": discarded
    stdin: str | None = None  # a stdin stream (service/input_streams.py) to read the command's input from


RAW_OUTPUT = StreamOptions()  # no stream options: the bytes as the command wrote them


class OutputBudget:
    """What an organization's running commands may still keep of their output on this replica
    before its storage quota is full (service/quotas.py ``output_budget``): every command of
    the organization running here takes from the one budget, so that many at once cannot each
    keep what is left. ``left`` is set afresh from the counted usage as each command starts,
    and when the organization's quota changes (so a quota set while a command runs reaches
    it); bytes taken while that usage was being counted may not be in it, so they stay taken.
    ``left`` None: the organization has no storage quota (every byte kept, still counted)."""

    def __init__(self) -> None:
        self.left: int | None = 0
        self.spent = 0  # every byte ever taken (to tell which were taken while usage was counted)

    def take(self, size: int) -> int:
        """How many of ``size`` bytes may be kept (all, some, or none), taken."""
        got = size if self.left is None else min(size, max(self.left, 0))
        if self.left is not None:
            self.left -= got
        self.spent += got
        return got

    def lower(self, size: int) -> None:
        """``size`` bytes stored besides output come out of what is left."""
        if self.left is not None:
            self.left -= size

    def refill(self, room: int | None, spent_before: int) -> None:
        """``room``: what the quota leaves (None: no quota), counted from a usage read when
        ``spent`` was ``spent_before``."""
        self.left = None if room is None else room - (self.spent - spent_before)


class ExecutionSink:
    """Where a running command's bytes go: its two output streams, as ``StreamOptions`` say,
    within the organization's ``OutputBudget`` (the rest is dropped and the stream marked
    truncated, as past the per-stream cap)."""

    def __init__(self, stdout: OutputWriter, stderr: OutputWriter, options: StreamOptions = RAW_OUTPUT,
                 budget: OutputBudget | None = None) -> None:
        self.streams = {"stdout": stdout, "stderr": stderr}
        self.options = options
        self.budget = budget
        self._line_start = {"stdout": True, "stderr": True}

    def write(self, stream: str, data: bytes) -> None:
        if stream in self.options.ignore:
            return
        if self.options.timestamps:
            data = self._stamped(stream, data)
        writer = self.streams[stream]
        if self.budget is not None and data and not writer.closed:
            fits = min(len(data), max(writer.cap - writer.size, 0))  # the stream's cap cuts the rest anyway
            allowed = self.budget.take(fits)
            if allowed < fits:
                writer.truncated = True
                data = data[:allowed]
        writer.write(data)

    def _stamped(self, stream: str, data: bytes) -> bytes:
        now = time.time()
        stamp = (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z ").encode()
        out = bytearray()
        for piece in data.splitlines(keepends=True):
            if self._line_start[stream]:
                out += stamp
            out += piece
            self._line_start[stream] = piece.endswith((b"\n", b"\r"))
        return bytes(out)



class OutputReads:
    """Reading a stored output stream by its id (GET /streams/{id})."""

    def __init__(self, outputs: OutputStreams) -> None:
        self._outputs = outputs

    async def exists(self, stream_id: str) -> bool:
        return await self._outputs.exists(stream_id)

    def read(self, stream_id: str) -> AsyncIterator[bytes]:
        """The stream's bytes, following it while it is open."""
        return self._outputs.read(stream_id)
