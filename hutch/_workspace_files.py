"""The Workspace's files in a directory of this machine (the unix-local and docker backends).

Code that runs in the workspace can plant a symlink, swap a directory for one between a check
and a write, or leave a FIFO where a file was. For unix-local that code runs as you anyway; for
docker it is untrusted and this process may be root. So every path is walked one component at
a time from a descriptor of the root, each step opened with O_NOFOLLOW: a symlink anywhere on
the way is refused (ELOOP/ENOTDIR), not followed, and there is no window between a check and the
open that acts on it. Only regular files are read or written (a FIFO would block this thread).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_REFUSED = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)  # a symlink (or a file) where a directory was
Owner = tuple[int, int] | None  # (uid, gid) given to what is made; None: this process's


def _parts(root: Path, full: str) -> list[str]:
    rel = os.path.relpath(full, root)
    return [] if rel == "." else rel.split(os.sep)


def _open_dir(root: Path, parts: Sequence[str], *, make: bool = False, owner: Owner = None) -> int:
    fd = os.open(root, _DIR)
    try:
        for name in parts:
            if make:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
            step = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = step
        return fd
    except BaseException:
        os.close(fd)
        raise


def write(root: Path, full: str, data: bytes, shown: str, owner: Owner = None) -> None:
    """Write ``data`` at ``full`` (a path under ``root``), parents made; ValueError for a path
    that leads outside through a symlink, or onto something that is not a regular file."""
    *dirs, name = _parts(root, full) or [""]
    if not name:
        raise ValueError(f"path: {shown!r} is the workspace itself, not a file")
    try:
        dfd = _open_dir(root, dirs, make=True, owner=owner)
    except OSError as err:
        if err.errno in _REFUSED:
            raise ValueError(f"path: {shown!r} leads outside the workspace") from err
        raise
    try:
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644,
                         dir_fd=dfd)
        except OSError as err:
            if err.errno in (*_REFUSED, errno.ENXIO, errno.EISDIR):
                raise ValueError(f"path: {shown!r} leads outside the workspace or is not a regular file") from err
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"path: {shown!r} is not a regular file")
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if owner is not None:
                os.fchown(fd, *owner)
        finally:
            os.close(fd)
        if name.endswith(".py"):  # as the drivers do (drivers/bytecode.py): never run a stale module
            _drop_bytecode(dfd, name[:-3])
    finally:
        os.close(dfd)


def _drop_bytecode(dfd: int, stem: str) -> None:
    try:
        cache = os.open("__pycache__", _DIR, dir_fd=dfd)
    except OSError:
        return  # none, or not a directory we would follow
    try:
        for entry in os.listdir(cache):
            if entry.startswith(stem + ".") and entry.endswith(".pyc"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry, dir_fd=cache)
    finally:
        os.close(cache)


def read(root: Path, full: str) -> bytes | None:
    """The regular file at ``full``, or None (missing, or reached only through a symlink)."""
    *dirs, name = _parts(root, full) or [""]
    if not name:
        return None
    try:
        dfd = _open_dir(root, dirs)
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    try:
        return _read_regular(fd)
    finally:
        os.close(fd)


def _read_regular(fd: int) -> bytes | None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return None
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def listing(root: Path, full: str) -> list[tuple[str, bool, int]] | None:
    """The directory at ``full``: (name, is_dir, size) of each entry, sorted; None when there is
    no directory there (or only a symlink to one: the path is never followed out)."""
    try:
        dfd = _open_dir(root, _parts(root, full))
    except OSError:
        return None
    try:
        with os.scandir(dfd) as entries:
            found = []
            for e in entries:
                try:
                    found.append((e.name, e.is_dir(follow_symlinks=False), e.stat(follow_symlinks=False).st_size))
                except OSError:
                    continue  # removed while we looked
    finally:
        os.close(dfd)
    return sorted(found)


def files(root: Path) -> list[tuple[str, bytes]]:
    """Every regular file under ``root`` (relative POSIX path, contents), sorted; symlinks are
    neither followed nor listed."""
    found: list[tuple[str, bytes]] = []
    fd = os.open(root, _DIR)
    try:
        _collect(fd, "", found)
    finally:
        os.close(fd)
    return sorted(found)


def _collect(dfd: int, prefix: str, found: list[tuple[str, bytes]]) -> None:
    with os.scandir(dfd) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)) for e in entries]
    for name, is_dir, is_file in names:
        try:
            if is_dir:
                sub = os.open(name, _DIR, dir_fd=dfd)
                try:
                    _collect(sub, f"{prefix}{name}/", found)
                finally:
                    os.close(sub)
            elif is_file:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
                try:
                    data = _read_regular(fd)
                finally:
                    os.close(fd)
                if data is not None:
                    found.append((prefix + name, data))
        except OSError:
            continue  # changed under us (removed, swapped for a symlink): not a file of the snapshot


def give(root: Path, top: str, owner: Owner) -> None:
    """Hand everything under ``top`` (a path under ``root``: a git clone's directory) to
    ``owner``, never through a symlink."""
    if owner is None:
        return
    for dirpath, dirnames, filenames in os.walk(top):  # os.walk follows no symlinked directory
        for name in (*dirnames, *filenames):
            os.chown(os.path.join(dirpath, name), *owner, follow_symlinks=False)
    path = Path(top)
    while path != root and path.is_relative_to(root):
        os.chown(path, *owner, follow_symlinks=False)
        path = path.parent
