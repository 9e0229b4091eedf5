"""``core/`` does no I/O: no module in it imports a library that talks to disks, sockets,
processes or services, nor calls ``open``. The adapters that do live in ``eventlog/``,
``projections/``, ``drivers/`` and ``api/``, chosen by ``api.composition``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests import source_ast

CORE = Path(__file__).resolve().parents[2] / "hutch" / "core"
# Modules whose use is I/O or a system call (``resource``: a process's limits are read by its
# caller and passed in; ``os`` stays allowed: ``core.paths`` reads the environment, ``core.ids``
# draws random bytes).
IO_MODULES = {"aiohttp", "aiokafka", "asyncpg", "asyncssh", "nomad", "sqlite3", "socket", "subprocess",
              "shutil", "tempfile", "urllib.request", "http.client", "fcntl", "select", "selectors",
              "concurrent.futures", "io", "resource"}


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_core_imports_nothing_that_does_io_and_opens_no_file() -> None:
    found = []
    for path in sorted(CORE.rglob("*.py")):
        tree = source_ast.parse(path)
        for name in _imports(tree):
            if any(name == m or name.startswith(m + ".") for m in IO_MODULES):
                found.append(f"{path.relative_to(CORE.parent)} imports {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                found.append(f"{path.relative_to(CORE.parent)}:{node.lineno} calls open()")
    assert found == []
