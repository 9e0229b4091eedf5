"""Reads and writes of cgroup files and directories, for hutch/drivers/local/cgroups.py: the
same on v1 and v2, kept apart from the hierarchy logic that decides what to read and write."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path


def write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def pids_below(path: Path) -> list[int]:
    """Processes in ``path`` and every cgroup below it."""
    found: list[int] = []
    for dirpath, _dirs, _files in os.walk(path):
        try:
            found += [int(p) for p in Path(dirpath, "cgroup.procs").read_text().split()]
        except OSError as err:  # gone, or removed between its open and its read (ENODEV)
            if err.errno not in (errno.ENOENT, errno.ENODEV):
                raise
    return found


def number(directory: Path | None, name: str, scale: float) -> float | None:
    if directory is None:
        return None
    try:
        return int((directory / name).read_text().split()[0]) * scale
    except (OSError, ValueError, IndexError):
        return None


def as_int(value: float | None) -> int | None:
    return None if value is None else int(value)


UNLIMITED_V1 = 2**62


def stat(directory: Path | None, name: str, key: str) -> int | None:
    """The ``key`` line of a flat-keyed cgroup file (memory.stat); None if it is not there."""
    if directory is None:
        return None
    with contextlib.suppress(OSError, ValueError):
        for line in (directory / name).read_text().splitlines():
            k, _, value = line.partition(" ")
            if k == key:
                return int(value)
    return None


def stats(directory: Path | None, name: str) -> dict[str, int]:
    """A flat-keyed cgroup file (memory.stat) as a dict; empty if it cannot be read."""
    found: dict[str, int] = {}
    if directory is None:
        return found
    with contextlib.suppress(OSError, ValueError):
        for line in (directory / name).read_text().splitlines():
            k, _, value = line.partition(" ")
            found[k] = int(value)
    return found


def oom_kill_count(memory_dir: str) -> int:
    """The OOM kills v1 counted in a memory cgroup (in the victim's own: not hierarchical)."""
    with open(f"{memory_dir}/memory.oom_control") as fh:
        text = fh.read()
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


def rmtree(path: Path) -> bool:
    """rmdir a cgroup and its children, deepest first. False if any still has processes.

    rmdir first: a leaf (the common case) needs no directory listing at all, and a
    cgroup directory lists dozens of control files.
    """
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError as err:
        if err.errno not in (errno.EBUSY, errno.ENOTEMPTY):
            raise
    try:
        children = [e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return True
    if not children:
        return False  # busy with processes
    ok = True
    for child in children:
        ok = rmtree(Path(child)) and ok
    return rmdir(path) and ok


def rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError as err:
        if err.errno in (errno.EBUSY, errno.ENOTEMPTY):
            return False
        raise
    return True
