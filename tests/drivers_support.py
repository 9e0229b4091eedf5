"""Fixtures and helpers shared by the driver contract suite and the isolation tests.

The local driver needs root and built runtimes. Both are prerequisites, not options:
when one is missing the test fails with a message saying what to do; nothing skips.
Runtimes are built (once, then cached) in ``$HUTCH_RUNTIME_CACHE`` (default
/var/cache/hutch/runtimes) so CI can cache that directory.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hutch.drivers.base import Driver, ProvisionRequest, ResourceLimits

RUNTIME_CACHE = Path(os.environ.get("HUTCH_RUNTIME_CACHE", "/var/cache/hutch/runtimes"))
TEST_RUNTIMES = ("base:latest", "python:3.13")


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("the local driver's tests need root (cgroups, overlay, a sandbox uid range); "
                    "run them as root, e.g. sudo ./scripts/test", pytrace=False)


@pytest.fixture(scope="session")
def built_runtimes() -> Path:
    """Build the runtimes the tests use (a no-op when cached)."""
    require_root()
    from hutch.drivers.local import rootfs

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    for name in TEST_RUNTIMES:
        rootfs.build(rootfs.lookup(name), RUNTIME_CACHE, log=log)
    return RUNTIME_CACHE


@pytest.fixture(scope="session")
def local_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One data dir per session so the native helper is compiled once.
    return tmp_path_factory.mktemp("hutch-local")


async def start_local(request: pytest.FixtureRequest) -> Driver:
    require_root()
    cache = request.getfixturevalue("built_runtimes")
    data = request.getfixturevalue("local_data_dir")
    from hutch.drivers.local.driver import LocalDriver

    driver = LocalDriver(data, cache)
    await driver.start()
    return driver


async def stop_local(driver: Driver) -> None:
    for sid in await driver.alive():
        await driver.destroy(sid)
    await driver.close()


async def local_driver_fixture(request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
    driver = await start_local(request)
    try:
        yield driver
    finally:
        await stop_local(driver)


def new_id(prefix: str = "sb") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def provision(driver: Driver, runtime: str = "base:latest", *, env: dict[str, str] | None = None,
                    resources: ResourceLimits | None = None) -> str:
    sid = new_id()
    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=runtime, env=env or {},
                                            resources=resources or ResourceLimits()))
    return sid


class Recorder:
    """An OutputSink that remembers every chunk and when it arrived."""

    def __init__(self) -> None:
        self.chunks: list[tuple[str, bytes, float]] = []

    def write(self, stream: str, data: bytes) -> None:
        self.chunks.append((stream, data, time.monotonic()))

    def text(self, stream: str = "stdout") -> str:
        return b"".join(d for s, d, _ in self.chunks if s == stream).decode(errors="replace")

    @property
    def stdout(self) -> str:
        return self.text("stdout")

    @property
    def stderr(self) -> str:
        return self.text("stderr")


# -- the nomad driver: a real Nomad + containerd (./scripts/services start nomad) -----------

NOMAD_ADDR = os.environ.get("HUTCH_NOMAD_ADDR", "http://127.0.0.1:4646")
NOMAD_REGISTRY = os.environ.get("HUTCH_NOMAD_REGISTRY", "127.0.0.1:5000")
NOMAD_TOKEN = os.environ.get("HUTCH_NOMAD_TOKEN")  # the dev agent runs with ACLs on


async def start_nomad(data_dir: Path, **kw: object) -> Driver:
    from hutch.blobs.files import FileBlobStore
    from hutch.core.errors import HutchError
    from hutch.drivers.nomad.driver import NomadDriver

    driver = NomadDriver(address=NOMAD_ADDR, data_dir=data_dir, registry=kw.pop("registry", NOMAD_REGISTRY),  # type: ignore[arg-type]
                         token=kw.pop("token", NOMAD_TOKEN),  # type: ignore[arg-type]
                         blobs=FileBlobStore(data_dir),  # disk checkpoints where the embedded profile keeps them
                         runtime_cache=RUNTIME_CACHE, **{k: v for k, v in kw.items() if k not in ("replica", "instance")})  # type: ignore[arg-type]
    if "instance" in kw:  # replicas whose data dirs have one path (/data in the Terraform module's jobs)
        driver.instance = str(kw["instance"])
    if "replica" in kw:  # which replica (of which deployment) it is, as app.py says before the start
        driver.set_replica(**kw["replica"])  # type: ignore[arg-type]
    try:
        await driver.start()
        # The runtimes the tests use, built and pushed on first use (once per registry).
        for name in TEST_RUNTIMES:
            if name not in driver.runtimes_available():
                await driver.build_runtime(name, lambda line: print(line, file=sys.stderr, flush=True))
    except HutchError as err:
        await driver.close()
        pytest.fail(f"the nomad driver's tests need Nomad, containerd and the registry running: {err.message}\n"
                    "start them with: ./scripts/services start nomad", pytrace=False)
    return driver


_PLUGIN_READS_CACHE: list[bool] = []  # asked once a run: the dev agent's plugin does not change under it


async def plugin_reads_page_cache(alloc_id: str) -> bool:
    """Whether the hutch-containerd plugin the dev agent runs says a task's page cache (its
    usage verb's memoryCacheBytes: containerd-driver/handle.go's cgroupUsage). A plugin built
    before it did runs until ``./scripts/services start nomad`` rebuilds it and restarts Nomad."""
    import json

    from hutch.drivers.nomad.client import NomadClient
    from hutch.drivers.nomad.execs import plugin_verb
    from hutch.drivers.nomad.jobs import TASK

    if _PLUGIN_READS_CACHE:
        return _PLUGIN_READS_CACHE[0]
    client = NomadClient(NOMAD_ADDR, token=NOMAD_TOKEN)
    await client.start()
    try:
        code, out = await plugin_verb(client, alloc_id, TASK, {"usage": True})
    finally:
        await client.close()
    assert code == 0, out
    _PLUGIN_READS_CACHE.append("memoryCacheBytes" in json.loads(out))
    return _PLUGIN_READS_CACHE[0]


async def nomad_driver_fixture(request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
    data = request.getfixturevalue("tmp_path") / "nomad-data"
    driver = await start_nomad(data)
    try:
        yield driver
    finally:
        for sid in await driver.alive():
            await driver.destroy(sid)
        await driver.close()


# -- the node driver: two `hutch node serve` agents on this host ---------------------------

NODE_SECRET = "node-secret-for-the-tests-0123456789abcdef"


class NodeAgents:
    """Agent processes, each with its own data dir, listening on loopback."""

    def __init__(self, root: Path, names: tuple[str, ...] = ("n1", "n2"), *, listen: str = "127.0.0.1",
                 secret: str = NODE_SECRET, env: dict[str, str] | None = None) -> None:
        import socket
        import subprocess

        self.root = root
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.addresses: dict[str, str] = {}
        self._argv: dict[str, list[str]] = {}
        self._env = {**os.environ, "HUTCH_NODE_SECRET": secret, "HUTCH_RUNTIME_CACHE": str(RUNTIME_CACHE), **(env or {})}
        for name in names:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            self._argv[name] = [sys.executable, "-m", "hutch", "node", "serve", "--name", name,
                                "--listen", f"{listen}:{port}", "--data-dir", str(root / name)]
            self.addresses[name] = f"127.0.0.1:{port}"
            self._spawn(name)
        for name in names:
            self._wait(name)

    def _spawn(self, name: str) -> None:
        import subprocess

        self.procs[name] = subprocess.Popen(self._argv[name], env=self._env, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True)

    def _wait(self, name: str) -> None:
        proc = self.procs[name]
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the agent says when it listens, or why it stopped
        if "listening" not in line:
            self.stop()
            pytest.fail(f"node agent {name} did not start: {line}{proc.stdout.read()}", pytrace=False)
        import threading

        # Its log goes on being read (to stderr): a full pipe would stop the agent.
        threading.Thread(target=self._relay, args=(name, proc.stdout), daemon=True).start()

    @staticmethod
    def _relay(name: str, stream: Any) -> None:
        with contextlib.suppress(ValueError, OSError), stream:  # until the agent exits
            for line in stream:
                print(f"[agent {name}] {line}", end="", file=sys.stderr)

    def kill(self, name: str) -> None:
        """kill -9: the agent dies, its sandboxes run on (as after a crash)."""
        proc = self.procs[name]
        proc.kill()
        proc.wait()

    def restart(self, name: str) -> None:
        """The same agent again: its address, its data dir (it adopts what still runs)."""
        self._spawn(name)
        self._wait(name)

    def reap(self) -> None:
        """After ``stop``: end whatever the agents left running (``hutch node reap``), such as
        the sandboxes of a node a test killed and never restarted, or of a test that failed."""
        import subprocess

        for name in self.procs:
            subprocess.run([sys.executable, "-m", "hutch", "node", "reap", "--data-dir", str(self.root / name)],
                           env=self._env, check=True, capture_output=True, timeout=120)

    @property
    def spec(self) -> str:
        return ",".join(f"{n}={a}" for n, a in self.addresses.items())

    def stop(self) -> None:
        import signal as signals

        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signals.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except Exception:
                proc.kill()
                proc.wait()


async def start_node(agents: NodeAgents, **kw: Any) -> Driver:
    from hutch.drivers.node.directory import StaticDirectory
    from hutch.drivers.node.driver import NodeDriver

    driver = NodeDriver(StaticDirectory(agents.spec), NODE_SECRET.encode(), **kw)
    await driver.start()
    return driver


@pytest.fixture(scope="module")
def node_agents(built_runtimes: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two agents shared by a module: what each test leaves, its own fixture destroys."""
    require_root()
    agents = NodeAgents(tmp_path_factory.mktemp("hutch-nodes"))
    yield agents
    agents.stop()


async def node_driver_fixture(request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
    driver = await start_node(request.getfixturevalue("node_agents"))
    try:
        yield driver
    finally:
        for sid in await driver.alive():
            await driver.destroy(sid)
        await driver.close()
