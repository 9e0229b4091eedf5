"""Shared test configuration.

Backends are chosen per contract suite by fixture parameters; the production backends
(Kafka, PostgreSQL, Nomad) join those parameter lists in their own issues. A backend
whose service is missing fails its setup loudly: nothing here skips.

The API tests (tests/api/conftest.py: ``driver_name`` x ``profile``) run on every driver and
both profiles unless a test says where it runs: ``@pytest.mark.runs_on("fake-embedded", ...)``
(on a test, or a module's ``pytestmark``), with the reason beside it. The usual places:
``WIRE``, ``STORE`` and ``REAL`` in tests/api/conftest.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

RUNTIME_CACHE = Path(os.environ.get("HUTCH_RUNTIME_CACHE", "/var/cache/hutch/runtimes"))
DRIVERS = ("fake", "local", "nomad")
PROFILES = ("embedded", "production")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``runs_on`` becomes one parametrization of (driver_name, profile), the pairs it names:
    placed as a ``parametrize`` mark, it takes precedence over the fixtures' own params."""
    mark = metafunc.definition.get_closest_marker("runs_on")
    if mark is None:
        return
    where = f"{metafunc.definition.nodeid}: runs_on{mark.args}"
    if not mark.args or not {"driver_name", "profile"} <= set(metafunc.fixturenames):
        raise pytest.UsageError(f"{where} names no pair, or the test uses no driver_name and profile")
    pairs = []
    for pair in mark.args:
        driver, _, profile = str(pair).partition("-")
        if driver not in DRIVERS or profile not in PROFILES:
            raise pytest.UsageError(f"{where}: {pair!r} is not <{'|'.join(DRIVERS)}>-<{'|'.join(PROFILES)}>")
        pairs.append((driver, profile))
    metafunc.definition.add_marker(pytest.mark.parametrize(("driver_name", "profile"), pairs, indirect=["profile"]))

