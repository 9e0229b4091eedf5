"""The walls of every live hutch process of this host's network namespace, for the one installing.

The firewall's chains are one per network namespace and every process (a server, a node agent,
a CLI's engine, a test's server) rewrites them whole at its start, each with its own settings
(``HUTCH_SANDBOX_EGRESS_PERMIT``/``_DENY``, its subnet, its name servers). Written with the
installer's settings only, one process's start opened to every other process's sandboxes what
it permitted its own. So each installer records its walls here, and installs the union of the
walls of every process still alive: the strictest wins, and a permit holds only while no live
process denies it.

A record is ``<dir>/<pid>.json``, held under a shared ``flock`` by its process for as long as it
lives (the descriptor is never closed, and not inherited by children): a record nobody holds is
a dead process's and is removed. Callers hold ``network.host_firewall_lock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from pathlib import Path

import attrs

log = logging.getLogger("hutch.drivers.local")

ROOT = Path("/run/lock/hutch-firewall.d")

_held: int | None = None  # this process's record, locked for its life


@attrs.frozen
class Walls:
    denied: tuple[str, ...]  # CIDRs dropped from a sandbox with network
    subnets: tuple[str, ...]  # sandbox subnets (dropped too: no sandbox reaches another's address)
    nameservers: tuple[str, ...]  # DNS (udp/tcp 53) accepted before the drops


def _directory() -> Path:
    """Per network namespace: a node agent in its own namespace has chains of its own."""
    ino = os.stat("/proc/self/ns/net").st_ino
    path = ROOT / str(ino)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _record(own: Walls, directory: Path) -> None:
    global _held
    data = json.dumps(attrs.asdict(own)).encode()
    if _held is None:
        fd = os.open(directory / f"{os.getpid()}.json", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _held = fd
    os.ftruncate(_held, 0)
    os.pwrite(_held, data, 0)


def _others(directory: Path) -> list[Walls]:
    found = []
    for path in directory.glob("*.json"):
        if path.name == f"{os.getpid()}.json":
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its process lives
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    raw = json.loads(os.pread(fd, 1 << 20, 0))
                    found.append(Walls(*(tuple(str(v) for v in raw[k]) for k in ("denied", "subnets", "nameservers"))))
                continue
            path.unlink(missing_ok=True)  # nobody holds it: its process is gone
        finally:
            os.close(fd)
    return found


def _union(*lists: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v for values in lists for v in values))


def strictest(own: Walls) -> Walls:
    """Record this process's walls, and answer what to install: ``own`` plus every other live
    process's denials and subnets. Name servers are united too (each process's sandboxes keep
    their DNS)."""
    directory = _directory()
    _record(own, directory)
    others = _others(directory)
    walls = Walls(_union(own.denied, *(o.denied for o in others)), _union(own.subnets, *(o.subnets for o in others)),
                  _union(own.nameservers, *(o.nameservers for o in others)))
    if (narrowed := [c for c in walls.denied if c not in own.denied]):
        log.warning("another hutch process on this host denies %s to its sandboxes: denied to this one's too "
                    "(a permit holds only while no live process denies it)", ", ".join(narrowed))
    return walls
