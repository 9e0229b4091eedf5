"""hutch as a package others depend on: an sdist and a wheel built from the tree, the wheel
installed into a fresh virtual environment (not this one), used there.

What a user gets from ``pip install hutch``: everything under the ``hutch`` namespace (no
top-level ``core``/``api``/… in site-packages to collide with other projects), the SDK, the CLI
and the embedded default, without the server's production dependencies; ``hutch[server]``
adds those. The venv commands run with PYTHON*/HUTCH_* stripped from the environment: with
this repository on PYTHONPATH pip answers "already satisfied" from the source tree and
installs nothing, and the test would pass on what it was meant to check.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("aiokafka", "asyncpg", "nomad", "asyncssh")
TOP_LEVEL = ("core", "api", "drivers", "projections", "eventlog", "blobs")

pytestmark = pytest.mark.timeout(900)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HUTCH_", "VIRTUAL_ENV"))}
    env.update(extra)
    return env


def _run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None,
         timeout: float = 600) -> str:
    out = subprocess.run([str(a) for a in args], cwd=cwd, env=env or _clean_env(), capture_output=True,
                         text=True, timeout=timeout, check=False)
    assert out.returncode == 0, f"{args} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An sdist built from the tree, and a wheel built from that sdist (as PyPI users get it)."""
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--sdist", "--outdir", out, ROOT)
    (sdist,) = out.glob("hutch-*.tar.gz")
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", out, sdist, cwd=out)
    (wheel,) = out.glob("hutch-*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, dists: tuple[Path, Path]) -> Path:
    """A fresh venv with the wheel installed (dependencies from the package index)."""
    root = tmp_path_factory.mktemp("venv")
    _run(sys.executable, "-m", "venv", root)
    _run(root / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", dists[1])
    return root


def test_the_wheel_holds_only_the_hutch_namespace_and_its_data(dists: tuple[Path, Path]) -> None:
    names = zipfile.ZipFile(dists[1]).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"hutch", "hutch-0.1.0.dist-info"}, tops
    for needed in ("hutch/py.typed", "hutch/sync.pyi", "hutch/core/models.py", "hutch/api/app.py",
                   "hutch/drivers/local/native/hutch-nsexec.c", "hutch/drivers/local/native/zygote.h",
                   "hutch/drivers/local/native/fileops.h",
                   "hutch/api/webapp/static/index.html"):
        assert needed in names, f"{needed} missing from the wheel"
    assert any(n.startswith("hutch/storage/migrations/") and n.endswith(".sql") for n in names)
    assert not any("/tests/" in n or n.startswith("tests/") for n in names)


def test_the_sdist_builds_the_same_package(dists: tuple[Path, Path]) -> None:
    with tarfile.open(dists[0]) as sdist:
        names = sdist.getnames()
    assert any(n.endswith("/hutch/core/models.py") for n in names)
    assert any(n.endswith("/pyproject.toml") for n in names)


def test_the_metadata_splits_client_and_server_dependencies(dists: tuple[Path, Path]) -> None:
    with zipfile.ZipFile(dists[1]) as wheel:
        meta = Parser().parsestr(wheel.read("hutch-0.1.0.dist-info/METADATA").decode())
    requires = meta.get_all("Requires-Dist") or []
    def name(requirement: str) -> str:  # "aiohttp<3.15,>=3.14" -> "aiohttp"
        return re.split(r"[<>=!~;\s]", requirement, maxsplit=1)[0]

    plain = sorted(name(r) for r in requires if "extra ==" not in r)
    server = sorted(name(r) for r in requires if "extra == \"server\"" in r)
    assert plain == ["aiohttp", "attrs", "cattrs", "pyyaml"]
    assert server == ["aiokafka", "asyncpg", "asyncssh", "cryptography", "python-nomad"]
    assert "server" in (meta.get_all("Provides-Extra") or [])
    # `hutch mcp`'s SDK (and its starlette and uvicorn) only with the mcp extra
    assert [r.split(";")[0].strip() for r in requires if "extra == \"mcp\"" in r] == ["mcp<3,>=2.3"]


@pytest.mark.isolation
def test_a_fresh_venv_imports_hutch_and_runs_a_sandbox(venv: Path, tmp_path: Path) -> None:
    python = venv / "bin" / "python"
    probe = (
        "import importlib.util, json, hutch, hutch.client, hutch.api.app, hutch.cli;"
        f"print(json.dumps({{'file': hutch.__file__,"
        f" 'tops': [m for m in {TOP_LEVEL!r} if importlib.util.find_spec(m)],"
        f" 'server': [m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m)]}}))"
    )
    import json
    seen = json.loads(_run(python, "-c", probe, cwd=tmp_path))
    assert seen["file"].startswith(str(venv)), seen  # the venv's copy, not the source tree
    assert seen["tops"] == [], f"top-level packages installed: {seen['tops']}"
    assert seen["server"] == [], f"server-only dependencies pulled into a client install: {seen['server']}"
    # The CLI from the wheel runs a command in a real sandbox on the embedded default.
    env = _clean_env(HUTCH_DATA_DIR=str(tmp_path / "data"))
    out = _run(venv / "bin" / "hutch", "run", "--", "sh", "-c", "echo from-the-wheel uid=$(id -u)",
               cwd=tmp_path, env=env, timeout=300)
    assert "from-the-wheel uid=" in out
    assert "uid=0" not in out, "the sandbox ran as root"


def test_the_server_extra_brings_the_production_adapters(venv: Path, dists: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{dists[1]}[server]")
    _run(python, "-c", "import aiokafka, asyncpg, nomad, asyncssh;"
         "import hutch.projections.postgres, hutch.drivers.nomad.driver, hutch.api.ssh_gateway",
         cwd=tmp_path)
