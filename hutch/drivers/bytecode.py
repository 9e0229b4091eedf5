"""Python's cached bytecode of a source the platform rewrites is dropped with the write.

Python reuses ``__pycache__/NAME.<tag>.pyc`` while the source's mtime (whole seconds) and size
match what the .pyc recorded. An agent that fixes a module and reruns it within the same second,
at the same size, would run the old code (``python3 -B`` too: -B only stops writing caches).
So every write of a ``.py`` file through a driver's file operations removes that module's
cached bytecode next to it: the next import compiles what was written. Writes a sandbox's own
processes make are Python's ordinary business and left alone.
"""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Awaitable, Callable, Iterable

from hutch.core.errors import HutchError
from hutch.drivers.base import FileInfo

ListFiles = Callable[[str, str], Awaitable[list[FileInfo]]]
Remove = Callable[..., Awaitable[bool]]


async def forget_bytecode(list_files: ListFiles, remove: Remove, sandbox_id: str, paths: Iterable[str]) -> None:
    caches: dict[str, set[str]] = {}
    for path in paths:
        folder, name = posixpath.split(path)
        if name.endswith(".py"):
            caches.setdefault(posixpath.join(folder, "__pycache__"), set()).add(name[:-3] + ".")
    for cache, prefixes in caches.items():
        # The source is written already; a cache that cannot be listed or removed (none there,
        # not a directory) must not fail that write.
        with contextlib.suppress(HutchError):
            for entry in await list_files(sandbox_id, cache):
                if entry.name.endswith(".pyc") and entry.name.startswith(tuple(prefixes)):
                    await remove(sandbox_id, posixpath.join(cache, entry.name), directory=False, recursive=False)
