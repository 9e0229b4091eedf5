"""``hutch node reap``: end every sandbox an agent's data dir holds, with the agent stopped."""

from __future__ import annotations

from pathlib import Path

from hutch.drivers.local.driver import LocalDriver


async def reap(data_dir: Path, runtime_cache: Path) -> int:
    driver = LocalDriver(data_dir, runtime_cache)
    await driver.start()  # adopts what still runs there, as a restarted agent would
    try:
        alive = await driver.alive()
        for sid in alive:
            await driver.destroy(sid)
    finally:
        await driver.close()
    return len(alive)
