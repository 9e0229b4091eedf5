"""A destroyed sandbox's directory is renamed into the trash and deleted by a worker thread,
off the event loop (trash.py): deleting it on the loop took ~20 ms a destroy here and capped
a destroy-all at ~40 a second. What must hold all the same: the directory is gone from where
it was when the destroy returns, everything the sandbox wrote is deleted (however it made
it unreadable), nothing is left once the driver closes, and what a crashed server left in
the trash goes at the next start.

Needs root and the python:3.13 runtime (built by the session fixture); nothing here skips.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hutch.drivers.base import ExecRequest
from hutch.drivers.local.driver import LocalDriver
from hutch.drivers.local.trash import TRASH_DIR
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    new_id,
    provision,
    start_local,
)

pytestmark = pytest.mark.isolation

PY = "python:3.13"
# Many files, a directory the tenant made unreadable, one it made undeletable to its own user.
MESS = ("mkdir -p /workspace/many /workspace/locked/deep && for i in $(seq 300); do echo $i > /workspace/many/$i; done"
        " && echo secret > /workspace/locked/deep/f && chmod 000 /workspace/locked/deep /workspace/locked")


async def test_a_destroyed_sandbox_directory_is_gone_at_once_and_deleted_off_the_loop(driver: LocalDriver) -> None:
    sids = [await provision(driver, PY) for _ in range(4)]
    for sid in sids:
        done = await driver.exec(ExecRequest(new_id("ex"), sid, ("sh", "-c", MESS)), Recorder())
        assert done.exit_code == 0
    trash = driver.sandbox_root / TRASH_DIR
    await asyncio.gather(*(driver.destroy(sid) for sid in sids))
    for sid in sids:
        assert not (driver.sandbox_root / sid).exists()
    await driver._trash.drain()
    assert not list(trash.iterdir()), "the trash was not emptied"
    assert not [p for p in driver.sandbox_root.iterdir() if p.name in sids]


async def test_what_a_crashed_server_left_in_the_trash_goes_at_the_next_start(
        request: pytest.FixtureRequest, driver: LocalDriver) -> None:
    trash = driver.sandbox_root / TRASH_DIR
    left = trash / "sb-crashed.0"
    (left / "upper" / "workspace").mkdir(parents=True)
    (left / "upper" / "workspace" / "data").write_bytes(b"x" * 4096)
    (left / "work" / "work").mkdir(parents=True)
    (left / "work" / "work").chmod(0)
    await driver.close()
    again = await start_local(request)
    try:
        assert isinstance(again, LocalDriver)
        assert not left.exists(), "the next server kept an earlier server's trash"
        assert trash.is_dir()
    finally:
        await again.close()
    await driver.start()  # the fixture closes it again


def test_the_trash_is_in_the_sandbox_root(driver: LocalDriver) -> None:
    # On the sandboxes' own file system (a rename, never a copy) and root-only like it.
    trash = driver.sandbox_root / TRASH_DIR
    assert trash.stat().st_dev == driver.sandbox_root.stat().st_dev
    assert trash.stat().st_mode & 0o077 == 0
    assert Path(trash).parent == driver.sandbox_root


# Deeper than Python's recursion limit (1,000): shutil.rmtree recurses once per level.
DEEP = 1500


@pytest.fixture
def deep_cleanup(driver: LocalDriver) -> Iterator[None]:
    """What a server without the fix leaves in the trash goes after the test: pytest's own
    deletion of old temporary directories (shutil.rmtree) would die on it in every later
    session on this host."""
    yield
    trash = driver.sandbox_root / TRASH_DIR
    for left in trash.iterdir() if trash.is_dir() else ():
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(left)], check=False)
NEST = f"cd /workspace && python3 -c 'import os\nfor _ in range({DEEP}): os.mkdir(\"d\"); os.chdir(\"d\")'"


def _plant_deep(parent: Path, depth: int) -> None:
    """A chain of ``depth`` nested directories under ``parent``, made through directory fds
    (no path is longer than a name)."""
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)


@pytest.mark.usefixtures("deep_cleanup")
async def test_a_tenants_deep_directories_leave_nothing_in_the_trash(driver: LocalDriver) -> None:
    """A tenant nests directories deeper than shutil.rmtree can recurse: its sandbox's
    directory, and every other tenant's destroyed after it, is deleted all the same."""
    attacker = await provision(driver, PY)
    done = await driver.exec(ExecRequest(new_id("ex"), attacker, ("sh", "-c", NEST)), Recorder())
    assert done.exit_code == 0
    others = [await provision(driver, PY) for _ in range(3)]
    await driver.destroy(attacker)
    for sid in others:
        await driver.destroy(sid)
    await driver._trash.drain()
    trash = driver.sandbox_root / TRASH_DIR
    assert not list(trash.iterdir()), f"the trash kept {sorted(p.name for p in trash.iterdir())}"


@pytest.mark.usefixtures("deep_cleanup")
async def test_a_deep_tree_a_crashed_server_left_in_the_trash_does_not_stop_the_next_start(
        request: pytest.FixtureRequest, driver: LocalDriver) -> None:
    trash = driver.sandbox_root / TRASH_DIR
    left = trash / "sb-deep.0"
    left.mkdir()
    _plant_deep(left, DEEP)
    await driver.close()
    again = await start_local(request)  # raised RecursionError here before
    try:
        assert isinstance(again, LocalDriver)
        await again._trash.drain()
        assert not left.exists(), "the next server kept an earlier server's deep trash"
    finally:
        await again.close()
    await driver.start()  # the fixture closes it again
