"""The OutputStreams port: the stdout/stderr bytes of executions, which are not events.

A stream is written by the one process running its command and read by anyone holding its
id (service/stream_ids.py), on any API replica. Every adapter keeps these rules
(``tests/contracts/test_output.py``):

* ``open`` makes the stream open and hands back its writer (the same writer when the
  stream is already open in this process). ``write`` never blocks: bytes past the cap
  are dropped and the writer marked truncated.
* ``close`` returns once every byte written is saved and the stream reads as closed
  everywhere: the caller records the execution finished only after it.
* ``read(offset)`` yields the bytes from ``offset`` on; while the stream is open it
  follows it (new bytes as they are saved) and it ends when the stream closes. A stream
  whose writer died (its process or host killed) reads as closed, with every byte that
  was saved before.
* A stream that never got a byte has nothing stored: it reads as empty, and whether it
  exists is the stream id's to say (``exists`` is given the id check).
* A negative offset is refused with ``InvalidInput``. An id that is not a stream id (``stm_`` and letters/digits) is refused with
  ``UnknownStream`` by every method.
* A stream opened with an ``owner`` (the organization and sandbox whose command writes it)
  is counted: ``stored(org)`` is every byte the organization's streams keep, saved or about
  to be (so a running command's output counts as it comes), and ``drop(owner)`` deletes every
  stream of that sandbox and returns the bytes it freed; ``kept()`` names the owners whose
  output is stored. A stream without an owner (written before streams had owners) is nobody's:
  counted by no one, dropped by no one.

This module is pure: the adapters (``blobs.output_files``, ``blobs.output_postgres``) do
the I/O.
"""

from __future__ import annotations

import abc
import asyncio
import re
from collections.abc import AsyncIterator, Callable, Sequence

import attrs

from hutch.core.errors import InvalidInput, NotFound

CHUNK = 64 * 1024  # what ``read`` yields at most


class UnknownStream(NotFound):
    code = "STREAM_NOT_FOUND"


def check_offset(stream_id: str, offset: int) -> int:
    """``offset`` when it is a byte position (0 or more); ``InvalidInput`` naming it otherwise."""
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise InvalidInput(f"stream {stream_id}: offset {offset!r} is not a byte position (0 or more)",
                           field="offset")
    return offset


def check_stream_id(stream_id: str) -> str:
    """``stream_id`` when it can name a stream; ``UnknownStream`` naming it otherwise."""
    if not isinstance(stream_id, str) or not stream_id.startswith("stm_") or not stream_id[4:].isalnum() \
            or not stream_id[4:].isascii():
        raise UnknownStream(f"stream {stream_id!r} not found: not a stream id")
    return stream_id


_OWNER_PART = re.compile(r"[A-Za-z0-9_-]{1,128}")


@attrs.frozen
class StreamOwner:
    """Whose output a stream is: counted against the organization's storage quota, dropped with
    the rest of its sandbox's output once that has ended long enough (service/retention.py)."""

    org_id: str
    sandbox_id: str

    def __attrs_post_init__(self) -> None:
        # Adapters may use them as names (a directory, a key): ids, never paths.
        for field, value in (("org_id", self.org_id), ("sandbox_id", self.sandbox_id)):
            if not isinstance(value, str) or not _OWNER_PART.fullmatch(value):
                raise InvalidInput(f"stream owner: {field} {value!r} is not an id", field=field)


class OutputWriter(abc.ABC):
    """One open stream's writer: the cap and truncation are kept here, the saving by the
    adapter (``_save``)."""

    def __init__(self, stream_id: str, cap: int, owner: StreamOwner | None = None) -> None:
        self.stream_id = stream_id
        self.owner = owner
        self.cap = cap
        self.size = 0
        self.truncated = False
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.closed or not data:
            return
        room = self.cap - self.size
        if len(data) > room:
            data = data[: max(room, 0)]
            self.truncated = True
        if data:
            self.size += len(data)
            self._save(data)

    @abc.abstractmethod
    def _save(self, data: bytes) -> None:
        """Keep ``data`` (already within the cap); must not block."""


class OutputStreams(abc.ABC):
    def __init__(self, cap_bytes: int, verify: Callable[[str], bool] = lambda _id: False) -> None:
        self.cap = cap_bytes
        self.verify = verify  # True for a stream id this deployment issued

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections and create what the store needs; called once before use."""

    async def close_store(self) -> None:  # noqa: B027 - optional hook
        """Release everything (open streams of this process read as closed after)."""

    @abc.abstractmethod
    async def secret(self) -> bytes:
        """The secret stream ids are signed with, the same for every replica sharing the store."""

    @abc.abstractmethod
    async def open(self, stream_id: str, owner: StreamOwner | None = None) -> OutputWriter:
        """Open the stream for writing in this process (the writer already open, if any, which
        takes ``owner`` when it has none yet)."""

    @abc.abstractmethod
    async def close(self, stream_id: str) -> None:
        """Save what is pending and close the stream; nothing when it is not open here. Once it
        returns every byte is saved and this process's readers see the stream closed; a store
        shared between processes may tell the others a round trip later (their readers read
        every byte, and end once they are told)."""

    async def open_all(self, stream_ids: Sequence[str], owner: StreamOwner | None = None) -> list[OutputWriter]:
        """``open`` each of them (an execution's stdout and stderr), in one go where the store
        can: concurrently here, for a store whose open is a round trip."""
        return list(await asyncio.gather(*(self.open(stream_id, owner) for stream_id in stream_ids)))

    async def close_all(self, stream_ids: Sequence[str]) -> None:
        """``close`` each of them, as ``open_all`` opens them."""
        await asyncio.gather(*(self.close(stream_id) for stream_id in stream_ids))

    @abc.abstractmethod
    async def is_open(self, stream_id: str) -> bool:
        """Whether some live process holds the stream open."""

    @abc.abstractmethod
    async def size(self, stream_id: str) -> int:
        """How many bytes of the stream are saved (readable) now."""

    @abc.abstractmethod
    def read(self, stream_id: str, offset: int = 0) -> AsyncIterator[bytes]:
        """The bytes from ``offset`` on, following the stream while it is open."""

    @abc.abstractmethod
    async def stored(self, org_id: str) -> int:
        """Bytes the organization's streams keep: saved, and written to its open streams here."""

    @abc.abstractmethod
    async def kept(self) -> list[StreamOwner]:
        """The owners (sandboxes) with output stored."""

    @abc.abstractmethod
    async def drop(self, owner: StreamOwner) -> int:
        """Delete every stream of ``owner``'s sandbox (for a sandbox that ended: none of its
        streams is written any more); returns the bytes freed. Its streams read as empty after."""

    async def exists(self, stream_id: str) -> bool:
        """A stream this deployment issued, or one with bytes saved."""
        try:
            check_stream_id(stream_id)
        except UnknownStream:
            return False
        return self.verify(stream_id) or await self.is_open(stream_id) or await self.size(stream_id) > 0
