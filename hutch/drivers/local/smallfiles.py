"""Small files of the local driver's hot path (uid, meta.json, uid claims)."""

from __future__ import annotations

import os
from pathlib import Path


# Small files of the hot path through os calls: a third of the cost of pathlib's
# text-mode open (buffer, codec, isatty probe, seek) for a few dozen bytes. Rewritten in
# place, not truncated and not replaced through a temporary file: every new inode or
# block on this host's journal-less ext4 costs a scan past recently freed ones (see
# spares.py), and these files are rewritten with contents of about the same size.
def put(path: str | Path, data: bytes, mode: int = 0o600) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, mode)
    try:
        view, offset = memoryview(data), 0
        while offset < len(view):
            offset += os.pwrite(fd, view[offset:], offset)
        if os.fstat(fd).st_size > len(data):
            os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def get(path: str | Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)
