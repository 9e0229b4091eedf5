"""What the projector's unit tests share: a real SQLite log in a temporary file (``log``), and
a started Projector over it and the test module's own ``store`` fixture (``projector``): each
module makes its memory store wait or fail in its own way. Imported by name into each module
(the fixtures are named for the tests' arguments, so the imports shadow none of them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hutch.eventlog.sqlite import SqliteEventLog
from hutch.projections.memory import MemoryProjectionStore
from hutch.projections.runner import Projector


@pytest.fixture(name="log")
async def sqlite_log(tmp_path: Path) -> AsyncIterator[SqliteEventLog]:
    made = SqliteEventLog(tmp_path / "events.db")
    await made.start()
    yield made
    await made.close()


@pytest.fixture(name="projector")
async def started_projector(log: SqliteEventLog, store: MemoryProjectionStore) -> AsyncIterator[Projector]:
    made = Projector(log, store)
    await made.start()
    yield made
    await made.close()
