"""The HTTP layer asks the service layer: a route calls ``engine.<collaborator>.<verb>``, never
the adapters the engine is composed of (``engine.parts``: log, store, projector, driver, roles,
output streams, blobs), and the engine forwards nothing, so there is one way to each verb.
The import-linter contract ``api-asks-service`` (pyproject.toml) holds the imports; this holds
the attribute reaches an import rule cannot see. Below the engine, no service module takes the
whole ``Engine``: each collaborator is built with what it uses, so the engine stays the one
place that composes them (and no circle runs through it)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from hutch.service.engine import Engine
from tests import source_ast

API = Path(__file__).resolve().parents[2] / "hutch" / "api"
SERVICE = API.parent / "service"
COMPOSERS = {"engine.py", "composition.py"}  # the engine itself and what builds it
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


def _names_the_engine(path: Path) -> list[str]:
    """Lines of ``path`` that import hutch.service.engine (at run time or for type checking)
    or reach into an engine's parts."""
    found = []
    for node in ast.walk(source_ast.parse(path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        if "hutch.service.engine" in names:
            found.append(f"{path.name}:{node.lineno}: imports the engine")
    found += [f"{path.name}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
              if REACH.search(line)]
    return found


def test_no_service_module_takes_the_whole_engine() -> None:
    files = sorted(p for p in SERVICE.rglob("*.py") if p.name not in COMPOSERS)
    assert len(files) > 20  # the walk sees the package
    assert [line for path in files for line in _names_the_engine(path)] == []


def test_the_check_sees_an_engine_import_and_a_reach(tmp_path: Path) -> None:
    typed = tmp_path / "typed.py"
    typed.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hutch.service.engine import Engine\n")
    reach = tmp_path / "reach.py"
    reach.write_text("def f(engine):\n    return engine.parts.store\n")
    assert _names_the_engine(typed) == ["typed.py:3: imports the engine"]
    assert _names_the_engine(reach) == ["reach.py:2: return engine.parts.store"]
