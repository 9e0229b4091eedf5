"""The local driver's range of sandbox uids: host uids UID_BASE.. handed out one per
sandbox, minus those the host already uses (accounts, groups, rootless containers'
subordinate ranges) and those a process still runs as."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import time
from pathlib import Path

# Sandbox users are host uids UID_BASE.. (overridable for hosts that use this range).
UID_BASE = int(os.environ.get("HUTCH_UID_BASE", "200000"))
UID_COUNT = 60_000


def uid_running(uid: int) -> bool:
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            for line in status.read_text().splitlines():
                if line.startswith("Uid:"):
                    if str(uid) in line.split()[1:]:
                        return True
                    break
    return False


_HOST_IDS: tuple[float, tuple[float, ...], set[int]] = (0.0, (), set())
_ACCOUNT_FILES = ("/etc/passwd", "/etc/group", "/etc/subuid", "/etc/subgid")


def host_ids() -> set[int]:
    """Uids of the range that are not ours to hand out: host accounts and groups, and
    ranges given to rootless containers. Read again when one of those files changes, and
    at least every 30 s (accounts may also come from NSS modules without a file): a
    lookup per claim cost ~0.7 ms (NSS opens half a dozen files per getpwuid here)."""
    global _HOST_IDS
    stamps = []
    for name in _ACCOUNT_FILES:
        try:
            stamps.append(os.stat(name).st_mtime)
        except OSError:
            stamps.append(0.0)
    read_at, seen, taken = _HOST_IDS
    if tuple(stamps) == seen and time.monotonic() - read_at < 30:
        return taken
    taken = subordinate_ids()
    taken.update(e.pw_uid for e in pwd.getpwall() if UID_BASE <= e.pw_uid < UID_BASE + UID_COUNT)
    taken.update(g.gr_gid for g in grp.getgrall() if UID_BASE <= g.gr_gid < UID_BASE + UID_COUNT)
    _HOST_IDS = (time.monotonic(), tuple(stamps), taken)
    return taken


def subordinate_ids() -> set[int]:
    """Uids handed to rootless containers (/etc/subuid, /etc/subgid): never ours."""
    taken: set[int] = set()
    for name in ("/etc/subuid", "/etc/subgid"):
        with contextlib.suppress(OSError):
            for line in Path(name).read_text().splitlines():
                parts = line.strip().split(":")
                if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                    start, count = int(parts[1]), int(parts[2])
                    lo, hi = max(start, UID_BASE), min(start + count, UID_BASE + UID_COUNT)
                    taken.update(range(lo, hi))
    return taken
