"""The BlobStore port: named byte strings (snapshot archives, disk checkpoints) that every
API replica can reach and that outlive the host that wrote them.

Keys are relative, slash-separated names such as ``snapshots/snp_1.tar.gz``. A key is
refused (``InvalidInput`` naming it) when it is empty, absolute, contains a NUL byte, an
empty segment, or a segment that is ``..`` or starts with a dot (adapters keep their
own temporary names there, so a key can never collide with one).

Failure semantics, which every adapter keeps (``tests/contracts/test_blobs.py``):

* ``put`` is all or nothing. Readers see the previous value (or no value) until ``put``
  returns, and the whole new value after. If the byte stream raises, or the process or
  host dies part-way, nothing of the new value is ever visible and the previous one is
  intact. Returning means durable (fsynced and renamed; committed).
* Concurrent ``put`` calls on one key never mix: the key ends up holding exactly one of
  the values written, whole.
* ``get`` raises ``BlobNotFound`` before it yields anything when the key is absent; once
  it has started, it streams the version that was current when it started, even if that
  version is overwritten or deleted meanwhile.
* ``delete`` and ``delete_prefix`` are idempotent; they report what they removed.
* A backend that cannot be reached raises ``BlobUnavailable`` (retriable). A ``put`` that
  raised it took effect fully or not at all (the lost part may be the commit's reply).

Two optional hooks let a store that keeps blobs as local files skip a copy (``link_file``,
``open_local``); ``storage.spool`` calls them and falls back to ``put``/``get``, so callers
never ask which store they hold.

This module is pure: the adapters (``blobs.files``, ``blobs.postgres``) do the I/O.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, AsyncIterable
from pathlib import Path
from typing import IO

import attrs

from hutch.core.errors import InvalidInput, NotFound, ServiceUnavailable

CHUNK = 1 << 20  # what ``get`` yields at most, and what adapters write at a time
MAX_KEY_LENGTH = 1024


class BlobNotFound(NotFound):
    code = "BLOB_NOT_FOUND"


class BlobUnavailable(ServiceUnavailable):
    code = "BLOB_STORE_UNAVAILABLE"


@attrs.frozen
class BlobInfo:
    key: str
    size: int
    sha256: str | None  # hex digest of the content; None from ``stat`` where it is not kept
    created: float  # seconds since the epoch, when this version was put


def check_key(key: object, *, what: str = "key") -> str:
    """``key`` when it is a usable blob key; otherwise ``InvalidInput`` naming it."""
    if not isinstance(key, str):
        raise InvalidInput(f"blob {what}: expected a string, got {key!r}", field=what)
    problem = _key_problem(key)
    if problem:
        raise InvalidInput(f"blob {what} {key!r}: {problem}", field=what)
    return key


def check_prefix(prefix: object) -> str:
    """A prefix for ``delete_prefix``: a key, or a key with a trailing slash. Never empty,
    so no call can wipe a whole store by accident."""
    if isinstance(prefix, str) and prefix.endswith("/"):
        check_key(prefix[:-1], what="prefix")
        return prefix
    return check_key(prefix, what="prefix")


def _key_problem(key: str) -> str | None:
    if not key:
        return "is empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"is longer than {MAX_KEY_LENGTH} characters"
    if "\0" in key:
        return "contains a NUL byte"
    if key.startswith("/"):
        return "is absolute; keys are relative names"
    if "\\" in key:
        return "contains a backslash; segments are separated by '/'"
    for segment in key.split("/"):
        if segment == "":
            return "has an empty segment ('//' or a trailing '/')"
        if segment == "..":
            return "climbs out with '..'"
        if segment.startswith("."):
            return f"has a segment starting with a dot ({segment!r})"
    return None


class BlobStore(abc.ABC):
    """Where shared byte strings live. See the module docstring for what every method
    guarantees when it fails."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections and create what the store needs; called once before use."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release everything."""

    @abc.abstractmethod
    async def put(self, key: str, chunks: AsyncIterable[bytes]) -> BlobInfo:
        """Store the bytes ``chunks`` yields under ``key``, replacing any value, atomically
        and durably. Consumes ``chunks`` as it goes (never all in memory)."""

    @abc.abstractmethod
    def get(self, key: str) -> AsyncGenerator[bytes, None]:
        """The content of ``key`` in chunks of at most ``CHUNK`` bytes. An async generator:
        ``BlobNotFound`` comes from its first step. Close it (``contextlib.aclosing``) when
        not reading it to the end, so the backend's resources are freed at once."""

    @abc.abstractmethod
    async def stat(self, key: str) -> BlobInfo:
        """Size, digest and time of ``key``, without reading its content; ``BlobNotFound``
        when absent."""

    async def exists(self, key: str) -> bool:
        try:
            await self.stat(key)
        except BlobNotFound:
            return False
        return True

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """Remove ``key``; whether it was there."""

    @abc.abstractmethod
    async def delete_prefix(self, prefix: str) -> int:
        """Remove every key starting with ``prefix`` (see ``check_prefix``); how many."""

    async def link_file(self, key: str, path: Path) -> bool:
        """Put the complete local file at ``path`` under ``key`` without copying it, where
        the store can; False, with nothing changed, where it cannot (the default), so the
        caller streams the file through ``put``. Same guarantees as ``put`` when True."""
        return False

    async def open_local(self, key: str) -> IO[bytes] | None:
        """``key``'s value as an open local file, read in place, where the store keeps its
        values as files (``BlobNotFound`` if absent); None where it does not (the default),
        so the caller copies it out with ``get``."""
        return None
