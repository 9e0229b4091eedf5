"""What a running command's output goes through on its way to its streams: the stream
options a create or execute gives, and the sink that applies them.

The streams themselves (stdout/stderr bytes of executions, which are not events) are the
``core.output`` port's: plain files under the data dir on the embedded profile
(``blobs.output_files``), chunks in PostgreSQL on the production profile
(``blobs.output_postgres``), picked in ``api.composition``.
"""

from __future__ import annotations

import time

import attrs

from hutch.core.output import OutputWriter


@attrs.frozen
class StreamOptions:
    """What ``stream`` in a create (its initial command) or an execute asks of the output."""

    timestamps: bool = False  # each line prefixed with the UTC time its first byte arrived
    ignore: frozenset[str] = frozenset()  # "stdout" / "stderr" given as "ignore": discarded
    stdin: str | None = None  # a stdin stream (service/input_streams.py) to read the command's input from


RAW_OUTPUT = StreamOptions()  # no stream options: the bytes as the command wrote them


class ExecutionSink:
    """Where a running command's bytes go: its two output streams, as ``StreamOptions`` say."""

    def __init__(self, stdout: OutputWriter, stderr: OutputWriter, options: StreamOptions = RAW_OUTPUT) -> None:
        self.streams = {"stdout": stdout, "stderr": stderr}
        self.options = options
        self._line_start = {"stdout": True, "stderr": True}

    def write(self, stream: str, data: bytes) -> None:
        if stream in self.options.ignore:
            return
        if self.options.timestamps:
            data = self._stamped(stream, data)
        self.streams[stream].write(data)

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

