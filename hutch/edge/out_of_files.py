"""The open-file limit a server process has: the bound on connections waiting for a request head
is a share of it (core/waiting.py, which makes no system call, is passed the number).
"""

from __future__ import annotations

import resource


def open_file_limit() -> int | None:
    """This process's soft limit on open files now (None: unlimited): the bound on connections
    waiting for a request head is a share of it (core/waiting.py, which makes no system call)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft
