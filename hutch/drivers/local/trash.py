"""Deleting dead sandboxes' directories off the event loop.

A destroy renames the sandbox's directory into ``.trash/`` (one rename, on the loop) and one
worker thread deletes whatever is there. A sandbox directory is only a dozen entries, but
deleting them took 20 ms a destroy here (median of 300 destroys, 8 at a time, load 5: inode
eviction on the host's ext4), on the event loop, where nothing else ran meanwhile: a
destroy-all could not go faster than ~40 sandboxes a second. In the worker it overlaps
with the rest (the kills' waits, the next requests).

Only the directory's deletion waits: the sandbox is gone (processes, cgroups, mounts, its
uid released) before its directory is renamed. What an earlier server left in the trash is
deleted at start; ``drain`` waits for the worker (the driver's close).

A tenant decides what its directory holds, deeper than shutil.rmtree can go: it recurses
once per level, and ``mkdir d; cd d`` 1,000 times was a RecursionError, which left that
directory and every entry listed after it in the trash for good, and stopped the next
server's start. So each entry is deleted on its own (one that fails is logged and left, the
rest go), and one too deep for rmtree goes with ``rm -rf`` (filetrees.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from pathlib import Path

from hutch.drivers.local.filetrees import delete_tree

log = logging.getLogger(__name__)

TRASH_DIR = ".trash"


class Trash:
    def __init__(self, sandbox_root: Path) -> None:
        self.root = sandbox_root / TRASH_DIR
        self._seq = itertools.count()
        self._pending = False  # something was put since the worker last looked
        self._worker: asyncio.Future[None] | None = None

    def reset(self) -> None:
        """At start (blocking): delete what an earlier server left."""
        self.root.mkdir(mode=0o700, exist_ok=True)
        self._delete_all()

    def put(self, d: Path) -> None:
        """Move ``d`` into the trash (gone from where it was on return) and have it deleted.
        Falls back to deleting it here when it cannot be moved (another file system)."""
        try:
            os.rename(d, self.root / f"{d.name}.{next(self._seq)}")
        except OSError:
            delete_tree(d)
            return
        self._pending = True
        if self._worker is None:
            self._worker = asyncio.ensure_future(asyncio.to_thread(self._empty))
            self._worker.add_done_callback(self._ended)

    def _ended(self, worker: asyncio.Future[None]) -> None:
        self._worker = None
        if not worker.cancelled() and worker.exception() is not None:
            log.warning("emptying the sandbox trash failed: %s", worker.exception())
        elif self._pending:  # put after the worker's last look: look again
            self._pending = False
            self._worker = asyncio.ensure_future(asyncio.to_thread(self._empty))
            self._worker.add_done_callback(self._ended)

    def _empty(self) -> None:
        """The worker: delete everything in the trash until nothing more was put."""
        self._pending = False
        while True:
            self._delete_all()
            if not self._pending:
                return
            self._pending = False

    def _delete_all(self) -> None:
        for name in os.listdir(self.root):
            try:
                delete_tree(self.root / name)
            except Exception as err:  # left for the next look; the others go all the same
                log.warning("deleting %s from the sandbox trash failed: %s", name, err)

    async def drain(self) -> None:
        """Wait until the trash is empty (what was put so far is deleted)."""
        while self._worker is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._worker)
