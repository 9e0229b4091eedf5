"""Shared test configuration.

Backends are chosen per contract suite by fixture parameters; the production backends
(Kafka, PostgreSQL, Nomad) join those parameter lists in their own issues. A backend
whose service is missing fails its setup loudly: nothing here skips.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

RUNTIME_CACHE = Path(os.environ.get("HUTCH_RUNTIME_CACHE", "/var/cache/hutch/runtimes"))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d
