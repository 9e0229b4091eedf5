"""Which cgroup hierarchy this host gives the local driver: v1 (a hierarchy per controller,
with the freezer) or v2 (unified), read from ``/proc/self/mountinfo`` (cgroups.py)."""

from __future__ import annotations

from pathlib import Path

from hutch.drivers.local.cgroups import Cgroups, CgroupV1
from hutch.drivers.local.cgroups_v2 import CgroupV2


def detect(instance: str = "default") -> Cgroups | None:
    """The host's cgroups for the instance ``instance`` (one data directory's), or None."""
    found = _detect()
    if found is not None:
        found.instance = instance
    return found


def _detect() -> Cgroups | None:
    v1: dict[str, Path] = {}
    v2: Path | None = None
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            mountpoint = Path(left.split()[4])
            fstype, _source, options = right.split()[:3]
            if fstype == "cgroup":
                for opt in options.split(","):
                    if opt in ("memory", "cpu", "cpuacct", "pids", "freezer"):
                        v1.setdefault(opt, mountpoint)
            elif fstype == "cgroup2" and v2 is None:
                v2 = mountpoint
    if "freezer" in v1 and ("memory" in v1 or "pids" in v1 or "cpu" in v1):
        return CgroupV1(v1)
    if v2 is not None and (v2 / "cgroup.controllers").exists():
        available = set((v2 / "cgroup.controllers").read_text().split())
        return CgroupV2(v2, frozenset(available & {"memory", "cpu", "pids"}))
    return None
