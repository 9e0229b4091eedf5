"""The catalog as data: the seeds' runtimes, their metadata, pins and recipe hashes. No root needed."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from hutch.core import runtimes
from hutch.core.errors import RuntimeNotFound
from hutch.drivers.local import rootfs

# The seeds' runtimes, the Workspace's default (every language it names in one runtime) and the
# code interpreter (issue 36: a Jupyter kernel per context behind E2B's interpreter protocol).
SEED_RUNTIMES = {"base:latest", "bun:1", "node:latest", "node:lts", "python:3.13", "python:3.14",
                 "claude-code:latest", "amp:latest", "opencode:latest", "workspace:latest", "code-interpreter"}


def test_the_seeds_runtimes_are_in_the_catalog_with_their_fields() -> None:
    by_name = {r.name: r for r in runtimes.CATALOG}
    assert set(by_name) == SEED_RUNTIMES
    assert runtimes.DEFAULT_RUNTIME == "base:latest"
    assert len({r.id for r in runtimes.CATALOG}) == len(runtimes.CATALOG)
    for r in runtimes.CATALOG:
        assert r.id.startswith("srt_") and runtimes.find(r.id) is r and runtimes.find(r.name) is r
        assert r.description and r.tags and r.icon_url and r.brand_color and r.url and r.readme
        assert r.requirements.memory and r.requirements.cpu and r.requirements.disk
        assert r.version_command and r.version_expect
    assert by_name["python:3.13"].version_expect == "Python 3.13"
    assert by_name["python:3.14"].version_expect == "Python 3.14"
    assert by_name["bun:1"].version_expect.startswith("1.")


def test_python_runtimes_carry_pip_and_uv() -> None:
    for name in ("python:3.13", "python:3.14"):
        r = runtimes.find(name)
        assert r is not None and "python3-pip" in r.packages and any(t.startswith("uv==") for t in r.pypi_tools)


def test_agent_runtimes_say_they_need_network_and_credentials() -> None:
    for r in runtimes.CATALOG:
        agent = "agent" in r.tags
        assert r.requirements.network_enabled is agent
        if agent:
            assert r.readme is not None and "network" in r.readme and "credentials" in r.readme
            assert r.npm_packages  # the CLI comes from npm


def test_recipe_hash_covers_what_changes_the_tree_and_nothing_else() -> None:
    base = runtimes.find("python:3.13")
    assert base is not None
    same = attrs.evolve(base, description="other", readme="other", tags=("x",), brand_color="#000000",
                        packages=tuple(reversed(base.packages)))
    assert same.recipe_hash == base.recipe_hash
    changed = [
        attrs.evolve(base, suite="sid"),
        attrs.evolve(base, packages=(*base.packages, "git")),
        attrs.evolve(base, pypi_tools=("uv==0.1.0",)),
        attrs.evolve(base, npm_packages=("left-pad@1.3.0",)),
        attrs.evolve(base, links=(("/usr/local/bin/py", "python3"),)),
        attrs.evolve(base, pypi_packages=("pandas==3.1.1",), python="3.13"),
        attrs.evolve(base, files=(("/usr/local/bin/hutch-interpreter", "hutch-interpreter"),)),
    ]
    hashes = {c.recipe_hash for c in changed} | {base.recipe_hash}
    assert len(hashes) == len(changed) + 1


def test_the_interpreter_runtime_is_rebuilt_when_its_program_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = runtimes.find("code-interpreter")
    assert recipe is not None and recipe.python == "3.13" and "ipykernel==7.4.0" in recipe.pypi_packages
    before = recipe.recipe_hash
    real = runtimes.runtime_file
    monkeypatch.setattr(runtimes, "runtime_file", lambda name: real(name) + b"# edited\n")
    assert recipe.recipe_hash != before


def test_a_debian_only_recipe_keeps_the_hash_it_had_before_extras_existed() -> None:
    # Builds cached before npm/PyPI extras existed stay valid (CI caches hold them).
    base = runtimes.find("base:latest")
    assert base is not None and base.recipe_hash == "2f4278e6c3f1dee5"


@pytest.mark.parametrize(("field", "value"), [
    ("npm_packages", ("left-pad",)),
    ("npm_packages", ("left-pad@^1.3.0",)),
    ("npm_packages", ("left-pad@latest",)),
    ("pypi_tools", ("uv",)),
    ("pypi_tools", ("uv>=0.5",)),
    ("pypi_packages", ("pandas",)),
    ("files", (("usr/bin/x", "hutch-interpreter"),)),
    ("links", (("usr/bin/x", "y"),)),
    ("links", (("/usr/../etc/x", "y"),)),
])
def test_unpinned_or_escaping_recipes_are_refused(field: str, value: object) -> None:
    base = runtimes.find("base:latest")
    assert base is not None
    with pytest.raises(ValueError, match=field):
        attrs.evolve(base, **{field: value})  # type: ignore[arg-type]  # the field is a parameter


def test_unknown_and_unbuilt_runtimes_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(RuntimeNotFound, match=r"unknown runtime 'ruby:3'.*known: base:latest"):
        rootfs.lookup("ruby:3")
    hint = f"node:lts is not built on this host; build it with: hutch runtime build node:lts --cache {tmp_path}"
    with pytest.raises(RuntimeNotFound, match=re.escape(hint)):
        rootfs.built_rootfs("node:lts", tmp_path)
    assert rootfs.build_hint("bun:1", rootfs.default_cache()) == "hutch runtime build bun:1"
