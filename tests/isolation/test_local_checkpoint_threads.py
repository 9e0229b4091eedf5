"""A tenant's checkpoints of large sandboxes leave the server's worker threads to everyone else.

A checkpoint copies the sandbox's upper layer (`cp -a`), for as long as its files are large
(with no disk limit, as large as the host's disk allows). The copies ran in the event loop's
default executor (6 threads on 2 cores): a tenant checkpointing a few large sandboxes at once
took every thread, and the server's other work that waits for one (another tenant's create
with a network, file operations) waited behind the copies. They now run in threads of their
own (``checkpoints.COPIES_AT_ONCE``). The copy here stands in for a huge one: it waits."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import pytest

from hutch.drivers.local import checkpoints
from hutch.drivers.local.driver import LocalDriver
from tests.drivers_support import (
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    provision,
)

pytestmark = pytest.mark.isolation


async def test_long_checkpoint_copies_leave_the_default_executor_free(driver: LocalDriver,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    copying: list[Path] = []

    def huge_copy(src: Path, dst: Path) -> None:
        copying.append(dst)
        release.wait(60)

    monkeypatch.setattr(checkpoints, "copy_layer", huge_copy)
    sids = [await provision(driver) for _ in range(8)]  # more than the default executor's threads
    tasks = [asyncio.ensure_future(driver.checkpoint(sid, "big")) for sid in sids]
    try:
        for _ in range(200):
            if copying:
                break
            await asyncio.sleep(0.02)
        assert copying, "no checkpoint copy started"
        await asyncio.sleep(0.3)  # every copy that can start has
        # Another tenant's work in the loop's default executor (a create's network, a file op):
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "served"), 5) == "served"
    finally:
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sid in sids:
            with contextlib.suppress(Exception):
                await driver.destroy(sid)
