"""What idle sandboxes cost the host, and what their numbers cost each other (docs/idle.md,
issue 37).

A destroyed sandbox gives back the page cache charged to it. The kernel charges a page-cache page to the memory cgroup of whoever read it first, and a
removed memory cgroup lives on (dying) for as long as one of its pages is cached: with it
its per-cgroup kernel state, ~800 KiB a cgroup on a host that once ran 10,000 sandboxes.
A sandbox that is the first to read a file of its runtime would keep its cgroup alive
after its destroy; the driver reclaims the sandbox's charges before removing its cgroup.

Needs root and the base runtime (built by the session fixture); nothing here skips.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from hutch.drivers.base import ExecRequest, ResourceLimits
from hutch.drivers.local import rootfs
from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import (
    RUNTIME_CACHE,
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    new_id,
    provision,
)

pytestmark = pytest.mark.isolation

# Files of the base runtime no process keeps mapped (a mapped page cannot be dropped here).
CANDIDATES = ("usr/lib/x86_64-linux-gnu/libdb-5.3.so", "usr/lib/x86_64-linux-gnu/libapt-pkg.so.7.0.0")


def resident(path: Path) -> int:
    """Bytes of ``path`` in the host's page cache."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def uncached_runtime_file() -> Path:
    """A file of the base runtime, dropped from the page cache: the next reader is charged."""
    root = rootfs.rootfs_path(RUNTIME_CACHE, rootfs.lookup("base:latest"))
    for rel in CANDIDATES:
        path = root / rel
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        if resident(path) == 0:
            return path
    raise AssertionError(f"every candidate file stays cached (mapped by some process): {CANDIDATES}")


async def test_a_destroyed_sandbox_leaves_no_page_cache_charged_to_it(driver: LocalDriver) -> None:
    sid = await provision(driver, resources=ResourceLimits(memory_bytes=256 * 2**20))
    path = uncached_runtime_file()
    size = path.stat().st_size
    inside = "/" + str(path.relative_to(rootfs.rootfs_path(RUNTIME_CACHE, rootfs.lookup("base:latest"))))
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, ("cat", inside)), sink)
    assert result.exit_code == 0, sink.stderr
    assert resident(path) >= size // 2, "the sandbox's read should have cached the file"
    assert driver._cgroups is not None
    _, cached, _ = driver._cgroups.memory_now(sid)
    assert cached is not None and cached >= size // 2, f"the read was not charged to the sandbox: {cached} of {size} bytes"

    await driver.destroy(sid)

    # Reclaimed with the sandbox's memory: nothing cached is left charged to its cgroup.
    assert resident(path) == 0, f"{resident(path)} bytes of {inside} stay cached after the destroy"


async def test_the_pids_guard_reads_only_sandboxes_with_a_leaf(driver: LocalDriver,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Every live sandbox's pids.events each second made the guard's work grow with the idle
    # ones, which have no leaf it could end; a command's background process makes one.
    idle = [await provision(driver) for _ in range(3)]
    busy = await provision(driver)
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), busy, ("sh", "-c", "sleep 60 & exit 0")), sink)
    assert result.exit_code == 0, sink.stderr
    assert driver._cgroups is not None
    read: list[str] = []
    counted = driver._cgroups.fork_refusals
    monkeypatch.setattr(driver._cgroups, "fork_refusals", lambda sid: read.append(sid) or counted(sid))
    await asyncio.sleep(2.5)  # two guard periods, with room
    assert busy in read, read
    assert not set(read) & set(idle), read
