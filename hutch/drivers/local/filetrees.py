"""Trees of files a tenant made, walked and deleted however deep they go.

A sandbox's files (its upper layer, a checkpoint of it, an install layer's packages) are
shaped by the tenant: ``mkdir d; cd d`` 1,500 times is a tree Python's recursion cannot walk.
shutil.rmtree and os.walk recurse once per level (Python 3.11), and their RecursionError is
no OSError: it went through every ``except OSError`` and ``ignore_errors`` (a 500 on the
sandbox's metrics, a half-done restore, a trash and an install-layer sweep that stopped for
good). Here a walk keeps a list of directories still to read, and a deletion too deep for
rmtree goes with ``rm -rf``, which walks any depth.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)


def disk_bytes(path: Path) -> int:
    """Bytes ``path`` takes on disk (allocated blocks, links not followed), as ``du -s``.

    A walk with a list of directories still to read, not os.walk: that recurses once per
    level, and a tenant's directories nested past 1,000 (Python's recursion limit) made it
    raise RecursionError, which no ``except OSError`` catches (E2B's metrics were a 500)."""
    total = 0
    todo = [os.fspath(path)]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:  # removed meanwhile, or a name past PATH_MAX: os.walk skipped it too
            continue
        for entry in entries:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += entry.stat(follow_symlinks=False).st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
    return total


def delete_tree(path: Path) -> None:
    """Delete ``path`` and everything under it, however deep; links are never followed."""
    try:
        shutil.rmtree(path, onerror=rm_unreadable)
        return
    except RecursionError:
        pass  # deeper than Python recurses: rm walks any depth (and closes each level's fd)
    except OSError as err:  # e.g. EMFILE: rmtree holds a directory fd per level
        log.info("rmtree of %s failed (%s); trying rm -rf", path, err)
    if os.geteuid() != 0:  # rootless: a directory the sandbox made unreadable is ours to open up
        subprocess.run(["chmod", "-R", "u+rwx", "--", str(path)], capture_output=True, check=False)
    proc = subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0 or os.path.lexists(path):
        raise OSError(f"rm -rf {path} failed: {proc.stderr.strip()[-500:]}")


def rm_unreadable(func: Callable[..., object], path: str,
                  exc_info: tuple[type[BaseException], BaseException, TracebackType]) -> None:
    """rmtree's error handler: overlayfs leaves its ``work/work`` at mode 000, which only
    root can enter; rootless, we own it and may open it up first."""
    err = exc_info[1]
    if isinstance(err, FileNotFoundError):
        return
    if not isinstance(err, PermissionError):
        raise err
    os.chmod(os.path.dirname(path), 0o700)
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            shutil.rmtree(path, onerror=rm_unreadable)
        else:
            os.unlink(path)
