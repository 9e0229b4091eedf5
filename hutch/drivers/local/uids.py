"""The local driver's range of sandbox uids: host uids UID_BASE.. handed out one per
sandbox, minus those the host already uses (accounts, groups, rootless containers'
subordinate ranges) and those a process still runs as."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import pwd
import time
from pathlib import Path

from hutch.core.errors import DriverFailure
from hutch.drivers.local.smallfiles import get, put

# Sandbox users are host uids UID_BASE.. (overridable for hosts that use this range).
UID_BASE = int(os.environ.get("HUTCH_UID_BASE", "200000"))
UID_COUNT = 60_000
# Who holds which uid: host-wide, shared by every server on the host (see claim).
UID_REGISTRY = Path(os.environ.get("HUTCH_UID_REGISTRY", "/run/hutch/uids"))
# Which uid a sandbox dir holds: an extended attribute of the dir itself, not a file in it.
# A small attribute lives in the dir's own inode, and every inode a create allocates on this
# host's journal-less ext4 costs a scan past recently freed ones (spares.py, docs/idle.md).
# ``user.``: a rootless server may set it on its own dirs too; no sandbox can reach the dir.
UID_XATTR = "user.hutch.uid"
UID_FILE = "uid"  # where the uid is when the file system keeps no user attributes (or older dirs)


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


def claim(owner: Path) -> int:
    """Claim the next free uid of the range for ``owner`` (a sandbox dir).

    The registry is host-wide, not per data dir: two servers on one host must not
    hand the same uid to two sandboxes. Round robin, so a destroyed sandbox's uid
    rests before it is reused; a claim whose owner dir is gone is stale.
    """
    reg = UID_REGISTRY
    reg.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(reg / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        nxt_file = reg / ".next"
        try:
            text = get(nxt_file).decode().strip()
        except FileNotFoundError:
            text = ""
        nxt = int(text) if text.isdigit() else 0
        taken = host_ids()
        for i in range(UID_COUNT):
            uid = UID_BASE + (nxt + i) % UID_COUNT
            held = reg / str(uid)
            if held.exists():
                with contextlib.suppress(OSError):
                    if os.path.exists(get(held)):
                        continue
                if uid_running(uid):  # owner dir deleted under a live sandbox
                    continue
                held.unlink(missing_ok=True)
            if uid in taken:  # a real account, or handed to rootless containers
                continue
            put(held, str(owner).encode())
            put(nxt_file, str((nxt + i + 1) % UID_COUNT).encode())
            return uid
    raise DriverFailure("no free sandbox uid left")


def move_claim(uid: int, old: Path, new: Path) -> None:
    reg = UID_REGISTRY
    with open(reg / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held = reg / str(uid)
        with contextlib.suppress(OSError):
            if get(held).decode() != str(old):
                raise DriverFailure(f"uid {uid} is no longer claimed by {old}")
        put(held, str(new).encode())


def record(owner: Path, uid: int) -> None:
    """Note on ``owner`` (a sandbox dir) which uid it holds, for ``release``."""
    try:
        os.setxattr(owner, UID_XATTR, str(uid).encode())
    except OSError as err:
        if err.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        put(owner / UID_FILE, str(uid).encode())  # e.g. a tmpfs before Linux 6.6


def recorded(owner: Path) -> int:
    """The uid ``record`` noted on ``owner``; OSError or ValueError if none."""
    try:
        return int(os.getxattr(owner, UID_XATTR))
    except OSError:
        return int(get(owner / UID_FILE))  # written by an earlier server, or no attributes here


def held_by(owner: Path) -> int | None:
    """The uid ``owner`` recorded, if the registry still has it claimed for ``owner``."""
    with contextlib.suppress(OSError, ValueError):
        uid = recorded(owner)
        if get(UID_REGISTRY / str(uid)).decode() == str(owner):
            return uid
    return None


def release(owner: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        held = UID_REGISTRY / str(recorded(owner))
        if get(held).decode() == str(owner):
            os.unlink(held)
