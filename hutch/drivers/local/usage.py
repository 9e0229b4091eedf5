"""What a local sandbox uses now and may use at most: its cgroup's memory, its writable
layer's disk, its CPU limit. Read from the host each time (no sampler runs in the
background): a few cgroup files, one statvfs and, without a disk limit, a walk of the
files the sandbox wrote."""

from __future__ import annotations

import math
import os
from pathlib import Path

from hutch.core.driver_types import Usage
from hutch.drivers.local import disks
from hutch.drivers.local.cgroups import Cgroups
from hutch.drivers.local.filetrees import disk_bytes
from hutch.drivers.local.state import LocalSandbox


def machine_memory() -> int | None:
    """The host's memory (MemTotal): what a sandbox without a memory limit may hold."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "MemTotal":
                return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine_cpus() -> int:
    """The CPUs this process may run on: what a sandbox without a CPU limit may use."""
    return len(os.sched_getaffinity(0))


def layer_disk(d: Path) -> tuple[int, int] | None:
    """(bytes used, bytes in all) of sandbox dir ``d``'s writable layer. On a disk limit its
    own file system says both; otherwise what the layer holds, on the host's file system."""
    try:
        if disks.attached(d):
            fs = os.statvfs(d / disks.MOUNT)
            return (fs.f_blocks - fs.f_bfree) * fs.f_frsize, fs.f_blocks * fs.f_frsize
        upper = (d / "upper").resolve()
        fs = os.statvfs(upper)
        return disk_bytes(upper), fs.f_blocks * fs.f_frsize
    except OSError:  # gone meanwhile (destroyed)
        return None


def measure(d: Path, sb: LocalSandbox, cgroups: Cgroups | None, *, disk: bool) -> Usage:
    """Blocking with ``disk`` (a directory walk): then call it off the loop."""
    cpu = peak = held = cache = limit = None
    if cgroups is not None:
        cpu, peak = cgroups.usage(sb.id)
        held, cache, limit = cgroups.memory_now(sb.id)
    used = layer_disk(d) if disk else None
    return Usage(cpu_seconds=cpu, memory_peak_bytes=peak, memory_bytes=held, memory_cache_bytes=cache,
                 # Without cgroups nothing holds the sandbox to a memory total (rlimits are per process).
                 # An idle sandbox's memory cgroup is made at its first command (cgroups.py): until
                 # then its limit is the record's.
                 memory_total_bytes=(limit or sb.memory_bytes or machine_memory()) if cgroups is not None else None,
                 cpu_count=math.ceil(sb.cpu_millis / 1000) if sb.cpu_millis else machine_cpus(),
                 disk_used_bytes=used[0] if used else None, disk_total_bytes=used[1] if used else None)
