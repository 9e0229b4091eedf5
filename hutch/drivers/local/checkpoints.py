"""Disk checkpoints of the local driver's sandboxes.

A checkpoint is a copy of the sandbox's upper layer (everything it changed over the
runtime: files, whiteouts for deletions, opaque-directory xattrs) taken while the
sandbox is frozen, so the copy is consistent and no sandbox process can swap a path
under the root-run copy. ``cp -a --reflink=auto``: hard links and xattrs kept, links
never followed, reflinks where the filesystem has them (btrfs, xfs), a full copy
otherwise. Hard links to the live files would be cheaper but wrong: an upper file is
modified in place, which would change the checkpoint too. Restore kills the
sandbox's processes (an overlay's upper layer may not change under its mount),
swaps in a copy of the checkpoint and starts init again over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from hutch.core import runtimes
from hutch.core.errors import (
    CheckpointNotFound,
    DriverFailure,
    IllegalTransition,
    InvalidInput,
    NotSupported,
    RuntimeNotFound,
    SandboxNotFound,
)
from hutch.drivers.local import layercache, layers
from hutch.drivers.local.cgroups import Cgroups
from hutch.drivers.local.filetrees import delete_tree, disk_bytes
from hutch.drivers.local.launch import Launcher
from hutch.drivers.local.sandboxnet import SandboxNetwork
from hutch.drivers.local.smallfiles import get as _get
from hutch.drivers.local.smallfiles import put as _put
from hutch.drivers.local.state import SAFE_ID, LocalSandbox, Registry
from hutch.drivers.local.teardown import Teardown

NO_FREEZER = "disk checkpoints need the cgroup freezer; this server runs without root (rootless mode)"
# Copies and deletes of checkpoints at once, in threads of their own. A copy takes as long as the
# sandbox's files are large (no disk limit: as large as the host's disk allows): in the event
# loop's default executor (6 threads on 2 cores), one tenant's checkpoints of a few large
# sandboxes took every thread the server's other work waits for (another tenant's create with a
# network, its file operations).
COPIES_AT_ONCE = 2
T = TypeVar("T")


def copy_layer(src: Path, dst: Path) -> None:
    """Copy an upper layer (``cp -a --reflink=auto``) to ``dst``, atomically."""
    tmp = dst.with_name(dst.name + ".tmp")
    if tmp.exists():
        delete_tree(tmp)
    tmp.parent.mkdir(mode=0o700, exist_ok=True)
    proc = subprocess.run(["cp", "-a", "--reflink=auto", "--", str(src), str(tmp)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        with contextlib.suppress(OSError):
            delete_tree(tmp)
        raise DriverFailure(f"copying the sandbox's files failed: {proc.stderr.strip()[-1000:]}")
    os.rename(tmp, dst)


class LocalCheckpoints:
    """Checkpoints of the sandboxes of one driver (needs the freezer: not rootless)."""

    def __init__(self, registry: Registry, cgroups: Cgroups | None, launcher: Launcher, net: SandboxNetwork,
                 teardown: Teardown, runtime_cache: Path) -> None:
        self._registry = registry
        self._cgroups = cgroups
        self._launcher = launcher
        self._net = net
        self._teardown = teardown
        self._runtime_cache = runtime_cache
        self._sandbox_root = registry.sandbox_root
        self._copies = ThreadPoolExecutor(COPIES_AT_ONCE, thread_name_prefix="hutch-checkpoint-copy")

    async def _copying(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._copies, functools.partial(fn, *args))

    def close(self) -> None:
        """Copies not started are dropped; one under way finishes in its thread."""
        self._copies.shutdown(wait=False, cancel_futures=True)

    def _checkpoint_dir(self, sid: str, checkpoint_id: str) -> Path:
        if not SAFE_ID.match(checkpoint_id):
            raise InvalidInput(f"invalid checkpoint id {checkpoint_id!r}", field="checkpoint_id")
        return self._sandbox_root / sid / "checkpoints" / checkpoint_id

    async def checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        sb = self._registry.running(sandbox_id)
        target = self._checkpoint_dir(sb.id, checkpoint_id)
        if self._cgroups is None:
            raise NotSupported("disk checkpoints need the cgroup freezer (a consistent copy); this server "
                               "runs without root (rootless mode)")
        async with self._registry.lock(sb.id):
            if target.exists():
                raise IllegalTransition(f"sandbox {sb.id} already has checkpoint {checkpoint_id}")
            was_frozen = self._cgroups.is_frozen(sb.id)
            if not was_frozen:
                await asyncio.to_thread(self._cgroups.freeze, sb.id, True)
            try:
                await self._copying(copy_layer, (self._sandbox_root / sb.id / "upper").resolve(), target)
            finally:
                if not was_frozen:
                    self._cgroups.freeze(sb.id, False)
            # Measured once, after the copy: what the organization's storage quota counts.
            await self._copying(lambda: _put(_size_file(target), str(disk_bytes(target)).encode()))

    async def restore(self, sandbox_id: str, checkpoint_id: str) -> None:
        sb = self._registry.running(sandbox_id)
        source = self._checkpoint_dir(sb.id, checkpoint_id)
        if self._cgroups is None:
            raise NotSupported(NO_FREEZER)
        if not source.is_dir():
            raise CheckpointNotFound(f"sandbox {sb.id} has no checkpoint {checkpoint_id}")
        recipe = runtimes.find(sb.runtime)
        if recipe is None:
            raise RuntimeNotFound(f"unknown runtime {sb.runtime!r}", field="runtime")
        async with self._registry.lock(sb.id):
            was_frozen = self._cgroups.is_frozen(sb.id)
            self._registry.mark_cancelled(sb.id)
            async with layercache.held(self._runtime_cache / "layers", sb.layer):  # unmounted a moment
                await self._teardown.kill_init(sb)
                await self._copying(self._swap_in, sb, source)
                pid, start = await self._launcher.launch(self._sandbox_root / sb.id, sb,
                                                         layers.lowers(self._runtime_cache, recipe, sb.layer))
            sb.init_pid, sb.init_start = pid, start
            self._registry.write_meta(sb)
            self._registry.sandboxes[sb.id] = sb
            if sb.network or sb.port is not None:
                await asyncio.to_thread(self._net.sync, sb)
            if was_frozen:
                await asyncio.to_thread(self._cgroups.freeze, sb.id, True)

    def _swap_in(self, sb: LocalSandbox, source: Path) -> None:
        # Fresh upper and work dirs: the old mount may linger a moment (a helper still
        # exiting holds its namespace), and overlay refuses a workdir that is in use. The
        # real dirs (on a limited disk: inside it, disks.py); the old ones go before the
        # copy, so a restore needs no more room than the checkpoint.
        d = self._sandbox_root / sb.id
        upper, work = (d / "upper").resolve(), (d / "work").resolve()
        trash = upper.parent / "trash"
        trash.mkdir(mode=0o700, exist_ok=True)
        stamp = time.monotonic_ns()
        os.rename(upper, trash / f"upper-{stamp}")
        os.rename(work, trash / f"work-{stamp}")
        for old in trash.iterdir():
            with contextlib.suppress(OSError):  # left for the next restore, or the sandbox's end
                delete_tree(old)  # however deep the tenant made it (trash.py)
        work.mkdir()
        copy_layer(source, upper)

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        if not SAFE_ID.match(sandbox_id):
            raise SandboxNotFound(f"sandbox {sandbox_id} not found")
        target = self._checkpoint_dir(sandbox_id, checkpoint_id)
        async with self._registry.lock(sandbox_id):
            if target.exists():
                await self._copying(delete_tree, target)
            _size_file(target).unlink(missing_ok=True)

    def sizes(self, sandbox_id: str) -> dict[str, int]:
        """Each checkpoint's bytes on the host's disk (measured when it was taken)."""
        if not SAFE_ID.match(sandbox_id):
            return {}
        out: dict[str, int] = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self._sandbox_root / sandbox_id / "checkpoints"):
                if entry.is_dir(follow_symlinks=False) and SAFE_ID.match(entry.name) \
                        and not entry.name.endswith(".tmp"):
                    path = Path(entry.path)
                    try:
                        out[entry.name] = int(_get(_size_file(path)))
                    except (FileNotFoundError, ValueError):
                        out[entry.name] = disk_bytes(path)  # taken by an older server
        return out


def _size_file(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name + ".size")
