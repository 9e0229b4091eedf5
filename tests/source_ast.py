"""The repository's own source, parsed, for the tests that read its structure (layers, purity,
names). One parse retried: CPython 3.11 keeps the AST constructor's recursion depth in state
its threads share (python/cpython#106905, #106906), so a parse while another thread of the
test process builds an AST can fail with "AST constructor recursion depth mismatch" — seen
once in CI; the file itself was fine."""

from __future__ import annotations

import ast
from pathlib import Path


def parse(path: Path) -> ast.Module:
    source = path.read_text()
    try:
        return ast.parse(source, str(path))
    except SystemError as err:
        if "recursion depth mismatch" not in str(err):
            raise
        return ast.parse(source, str(path))
