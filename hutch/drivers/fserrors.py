"""What a failed file primitive means to the caller, from the errno it failed with.

Shared by every driver that implements the file primitives, so the same mistake (a
missing parent, a directory where a file was expected, a non-empty directory) is the
same error with the same words whichever backend runs the sandbox.
"""

from __future__ import annotations

import errno
import os

from hutch.core.errors import FileNotFound, HutchError, InvalidInput, PayloadTooLarge


def named_path(message: str, num: int, default: str) -> str:
    """The path a failure of a two-path operation (mv) is about: its message says
    "<path>: <the system's words>"; ``default`` when it does not."""
    head, sep, _ = message.removeprefix("hutch-fs: ").rpartition(": " + os.strerror(num))
    return head if sep and head else default


def from_errno(op: str, path: str, num: int, message: str, sandbox_id: str) -> HutchError:
    """``op``: read, write, list, mkdir, rm, symlink; ``message``: the system's words."""
    if num == errno.ENOENT:
        if op in ("write", "mkdir", "symlink"):
            return FileNotFound(f"path: the directory of {path} does not exist", field="path")
        return FileNotFound(f"path: {path} does not exist in sandbox {sandbox_id}", field="path")
    if num == errno.EISDIR:
        if op == "rm":
            return InvalidInput(f"path: {path} is a directory; remove it as a directory", field="path")
        return InvalidInput(f"path: {path} is a directory", field="path")
    if num == errno.ENOTEMPTY:
        return InvalidInput(f"path: directory {path} is not empty; remove it recursively", field="path")
    if num == errno.ENOTDIR:
        if op == "rm":
            return InvalidInput(f"path: {path} is not a directory", field="path")
        return InvalidInput(f"path: {path}: {message}", field="path")
    if num == errno.EXDEV:
        return InvalidInput(f"path: {path} is on another filesystem of the sandbox; a rename cannot cross "
                            "filesystems (copy it instead)", field="path")
    if num == errno.EEXIST:
        return InvalidInput(f"path: {path} exists and is not a directory", field="path")
    if num == errno.EINVAL and op in ("read", "write"):
        return InvalidInput(f"path: {path} is not a regular file", field="path")
    if num in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return PayloadTooLarge(f"path: {path}: {message.partition(': ')[2] or message}")
    return InvalidInput(f"path: {path}: {message.partition(': ')[2] or message}", field="path")
