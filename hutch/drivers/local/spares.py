"""Spare sandbox directories: the skeleton of a destroyed sandbox, kept for the next one.

Every sandbox starts with the same dozen directories and files (``upper/etc/passwd``,
``upper/home/agentuity``, ``work``, ``merged``, ...). Making and deleting them is most of
a short-lived sandbox's file-system cost, and on a journal-less ext4 (this host's root)
allocating an inode skips every inode freed in the last minutes (``recently_deleted`` in
the kernel's ext4 allocator): at a hundred sandboxes a second the scan grows until it is
the largest single cost. So a destroyed sandbox whose directory is *exactly* the
skeleton, i.e. nothing the sandbox made survived in it, is renamed into ``.spare/``
instead, and the next sandbox over the same layers renames it into place and rewrites
its contents (passwd, group, resolv.conf in place; owner and modes reset).

"Exactly" is strict, because a leftover would be one sandbox's data in another's:
only the skeleton's names, each of the right type, files with one link, directories
empty but for the skeleton, and no extended attribute but overlayfs's own bookkeeping
of a mount over the same layers (``trusted.overlay.uuid``, ``origin`` and ``impure`` on
directories, which every mount writes and which only name the lower layers). An
``opaque`` or ``redirect`` mark (a directory the sandbox replaced or moved), a ``user.*``
attribute (a sandbox may set them on what it owns), anything else: the directory is
deleted as before.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import stat
from pathlib import Path

SPARE_DIR = ".spare"
MAX_SPARES = 32  # per host data dir; a burst beyond it is deleted as before


def _lineage(rel: str) -> set[str]:
    parts = rel.strip("/").split("/")
    return {"/".join(parts[: i + 1]) for i in range(len(parts))}


class SpareDirs:
    def __init__(self, sandbox_root: Path, dirs: list[str], *, xattr_prefix: str = "trusted.overlay.") -> None:
        """``dirs``: the directories the skeleton makes in the upper layer (home,
        workspace, ...); ``xattr_prefix``: where overlayfs keeps its bookkeeping
        (``user.overlay.`` when mounted in a user namespace)."""
        self.root = sandbox_root / SPARE_DIR
        self._by_key: dict[str, list[Path]] = {}
        self._seq = itertools.count()
        self._dirs = set().union(*map(_lineage, dirs))  # upper dirs the skeleton has
        self._upper = self._dirs | {"etc", "etc/passwd", "etc/group", "etc/resolv.conf"}
        self._bookkeeping = frozenset(xattr_prefix + name for name in OVERLAY_BOOKKEEPING)

    def reset(self) -> None:
        """At start: spares of an earlier server are not trusted; delete them."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(mode=0o700, exist_ok=True)

    def take(self, key: str, target: Path) -> bool:
        """Move a spare for ``key`` (the sandbox's layers) to ``target``; False if none."""
        spares = self._by_key.get(key)
        while spares:
            spare = spares.pop()
            try:
                os.rename(spare, target)
                return True
            except OSError:
                shutil.rmtree(spare, ignore_errors=True)
        return False

    def give(self, d: Path, key: str) -> bool:
        """Keep ``d`` (a dead sandbox's directory) as a spare if it is exactly a
        skeleton and there is room; False means the caller deletes it."""
        if sum(map(len, self._by_key.values())) >= MAX_SPARES or not self._is_skeleton(d):
            return False
        spare = self.root / f"{next(self._seq)}"
        try:
            os.rename(d, spare)
        except OSError:
            return False
        self._by_key.setdefault(key, []).append(spare)
        return True

    def _is_skeleton(self, d: Path) -> bool:
        try:
            names = set(os.listdir(d))
            if not names <= {"uid", "upper", "work", "merged", "meta.json"}:
                return False  # checkpoints, a restore's trash, a half-written meta
            # merged: a mount point of an earlier server's sandbox (launch.MOUNT_POINT now)
            if "merged" in names and (os.listdir(d / "merged") or not _xattrs_ok(d / "merged")):
                return False
            work = os.listdir(d / "work")
            if not set(work) <= {"work"} or (work and os.listdir(d / "work" / "work")):
                return False
            return self._upper_is_skeleton(d / "upper")
        except OSError:
            return False

    def _upper_is_skeleton(self, upper: Path) -> bool:
        for dirpath, dirnames, filenames in os.walk(upper):
            base = os.path.relpath(dirpath, upper)
            for name in dirnames + filenames:
                rel = name if base == "." else f"{base}/{name}"
                if rel not in self._upper:
                    return False
                st = os.lstat(os.path.join(dirpath, name))
                want_dir = rel in self._dirs or rel == "etc"
                if want_dir != stat.S_ISDIR(st.st_mode):
                    return False
                if not want_dir and (not stat.S_ISREG(st.st_mode) or st.st_nlink != 1):
                    return False
                if not _xattrs_ok(os.path.join(dirpath, name), self._bookkeeping if want_dir else frozenset()):
                    return False
        return _xattrs_ok(upper, self._bookkeeping)


OVERLAY_BOOKKEEPING = ("uuid", "origin", "impure")


def _xattrs_ok(path: str | Path, allowed: frozenset[str] = frozenset()) -> bool:
    with contextlib.suppress(OSError):
        return set(os.listxattr(path, follow_symlinks=False)) <= allowed
    return False  # cannot tell: not a spare
