"""The HTTP layer asks the service layer: a route calls ``engine.<collaborator>.<verb>``, never
the adapters the engine is composed of (``engine.parts``: log, store, projector, driver, roles,
output streams, blobs), and the engine forwards nothing, so there is one way to each verb.
The import-linter contract ``api-asks-service`` (pyproject.toml) holds the imports; this holds
the attribute reaches an import rule cannot see."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from hutch.service.engine import Engine

API = Path(__file__).resolve().parents[2] / "hutch" / "api"
# `engine.driver`, `request.app[ENGINE].store`, `self.engine.parts` …: however the engine is held.
REACH = re.compile(r"(?:\bengine|\[ENGINE\])\.(parts|log|store|projector|driver|roles|outputs|blobs)\b")


def test_the_api_never_reaches_past_the_engines_collaborators() -> None:
    files = sorted(API.rglob("*.py"))
    assert len(files) > 30  # the walk sees the package
    found = [f"{path.relative_to(API.parent)}:{n}: {line.strip()}"
             for path in files for n, line in enumerate(path.read_text().splitlines(), 1) if REACH.search(line)]
    assert found == []


def test_the_engine_forwards_nothing() -> None:
    own = {name for name, value in vars(Engine).items()
           if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}
    assert own == {"start", "close"}  # its lifetime; every verb is a collaborator's
