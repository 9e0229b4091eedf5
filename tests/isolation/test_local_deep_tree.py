"""A tenant decides how deep its directories go: nesting 1,500 of them (``mkdir d; cd d`` in a
loop) must break nothing the server does with its files. shutil.rmtree and os.walk recurse
once per level (Python 3.11), and a RecursionError is no OSError: it went through every
``ignore_errors`` and ``except OSError``. Before: E2B's metrics of the sandbox (its disk
walked) were a 500, a checkpoint was copied and then failed, and a restore failed after it
had killed the sandbox's pid 1 and moved its files away (a dead, half-restored sandbox).

Needs root and the python:3.13 runtime (built by the session fixture); nothing here skips.
"""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Iterator
from typing import TypeVar

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
)

pytestmark = pytest.mark.isolation

PY = "python:3.13"
DEEP = 1500  # past Python's recursion limit (1,000); 3,000 characters of path, under PATH_MAX
NEST = (f"cd /workspace && python3 -c 'import os\nfor _ in range({DEEP}): os.mkdir(\"d\"); os.chdir(\"d\")\n"
        "open(\"bottom\", \"w\").write(\"x\" * 100000)'")
CHECK = f"cd /workspace && python3 -c 'import os\nfor _ in range({DEEP}): os.chdir(\"d\")\nprint(len(open(\"bottom\").read()))'"


T = TypeVar("T")


@pytest.fixture
def deep_cleanup(driver: LocalDriver) -> Iterator[None]:
    """What a server without the fix leaves (its trash could not delete it) goes after the
    test: pytest's own deletion of old temporary directories would die on it in every later
    session on this host."""
    yield
    trash = driver.sandbox_root / TRASH_DIR
    for left in trash.iterdir() if trash.is_dir() else ():
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(left)], check=False)


async def _step(what: str, step: Awaitable[T]) -> T:
    """``step``'s result; a RecursionError named as what failed (pytest cannot print its
    1,000-frame traceback: it dies in the report)."""
    try:
        return await step
    except RecursionError:
        pass
    pytest.fail(f"{what}: RecursionError", pytrace=False)


async def _run(driver: LocalDriver, sid: str, script: str) -> tuple[int, str]:
    out = Recorder()
    done = await driver.exec(ExecRequest(new_id("ex"), sid, ("sh", "-c", script)), out)
    return done.exit_code, out.stdout + out.text("stderr")


@pytest.mark.usefixtures("deep_cleanup")
async def test_a_deep_tree_breaks_no_disk_reading_checkpoint_or_restore(driver: LocalDriver) -> None:
    sid = await provision(driver, PY)
    try:
        code, said = await _run(driver, sid, NEST)
        assert code == 0, said
        used = await _step("usage", driver.usage(sid, disk=True))  # E2B's metrics: the layer's files walked
        assert used.disk_used_bytes is not None and used.disk_used_bytes >= 100_000, used
        await _step("checkpoint", driver.checkpoint(sid, "deep"))
        assert (await _step("sizes", driver.checkpoint_sizes(sid)))["deep"] >= 100_000
        code, said = await _run(driver, sid, "rm -rf /workspace/d && echo gone")
        assert code == 0, said
        await _step("restore", driver.restore(sid, "deep"))  # moves the current files away and deletes them
        code, said = await _run(driver, sid, CHECK)
        assert (code, said.strip()) == (0, "100000"), said
        await _step("checkpoint again", driver.checkpoint(sid, "again"))
        await _step("restore again", driver.restore(sid, "again"))  # the deep tree is now the one deleted
        code, said = await _run(driver, sid, CHECK)
        assert (code, said.strip()) == (0, "100000"), said
        await _step("delete", driver.delete_checkpoint(sid, "deep"))
        assert "deep" not in await _step("sizes", driver.checkpoint_sizes(sid))
    finally:
        await driver.destroy(sid)
        await driver._trash.drain()
