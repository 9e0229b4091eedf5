"""One vocabulary: no two public classes in ``hutch`` share a name, so a name in a traceback,
a log line or a review says which thing it is (the SDK's ``Sandbox`` handle, the folded
``SandboxState``, the local driver's ``LocalSandbox``). Public: a top-level class whose name
and module path have no leading underscore (the SDK's private ``_executions.Executions`` may
share a name with ``service.executions.Executions``; neither is imported by that name)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests import source_ast

HUTCH = Path(__file__).resolve().parents[2] / "hutch"


def _public_classes() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(HUTCH.rglob("*.py")):
        rel = path.relative_to(HUTCH.parent)
        if any(part.startswith("_") and part != "__init__.py" for part in rel.parts):
            continue
        for node in source_ast.parse(path).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(str(rel))
    return found


def test_no_two_public_classes_share_a_name() -> None:
    classes = _public_classes()
    assert "SandboxState" in classes  # the walk sees the tree
    shared = {name: places for name, places in classes.items() if len(places) > 1}
    assert shared == {}


def test_the_old_public_sdk_names_still_import() -> None:
    from hutch import RunResult as ClientRunResult
    from hutch.workspace import CodeResult, RunResult

    assert RunResult is CodeResult and ClientRunResult is not CodeResult
