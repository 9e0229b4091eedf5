"""The sandbox-ended watch keeps its pidfds out of the server's own fd table: a fork copies
that table and the helper it starts closes every fd in it, so a pidfd per live sandbox there
made each helper the server starts (a launch, an exec) dearer the more sandboxes were alive
(bench: a Popen of `true` 1.4 ms with no pidfd, 6 ms with 10,000; docs/idle.md). The watch
still sees an init's exit (tests/isolation/test_local_ends_and_limits.py).

Needs root and the base runtime (built by the session fixture); nothing here skips.
"""

from __future__ import annotations

import contextlib
import os

import pytest

from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import (
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    provision,
)

pytestmark = pytest.mark.isolation


def pidfds() -> int:
    """pidfds in this process's (its main thread's) fd table."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd, closed meanwhile
            found += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]"
    return found


async def test_watched_inits_hold_no_fd_in_the_servers_table(driver: LocalDriver) -> None:
    before = pidfds()
    sids = [await provision(driver) for _ in range(4)]
    try:
        assert pidfds() == before, "a pidfd per sandbox in the table every fork copies"
    finally:
        for sid in sids:
            await driver.destroy(sid)
