"""Wire compatibility: the real ``@agentuity/core`` SandboxClient against a live ``hutch serve``.

Setup once (Node >= 20):  ``tests/compat/setup.sh``  (runs ``npm ci`` here).
Run:                      ``pytest -m compat tests/compat``

The Node side is ``compat.mjs``; it prints one line per check and ``N passed, M failed``.
The protocol it checks is written down in ``docs/wire.md``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.drivers_support import NODE_SECRET, NodeAgents, built_runtimes  # noqa: F401  (fixture)
from tests.leftovers import destroy_every_sandbox
from tests.services import drop_database, drop_topics, fresh_database, kafka_url

pytestmark = pytest.mark.compat

COMPAT_DIR = Path(__file__).resolve().parent
NODE_TIMEOUT_S = float(os.environ.get("HUTCH_COMPAT_TIMEOUT", "1200"))
READY_TIMEOUT_S = float(os.environ.get("HUTCH_COMPAT_READY_TIMEOUT", "120"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hutch_command() -> list[str]:
    beside = Path(sys.executable).with_name("hutch")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("hutch")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from hutch.cli import main; sys.exit(main())"]


def _tail(path: Path, lines: int = 80) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _wait_ready(proc: subprocess.Popen[bytes], url: str, key: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"hutch serve exited with {proc.returncode} before it was ready\n"
                f"--- server log ---\n{_tail(log)}"
            )
        req = urllib.request.Request(
            f"{url}/sandbox/runtimes", headers={"Authorization": f"Bearer {key}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                body = resp.read()
                if resp.status == 200 and json.loads(body).get("success") is True:
                    return
                last = f"HTTP {resp.status}: {body[:200]!r}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:200]!r}"
            exc.close()
        except (OSError, ValueError) as exc:
            last = repr(exc)
        time.sleep(0.2)
    pytest.fail(
        f"hutch serve not ready after {READY_TIMEOUT_S}s (GET /sandbox/runtimes: {last})\n"
        f"--- server log ---\n{_tail(log)}"
    )


def _stop(proc: subprocess.Popen[bytes], url: str, key: str) -> None:
    """Stop the server, after destroying what the test made (tests/leftovers.py)."""
    if proc.poll() is None:
        try:
            destroy_every_sandbox(url, key)
        finally:
            _terminate(proc)


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(params=["embedded", "production"])
def profile_flags(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """The server runs on both profiles; production uses the test Kafka broker and PostgreSQL."""
    if request.param == "embedded":
        yield []
        return
    store, database = asyncio.run(fresh_database("compat"))
    log = kafka_url("compat")
    yield ["--event-log", log, "--store", store]
    asyncio.run(drop_database(database))
    asyncio.run(drop_topics(log))


# Drivers with every primitive the extended checks use (files, env, jobs, pause/resume,
# snapshots): all of them now.
FULL_FEATURED_DRIVERS = ("local", "nomad")


@pytest.fixture(params=["local", "nomad"])
def driver_flags(request: pytest.FixtureRequest) -> list[str]:
    """Every driver a user can serve with (HUTCH_COMPAT_DRIVER narrows it to one)."""
    only = os.environ.get("HUTCH_COMPAT_DRIVER")
    return ["--driver", only or str(request.param)]


# Each real driver once and each profile once, as the API tests' REAL (tests/api/conftest.py):
# the drivers' differences are the contract suite's, the profiles' the system tests'.
@pytest.mark.parametrize(("driver_flags", "profile_flags"), [("local", "embedded"), ("nomad", "production")],
                         indirect=True, ids=["local-embedded", "nomad-production"])
@pytest.mark.timeout(NODE_TIMEOUT_S + READY_TIMEOUT_S + 60)
def test_agentuity_sandbox_client_against_live_server(
    tmp_path: Path, profile_flags: list[str], driver_flags: list[str]
) -> None:
    node_env = {}
    if driver_flags[-1] in FULL_FEATURED_DRIVERS:
        # files, setEnv, jobs, pause/resume + autoResumed through the real client too
        node_env["HUTCH_COMPAT_EXTENDED"] = "1"
    _serve_and_check(tmp_path, [*profile_flags, *driver_flags], {}, node_env)


@pytest.mark.timeout(NODE_TIMEOUT_S + READY_TIMEOUT_S + 60)
def test_agentuity_client_uses_a_runtime_the_server_builds_on_first_use(tmp_path: Path) -> None:
    """An empty runtime cache: the real client's run() and create() + execute() of base:latest,
    at once, wait for the server's first build of it (mmdebstrap, for real) and just work. Then
    the server's side (what tests/api/test_first_use_real.py checked with a second build of its
    own): the build's steps are the sandboxes' runtime:build events, the runtime is listed built
    with its size, and its second use is an ordinary create."""
    cache = tmp_path / "empty-runtime-cache"

    def server_side(url: str, key: str) -> None:
        def get(path: str) -> Any:
            req = urllib.request.Request(f"{url}{path}", headers={"Authorization": f"Bearer {key}"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read())["data"]

        made = get("/sandbox?includeDeleted=true&limit=100")["sandboxes"]
        steps = [e for sbx in made for e in get(f"/sandbox/sandboxes/{sbx['sandboxId']}/events?limit=100")["events"]
                 if e["type"] == "runtime:build"]
        assert steps, [sbx["sandboxId"] for sbx in made]
        base = {r["name"]: r for r in get("/sandbox/runtimes")["runtimes"]}["base:latest"]
        assert base["available"] is True and base["sizeBytes"] > 50 * 2**20 and base["builtAt"].endswith("Z"), base
        req = urllib.request.Request(f"{url}/sandbox", method="POST", data=json.dumps({
            "runtime": "base:latest", "command": {"exec": ["true"], "mode": "oneshot"}}).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.loads(resp.read())["data"]["status"] != "creating"

    _serve_and_check(tmp_path, ["--driver", "local"], {"HUTCH_RUNTIME_CACHE": str(cache)},
                     {"HUTCH_COMPAT_FIRST_USE": "base:latest", "HUTCH_COMPAT_ONLY": "first use"}, after=server_side)
    assert (cache / next(p.name for p in cache.iterdir() if p.name.startswith("base_latest-"))).is_dir()


def _as_member(url: str, bootstrap: str) -> dict[str, str]:
    """A member key of an organization other than the server's first, and its orgId."""
    def post(path: str, body: dict[str, object]) -> dict[str, object]:
        req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {bootstrap}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())["data"]

    post("/orgs", {"name": "compat"})
    member = post("/keys?orgId=org_compat", {"role": "member", "name": "compat-member"})
    return {"HUTCH_API_KEY": str(member["secret"]), "HUTCH_COMPAT_ORG_ID": "org_compat"}


@pytest.mark.parametrize("profile_flags", ["production"], indirect=True)
@pytest.mark.timeout(NODE_TIMEOUT_S + READY_TIMEOUT_S + 60)
def test_agentuity_client_as_a_member_through_node_agents(
    tmp_path: Path, built_runtimes: Path, profile_flags: list[str]  # noqa: F811  (fixture)
) -> None:
    """The node driver (docs/node.md): ``hutch serve --driver node`` on two ``hutch node
    serve`` agents of this host, production profile; the real client, given a member key of
    another organization than the server's first and that organization's orgId, passes every
    check, the extended ones too (tenancy, the agents and Kafka + PostgreSQL in one run: each
    was its own run of the whole suite before, each about 15 s)."""
    agents = NodeAgents(tmp_path / "nodes")
    try:
        _serve_and_check(tmp_path, ["--driver", "node", *profile_flags],
                         {"HUTCH_NODE_AGENTS": agents.spec, "HUTCH_NODE_SECRET": NODE_SECRET},
                         {"HUTCH_COMPAT_EXTENDED": "1"}, setup=_as_member)
    finally:
        agents.stop()


def _serve_and_check(tmp_path: Path, flags: list[str], server_env: dict[str, str],
                     checks_env: dict[str, str],
                     setup: Callable[[str, str], dict[str, str]] | None = None,
                     after: Callable[[str, str], None] | None = None) -> None:
    """``hutch serve`` with ``flags``, then compat.mjs against it; every check must pass."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node (>= 20) is not on PATH; the compat test needs it")
    if not (COMPAT_DIR / "node_modules" / "@agentuity" / "core" / "package.json").exists():
        pytest.fail(
            f"{COMPAT_DIR / 'node_modules'} is missing: run tests/compat/setup.sh "
            "(npm ci of the pinned @agentuity/core) before the compat tests"
        )

    key = "hk_compat_" + secrets.token_hex(16)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    log = tmp_path / "server.log"

    env = dict(os.environ)  # passes HUTCH_RUNTIME_CACHE (and PATH etc.) through
    env.update(server_env)
    env["HUTCH_API_KEY"] = key
    cmd = [
        *_hutch_command(),
        "serve",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--data-dir", str(data_dir),
        *flags,
    ]  # fmt: skip

    with log.open("wb") as log_fh:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        _wait_ready(proc, url, key, log)

        node_env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTUITY_")}
        node_env.update(HUTCH_URL=url, HUTCH_API_KEY=key, **checks_env)
        if setup is not None:
            node_env.update(setup(url, key))
        try:
            result = subprocess.run(
                [node, "compat.mjs"],
                cwd=COMPAT_DIR,
                env=node_env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=NODE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = (
                exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
            )
            pytest.fail(
                f"node compat.mjs did not finish in {NODE_TIMEOUT_S}s\n--- node output ---\n"
                f"{out or ''}\n--- server log ---\n{_tail(log)}"
            )
        if result.returncode != 0:
            pytest.fail(
                f"node compat.mjs exited {result.returncode}\n"
                f"--- node stdout ---\n{result.stdout}\n--- node stderr ---\n{result.stderr}\n"
                f"--- server log (tail) ---\n{_tail(log)}",
                pytrace=False,
            )
        print(result.stdout)
        last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
        assert last.endswith(" passed, 0 failed"), f"unexpected summary line: {last!r}"
        if after is not None:
            after(url, key)
    finally:
        _stop(proc, url, key)
