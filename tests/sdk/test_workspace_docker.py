"""The Workspace's docker backend against a real Docker engine (scripts/test starts one with
``./scripts/services start docker`` and exports its DOCKER_HOST; without one these tests fail,
never skip), its failure rows (no SDK, no engine), and what the workspace's own code can and
cannot reach. The document's failure table and the planted-symlink attacks run on it too
(tests/sdk/test_workspace.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hutch._workspace_docker import DISK, _engine_address
from hutch.workspace import Workspace, WorkspaceSnapshot
from tests.sdk.test_workspace import _git_repo, built_tree


def _state_dirs() -> set[Path]:
    """The backend's directories on this machine (a failed start must leave none)."""
    return set(Path(tempfile.gettempdir()).glob("hutch-docker-*"))


@pytest.fixture(scope="module")
def trees() -> None:
    for name in ("workspace:latest", "base:latest"):
        built_tree(name)


@pytest.fixture
def engine() -> Iterator[Any]:
    """The engine's client, to check what the backend did (no engine: fails, never skips)."""
    import docker

    client = docker.from_env()
    try:
        yield client
    finally:
        client.close()


def test_without_the_sdk_the_backend_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """The document's row: start() without the backend's deps throws ("dockerode is required")."""
    monkeypatch.setitem(sys.modules, "docker", None)  # as if `pip install hutch` had not brought it
    with pytest.raises(RuntimeError, match=r"needs the Docker SDK for Python .*pip install 'hutch\[docker\]'"):
        Workspace(backend="docker")


async def test_without_an_engine_start_says_where_and_how(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    before = _state_dirs()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    ws = Workspace(backend="docker")
    with pytest.raises(RuntimeError, match=r"no Docker engine answers at unix://.*/no-engine\.sock .*"
                                           r"\./scripts/services start docker.*DOCKER_HOST"):
        await ws.start()
    assert not ws.ready and not _state_dirs() - before
    monkeypatch.delenv("DOCKER_HOST")
    assert _engine_address() == "unix:///var/run/docker.sock (the default: DOCKER_HOST is not set)"


@pytest.mark.timeout(600)  # a fresh machine builds the runtime trees first (then cached)
async def test_a_docker_workspace_runs_every_language_confined(engine: Any, trees: None) -> None:
    async with Workspace(backend="docker", files={"app.js": "console.log(6 * 7)\n"}, env={"STAGE": "one"}) as ws:
        assert ws.ready and ws.runtime == "workspace:latest" and ws.id
        # Every language the document names, in one workspace; files both ways.
        assert (await ws.run("require('./app.js')")).stdout == "42\n"
        assert (await ws.run("import os; print(os.environ['STAGE'])", language="python")).stdout == "one\n"
        made = await ws.shell("mkdir out && echo from-shell > out/made.txt && pwd")
        assert made.stdout.strip().endswith("/home/agentuity") and await ws.read_file("out/made.txt") == "from-shell\n"
        await ws.write_file("mod.py", "def sq(x):\n    return x * x\n")
        assert (await ws.run("from mod import sq; print(sq(7))", language="python")).stdout == "49\n"
        # A timeout kills the command's tree: what it left in the background, and a child that
        # started its own session, not only the command.
        slow = await ws.shell("sleep 301 & setsid sleep 302 & sleep 303", timeout_seconds=1)
        assert (slow.timed_out, slow.exit_code) == (True, 124)
        assert "sleep 30" not in (await ws.shell("ps -eo args")).stdout
        # Confined as far as Docker allows: not root, no capability, no new privileges, a
        # read-only root, no network at all.
        status = (await ws.shell("id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; "
                                 "touch /usr/owned 2>&1; cat /proc/net/dev")).stdout
        assert status.splitlines()[0] != "0"
        assert "CapEff:\t0000000000000000" in status and "NoNewPrivs:\t1" in status
        assert "Read-only file system" in status
        assert [line.split(":")[0].strip() for line in status.splitlines() if ":" in line and "|" not in line
                and not line.startswith(("Cap", "NoNew", "touch"))] == ["lo"]
        offline = await ws.run("require('net').connect(53, '1.1.1.1').on('error', e => console.log(e.code))")
        assert offline.stdout.strip() in ("ENETUNREACH", "EHOSTUNREACH")
        config = engine.api.inspect_container(ws.id)["HostConfig"]
        assert (config["NetworkMode"], config["CapDrop"], config["Privileged"], config["ReadonlyRootfs"]) == \
            ("none", ["ALL"], False, True)
        assert config["Memory"] == 2 * 2**30 and config["PidsLimit"] == 1024
        # Every sandbox has a CPU limit (docs/security.md): before, none (NanoCpus 0, CpuQuota 0),
        # and the workspace's code took every core of the machine. What the kernel holds it to:
        quota = (await ws.shell("cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us "
                                "/sys/fs/cgroup/cpu/cpu.cfs_period_us")).stdout.split()
        assert config["NanoCpus"] == 10**9 and quota == ["100000", "100000"], (config["NanoCpus"], quota)
        assert "no-new-privileges" in config["SecurityOpt"]
        # And a disk bound: the workspace is a file system of DISK bytes (the attack: further down).
        size = int((await ws.shell("df -B1 --output=size . | tail -1")).stdout)
        assert DISK * 0.9 < size <= DISK and ws._dir is not None and ws._dir.is_mount(), size
        # Detach, reattach by the container's id (as a new process would), snapshot as files.
        cid, directory = ws.id, ws._dir
        await ws.detach()
        assert engine.containers.get(cid).status == "running" and directory is not None and directory.is_dir()
    again = Workspace(backend="docker", workspace_id=cid)
    await again.start()
    try:
        assert await again.read_file("out/made.txt") == "from-shell\n"
        assert (await again.run("console.log(require('fs').readFileSync('mod.py', 'utf8').length)")).stdout == "28\n"
        saved = (await again.snapshot()).to_dict()
        assert saved["backend"] == "docker" and saved["snapshotId"] is None and "mod.py" in saved["files"]
    finally:
        await again.close()
    import docker

    with pytest.raises(docker.errors.NotFound):
        engine.containers.get(cid)  # close() removed the container, its directory and its uid claim
    assert not directory.exists()
    home = await Workspace.resume(WorkspaceSnapshot.from_dict(saved), backend="unix-local")
    try:
        assert await home.read_file("out/made.txt") == "from-shell\n"
    finally:
        await home.close()
    with pytest.raises(ValueError, match="workspace_id: no docker workspace"):
        await Workspace(backend="docker", workspace_id=cid).start()


async def test_git_clones_land_in_the_container_without_a_network(tmp_path: Path, trees: None) -> None:
    """Clones run with the host's git into the bind mount before any of the workspace's code
    runs, so the container needs no network; what they made belongs to the container's user."""
    repo = _git_repo(tmp_path / "repo", {"README.md": "cloned\n"})
    clones = [{"url": f"file://{repo}", "dir": "src/lib"}]
    async with Workspace(backend="docker", language="shell", git_clones=clones) as ws:
        result = await ws.shell("cat src/lib/README.md && echo more >> src/lib/README.md && touch src/new && "
                                "git -C src/lib status --short")
        assert result.stdout == "cloned\n M README.md\n", result.stderr
        await ws.detach()
    # The next turn constructs it the same way: reattached, it is not cloned again.
    async with Workspace(backend="docker", language="shell", git_clones=clones, workspace_id=ws.id) as again:
        assert await again.read_file("src/lib/README.md") == "cloned\nmore\n"
    with pytest.raises(ValueError, match="outside the workspace"):
        async with Workspace(backend="docker", git_clones=[{"url": f"file://{repo}", "dir": "../x"}]):
            pass


async def test_the_workspaces_code_cannot_fill_the_hosts_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sandbox has a disk bound (docs/security.md): before, the workspace was a plain
    directory of the host's disk bind-mounted writable, and its code could fill that disk. Now
    it is a file system of DISK bytes: a write past it is ENOSPC inside, the host's disk keeps
    its room, and deleting makes room again. (A small bound here: the default's own size is
    checked in the test above.)"""
    import hutch._workspace_docker as backend

    built_tree("base:latest")
    bound = 64 * 2**20
    monkeypatch.setattr(backend, "DISK", bound, raising=False)
    async with Workspace(backend="docker", language="shell", runtime="base:latest") as ws:
        assert ws._dir is not None
        host = os.statvfs(ws._dir.parent.parent)  # the host file system the state directory is on
        before = host.f_bavail * host.f_frsize
        # Zeros written, not a sparse file: every block is taken.
        filled = await ws.shell(f"dd if=/dev/zero of=big bs=1M count={bound // 2**20 + 64} 2>&1; echo exit=$?; "
                                "df -B1 --output=size . | tail -1", timeout_seconds=300)
        out = filled.stdout
        assert "No space left on device" in out and "exit=1" in out, out
        assert int(out.split()[-1]) <= bound, out  # df shows the bound, not the host's disk
        host = os.statvfs(ws._dir.parent.parent)
        assert before - host.f_bavail * host.f_frsize < bound + 256 * 2**20, "the host lost more than the bound"
        # The host's own writes into the workspace meet the same bound, with a clear error.
        with pytest.raises(OSError, match="No space left on device"):
            await ws.write_file("more.txt", "x" * 2**20)
        freed = await ws.shell("rm big && echo room > after.txt && cat after.txt")
        assert freed.stdout == "room\n", freed
        # A host restart takes the mount, not the files: a reattach mounts the image again (and
        # restarts the container, which must not hold an older mount of the same file system).
        cid, directory = ws.id, ws._dir
        await ws.detach()
    await asyncio.to_thread(subprocess.run, ["umount", "-l", str(directory)], check=True)
    assert not directory.is_mount() and not (directory / "after.txt").exists()
    async with Workspace(backend="docker", language="shell", workspace_id=cid) as again:
        assert directory.is_mount() and await again.read_file("after.txt") == "room\n"
        assert (await again.shell("cat after.txt")).stdout == "room\n"


async def test_without_root_there_is_no_disk_bound_so_no_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop mount needs root: run as another user the backend refuses, naming why and what
    to use instead, and leaves nothing behind (it used to run with no disk bound)."""
    before = _state_dirs()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match=r"bounds the workspace's disk \(4096 MiB\) with a loop-mounted file "
                                           r"system, which needs root: .* backend 'sandbox'"):
        await Workspace(backend="docker", runtime="base:latest").start()
    assert not _state_dirs() - before


@pytest.mark.timeout(300)
async def test_the_image_is_imported_on_first_use_or_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, engine: Any,
        trees: None) -> None:
    import docker

    from hutch.drivers.local import rootfs

    for ref in ("hutch/base:latest", "hutch/python:3.14"):
        with contextlib.suppress(docker.errors.ImageNotFound):
            engine.images.remove(ref, force=True)
    with caplog.at_level(logging.WARNING, logger="hutch.workspace"):
        async with Workspace(backend="docker", language="shell", runtime="base:latest") as ws:
            assert (await ws.shell("echo hi")).stdout == "hi\n"
    said = caplog.text
    assert "importing runtime tree" in said and "as hutch/base:latest" in said and "imported hutch/base:latest" in said
    key = rootfs.cache_key(rootfs.lookup("base:latest"))
    assert engine.images.get("hutch/base:latest").labels["hutch.rootfs"] == key
    # No tree to import from (an empty runtime cache), no image: refused, naming the command.
    before = _state_dirs()
    monkeypatch.setenv("HUTCH_RUNTIME_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(RuntimeError, match=r"no image hutch/python:3\.14 .*build it with: hutch runtime build "
                                           r"python:3\.14$"):
        await Workspace(backend="docker", runtime="python:3.14").start()
    with pytest.raises(ValueError, match="runtime: unknown runtime 'cobol:1'"):
        await Workspace(backend="docker", runtime="cobol:1").start()
    assert not _state_dirs() - before  # nothing left behind


def test_the_service_script_leaves_the_firewall_alone(engine: Any) -> None:
    """scripts/services.d/docker.sh's engine adds no chain and no bridge (dockerd's defaults
    would, and set the FORWARD policy to DROP, which cuts the local driver's sandboxes off)."""
    if os.geteuid() != 0:
        pytest.fail("needs root to read the firewall (as scripts/test runs)")
    assert engine.ping()
    for table in ("filter", "nat"):
        rules = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True, check=True).stdout
        assert "DOCKER" not in rules, rules
    assert "docker0" not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
