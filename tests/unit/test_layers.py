"""The layer rules (pyproject.toml's [tool.importlinter] contracts) hold, and every import of
hutch names a real file where it points, as a tool that reads imports as stored sees them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests import source_ast

HUTCH = Path(__file__).resolve().parents[2] / "hutch"


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint) if lint.exists() else "lint-imports", "--no-cache"], capture_output=True,
                          text=True, cwd=HUTCH.parent, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_every_hutch_import_names_a_real_file_without_following_links() -> None:
    missing = []
    for path in HUTCH.rglob("*.py"):
        if any(part.is_symlink() for part in [path, *path.parents] if HUTCH in [*part.parents, part]):
            continue
        for node in ast.walk(source_ast.parse(path)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                if not name.startswith("hutch."):
                    continue
                parts = name.split(".")
                for n in range(len(parts), 1, -1):  # the longest prefix that is a module or package
                    target = HUTCH.parent.joinpath(*parts[:n])
                    if target.with_suffix(".py").is_file() or (target / "__init__.py").is_file():
                        if target.is_symlink() or target.with_suffix(".py").is_symlink():
                            missing.append(f"{path.relative_to(HUTCH.parent)}: {name} (through a link)")
                        break
                else:
                    missing.append(f"{path.relative_to(HUTCH.parent)}: {name}")
    assert not missing, "\n".join(missing)


def test_every_sdk_module_is_held_to_the_light_sdk_contract() -> None:
    """A new module directly under hutch/ is SDK (what `pip install hutch` users import) unless it
    is one of the named entry points or bridges, or the MCP server (held to a contract of its
    own, as it needs hutch[mcp]): it must be in the light-sdk contract's list."""
    import tomllib

    contracts = tomllib.loads((HUTCH.parent / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    light = next(c for c in contracts if c["id"] == "light-sdk")["source_modules"]
    mcp = next(c for c in contracts if c["id"] == "mcp-is-a-client")["source_modules"]
    not_sdk = {"__init__", "__main__", "_embedded", "_workspace_docker", "_workspace_e2b", *(m.removeprefix("hutch.") for m in mcp)}
    modules = {f"hutch.{p.stem}" for p in HUTCH.glob("*.py") if p.stem not in not_sdk}
    assert modules <= set(light), sorted(modules - set(light))
