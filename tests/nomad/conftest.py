"""The nomad driver against the real Nomad + containerd of ``./scripts/services start nomad``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hutch.drivers.nomad.driver import NomadDriver
from tests.drivers_support import start_nomad


@pytest.fixture
async def driver(tmp_path: Path) -> AsyncIterator[NomadDriver]:
    d = await start_nomad(tmp_path / "data")
    assert isinstance(d, NomadDriver)
    yield d
    for sid in list(d._sandboxes):
        await d.destroy(sid)
    await d.close()
