"""A sandbox's usage on the local driver, read as a one-shot's end reads it (without its disk):
a few small cgroup files, read on the event loop. In a worker thread the read took 1.2 ms on a
quiet machine and 5-6 ms under load (bench/phases.py, "end: usage read"), most of it the thread
and the loop trading the GIL, while the next one-shot's request waited on the same loop.

Needs root and the python:3.13 runtime (built by the session fixture); nothing here skips.
"""

from __future__ import annotations

import asyncio

import pytest

from hutch.drivers.base import ExecRequest
from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    new_id,
    provision,
)

pytestmark = pytest.mark.isolation


async def test_usage_without_the_disk_is_read_with_no_loop_turn_and_counts_the_commands(
        driver: LocalDriver) -> None:
    sid = await provision(driver, "python:3.13")
    try:
        result = await driver.exec(ExecRequest(new_id("ex"), sid, ("python3", "-c", "sum(range(10**6))")), Recorder())
        assert result.exit_code == 0
        turns: list[str] = []
        asyncio.get_running_loop().call_soon(turns.append, "a loop turn")
        used = await driver.usage(sid)
        assert turns == []
        assert used.cpu_seconds is not None and used.cpu_seconds > 0.01  # the command's, at least
        assert used.memory_peak_bytes is not None and used.memory_peak_bytes > 2**20
        assert (used.disk_used_bytes, used.disk_total_bytes) == (None, None)
        with_disk = await driver.usage(sid, disk=True)  # a directory walk: still off the loop
        assert with_disk.disk_used_bytes is not None
    finally:
        await driver.destroy(sid)
