"""The install layers' cache (layers.py) is the server's cache, not a tenant's storage: it is
bounded by size (``HUTCH_LAYER_CACHE_MAX``) and by time (``HUTCH_LAYER_RETENTION``) instead of
being counted against an organization, because a layer is shared by every create that asks
for the same list and belongs to none of them.

A layer is dropped only when no overlay on this host has it as a lower layer. That is read
from the mounts of every mount namespace (``/proc/<pid>/mountinfo``), not from this
server's records: the cache is shared by every server (data dir) on the host, and local
sandboxes outlive a server that stops. A create holds the layer's use lock (shared) from
finding the layer until its overlay is mounted, and a drop takes it exclusively and looks at
the mounts again, so a layer is never removed between a create finding it and mounting it.

What goes, at each sweep (at start, after each build, and every tenth of the retention, at
most every 10 minutes): every unused layer last used longer than the retention ago, then
unused layers, least recently used first, while the cache is larger than its bound. Layers
in use count toward the bound but are never dropped: what live sandboxes hold is bounded by
the sandboxes an organization may have. A sandbox paused filesystem-only (fspause.py) has no
overlay mounted until its resume: it holds its layer by a file instead (``asleep``), which a
drop and a sweep honour as they honour a mount.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs

from hutch.drivers.local.filetrees import delete_tree, disk_bytes

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 4 * 2**30
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600.0
MAX_SWEEP_SECONDS = 600.0
_KEY = re.compile(r"^[0-9a-f]{24}\Z")  # layers.layer_key
_USED = "used"  # its mtime: when a create last asked for the layer
_SIZE = "size"  # the tree's bytes, measured once (a layer never changes)


@attrs.frozen
class LayerLimits:
    max_bytes: int = DEFAULT_MAX_BYTES
    retention_seconds: float = DEFAULT_RETENTION_SECONDS

    @property
    def every(self) -> float:
        """Seconds between sweeps: an unused layer outlives its retention by at most this."""
        return min(max(self.retention_seconds / 10, 1.0), MAX_SWEEP_SECONDS)


def tree_bytes(root: Path) -> int:
    """Bytes a tree takes on disk (its files' blocks; directories and links are small),
    however deep its packages' files go (filetrees.py)."""
    return disk_bytes(root)


@contextlib.contextmanager
def using(root: Path, key: str, *, exclusive: bool = False) -> Iterator[bool]:
    """The layer's use lock: shared while a create finds and mounts it (blocking), exclusive
    for a drop (not blocking: yields False when a create holds it)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{key}.use", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB if exclusive else fcntl.LOCK_SH)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.asynccontextmanager
async def held(root: Path, key: str | None) -> AsyncIterator[None]:
    """``using`` (shared) around finding and mounting layer ``key`` (None: no layer): no
    sweep drops it meanwhile. Waited for in a thread (a drop holds it while it renames)."""
    if key is None:
        yield
        return
    with contextlib.ExitStack() as stack:
        await asyncio.to_thread(stack.enter_context, using(root, key))
        yield


def _holds(root: Path, key: str) -> Path:
    return root / ".asleep" / key


def asleep(root: Path, key: str | None, sandbox_id: str, *, holding: bool) -> None:
    """Hold layer ``key`` for a sandbox that has it mounted no more but will again (paused
    filesystem-only), or let it go (its resume mounted it again, or its end)."""
    if key is None:
        return
    mark = _holds(root, key) / sandbox_id
    if holding:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
        return
    mark.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        mark.parent.rmdir()  # only when no other sandbox holds it


def held_asleep(root: Path) -> set[str]:
    """Keys of the layers a sandbox paused filesystem-only holds."""
    with contextlib.suppress(FileNotFoundError):
        return {d.name for d in (root / ".asleep").iterdir() if any(d.iterdir())}
    return set()


def touch(root: Path, key: str) -> None:
    """Mark the layer used now (what least-recently-used and the retention go by)."""
    with contextlib.suppress(OSError):
        (root / key / _USED).touch()


def size_of(root: Path, key: str) -> int:
    path = root / key / _SIZE
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text())
    size = tree_bytes(root / key / "tree")  # a layer built before sizes were kept
    with contextlib.suppress(OSError):
        path.write_text(f"{size}\n")
    return size


def _last_used(d: Path) -> float:
    for name in (_USED, "manifest.json", "tree"):
        with contextlib.suppress(OSError):
            return (d / name).stat().st_mtime
    return 0.0


def mounted(root: Path) -> set[str]:
    """Keys of the layers under ``root`` that some overlay on this host has as a lower layer."""
    layers_dir = str(root.resolve())
    seen: set[int] = set()
    keys: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            ns = os.stat(f"/proc/{pid}/ns/mnt").st_ino
            if ns in seen:
                continue
            with open(f"/proc/{pid}/mountinfo") as fh:
                text = fh.read()
        except OSError:  # gone meanwhile, or a kernel thread
            continue
        seen.add(ns)
        for line in text.splitlines():
            _, _, after = line.partition(" - ")
            if not after.startswith("overlay "):
                continue
            for option in after.split(" ")[-1].split(","):
                if option.startswith("lowerdir="):
                    for lower in option[len("lowerdir="):].split(":"):
                        path = Path(lower.replace("\\040", " "))
                        if path.name == "tree" and str(path.parent.parent) == layers_dir:
                            keys.add(path.parent.name)
    return keys


def drop(root: Path, key: str) -> bool:
    """Remove an unused layer; False (and nothing removed) when a create holds or mounted it."""
    with using(root, key, exclusive=True) as free:
        if not free or key in mounted(root) or key in held_asleep(root):
            return False
        trash = root / f".trash-{key}-{secrets.token_hex(4)}"
        try:
            os.rename(root / key, trash)  # at once: the next create builds it afresh
        except FileNotFoundError:
            return False
    _delete(trash)
    return True


def _delete(trash: Path) -> None:
    """A dropped layer's tree, deleted however deep (filetrees.py); one that cannot be is
    logged and left for the next sweep, which goes on with the rest."""
    try:
        delete_tree(trash)
    except OSError as err:
        log.warning("deleting the dropped install layer %s failed: %s", trash.name, err)


def sweep(root: Path, limits: LayerLimits, now: float | None = None) -> list[str]:
    """Drop the layers past their retention, then the least recently used while the cache
    is over its bound; returns the keys dropped."""
    if not root.is_dir():
        return []
    now = time.time() if now is None else now
    for trash in root.glob(".trash-*"):  # a sweep that died while removing
        _delete(trash)
    in_use = mounted(root) | held_asleep(root)
    total, unused = 0, []
    for d in root.iterdir():
        if not _KEY.match(d.name) or not (d / "tree").is_dir():
            continue
        size = size_of(root, d.name)
        total += size
        if d.name in in_use:
            touch(root, d.name)  # its retention starts when its last sandbox goes
        else:
            unused.append((_last_used(d), d.name, size))
    dropped = []
    cutoff = now - limits.retention_seconds
    for used, key, size in sorted(unused):
        if used > cutoff and total <= limits.max_bytes:
            break  # the rest were used later still
        if drop(root, key):
            total -= size
            dropped.append(key)
            log.info("install layer %s dropped (%d bytes; last used %.0fs ago)", key, size, now - used)
    if total > limits.max_bytes:
        log.warning("the install layers take %d bytes, over HUTCH_LAYER_CACHE_MAX (%d): the rest are in use",
                    total, limits.max_bytes)
    return dropped


class LayerSweeper:
    """Sweeps one cache at start, after each build (``wake``) and every ``limits.every``."""

    def __init__(self, root: Path, limits: LayerLimits) -> None:
        self.root = root
        self.limits = limits
        self._woken = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def sweep(self, now: float | None = None) -> list[str]:
        return await asyncio.to_thread(sweep, self.root, self.limits, now)

    def wake(self) -> None:
        self._woken.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            self._woken.clear()
            try:
                await self.sweep()
            except Exception:  # the next sweep tries again; a failed one leaves the rest as it was
                log.exception("sweeping the install layers failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), self.limits.every)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
