"""The Driver contract, role by role: every backend passes these tests unchanged.

One class per role (drivers/roles.py). A required role's tests run on every backend; an
optional role's on the backends that play it (its class overrides the ``driver`` fixture), so
a new driver runs the classes of the roles it implements: ``-k "TestCommandRunner or
TestSandboxFiles"``. ``TestRolesAndCapabilities`` holds every backend's roles against its
capability flags: a flag is set only by a driver that plays its role, and where a flag is unset
the role's work is refused with NotSupported, whether the driver does not play the role or
cannot play it on this host (the local driver without a cgroup freezer).

Commands are kept to what a POSIX sandbox and the fake driver's interpreter both
understand (echo, cat, sleep, env, pwd, ``sh -c`` with ``;``, ``>&2``, ``>``, ``exit``,
``kill -N $$``).
"""

from __future__ import annotations

import asyncio
import gzip
import io
import os
import tarfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from hutch.core.errors import (
    FileNotFound,
    HutchError,
    IllegalTransition,
    InvalidInput,
    NotSupported,
    RuntimeNotFound,
    SandboxNotFound,
)
from hutch.drivers import roles
from hutch.drivers.base import (
    Driver,
    DriverRoles,
    ExecRequest,
    ExecResult,
    FileWrite,
    OutputSink,
    ProvisionRequest,
    ResourceLimits,
    TerminalRequest,
    Usage,
    WatchEnded,
)
from hutch.drivers.fake.driver import FakeDriver
from hutch.drivers.local.driver import LocalDriver
from hutch.drivers.node.driver import NodeDriver
from hutch.drivers.nomad.driver import NomadDriver
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    local_driver_fixture,
    new_id,
    node_agents,  # noqa: F401  (fixture)
    node_driver_fixture,
    nomad_driver_fixture,
    plugin_reads_page_cache,
    provision,
)

CLASSES: dict[str, type[Driver]] = {"fake": FakeDriver, "local": LocalDriver, "nomad": NomadDriver, "node": NodeDriver}
BACKENDS = list(CLASSES)


def playing(role: type) -> list[str]:
    """The backends whose driver plays ``role``: the ones its tests run on."""
    return [backend for backend, cls in CLASSES.items() if issubclass(cls, role)]


async def open_driver(request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
    if request.param == "fake":
        fake = FakeDriver()
        await fake.start()
        yield fake
        for sid in await fake.alive():
            await fake.destroy(sid)
        await fake.close()
        return
    if request.param == "nomad":
        async for nomad in nomad_driver_fixture(request):
            yield nomad
        return
    if request.param == "node":
        async for node in node_driver_fixture(request):
            yield node
        return
    async for local in local_driver_fixture(request):
        yield local


@pytest.fixture(params=BACKENDS)
async def driver(request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
    async for d in open_driver(request):
        yield d


@pytest.fixture
async def sandbox(driver: Driver) -> AsyncIterator[str]:
    sid = await provision(driver, env={"SANDBOX_VAR": "from-sandbox", "OVERRIDE": "sandbox"})
    yield sid
    await driver.destroy(sid)


@pytest.fixture
async def local(request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
    """The local driver alone: what only a backend with real processes can show."""
    async for d in local_driver_fixture(request):
        yield d


async def run(driver: Driver, sid: str, *argv: str, **kw: Any) -> tuple[ExecResult, Recorder]:
    """Run ``argv``; ``kw`` are further ExecRequest fields (stdin, env, cwd, ...)."""
    sink = Recorder()
    result = await driver.exec(ExecRequest(execution_id=new_id("ex"), sandbox_id=sid, argv=argv, **kw), sink)
    return result, sink


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


# -- required roles: every backend ------------------------------------------------------


class TestSandboxLifecycle:
    async def test_provisioned_sandbox_is_alive_until_destroyed(self, driver: Driver) -> None:
        sid = await provision(driver)
        assert sid in await driver.alive()
        await driver.destroy(sid)
        assert sid not in await driver.alive()

    async def test_destroy_is_idempotent_and_final(self, driver: Driver) -> None:
        sid = await provision(driver)
        await driver.destroy(sid)
        await driver.destroy(sid)
        await driver.destroy(new_id())  # never existed
        with pytest.raises(SandboxNotFound):
            await run(driver, sid, "true")


class TestRuntimeCatalog:
    async def test_base_runtime_is_available(self, driver: Driver) -> None:
        assert "base:latest" in driver.runtimes_available()

    async def test_unknown_runtime(self, driver: Driver) -> None:
        with pytest.raises(RuntimeNotFound):
            await provision(driver, runtime="cobol:1959")
        assert await driver.alive() == set()

    async def test_unbuilt_runtime_says_how_to_build(self, local: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
        from hutch.drivers.local import rootfs

        monkeypatch.setattr(rootfs, "is_built", lambda cache, recipe: False)
        with pytest.raises(RuntimeNotFound, match=r"hutch runtime build base:latest"):
            await provision(local)


class TestCommandRunner:
    async def test_stdout_stderr_and_exit_code(self, driver: Driver, sandbox: str) -> None:
        result, out = await run(driver, sandbox, "sh", "-c", "echo out; echo err >&2; exit 3")
        assert result == ExecResult(exit_code=3)
        assert out.stdout == "out\n"
        assert out.stderr == "err\n"

    @pytest.mark.parametrize(("argv", "code"), [(("true",), 0), (("false",), 1), (("sh", "-c", "exit 42"), 42)])
    async def test_exit_codes(self, driver: Driver, sandbox: str, argv: tuple[str, ...], code: int) -> None:
        result, _ = await run(driver, sandbox, *argv)
        assert result.exit_code == code
        assert not result.timed_out
        assert not result.cancelled
        assert not result.oom_killed

    async def test_killed_by_signal_is_128_plus_n(self, driver: Driver, sandbox: str) -> None:
        result, _ = await run(driver, sandbox, "sh", "-c", "kill -9 $$")
        assert result.exit_code == 137
        assert not result.cancelled

    async def test_unknown_command_is_127(self, driver: Driver, sandbox: str) -> None:
        result, out = await run(driver, sandbox, "no-such-command-xyz")
        assert result.exit_code == 127
        assert "no-such-command-xyz" in out.stderr

    async def test_stdin_is_delivered(self, driver: Driver, sandbox: str) -> None:
        result, out = await run(driver, sandbox, "cat", stdin=b"hello from stdin\n")
        assert result.exit_code == 0
        assert out.stdout == "hello from stdin\n"

    async def test_environment(self, driver: Driver, sandbox: str, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("HUTCH_SERVER_SECRET", "s3cret-must-not-leak")
        result, out = await run(driver, sandbox, "env", env={"EXEC_VAR": "from-exec", "OVERRIDE": "exec"})
        assert result.exit_code == 0
        env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        assert env["SANDBOX_VAR"] == "from-sandbox"
        assert env["EXEC_VAR"] == "from-exec"
        assert env["OVERRIDE"] == "exec"
        assert env["HOME"] == "/home/agentuity"
        assert env["USER"] == "agentuity"
        assert env["LANG"] == "C.UTF-8"
        assert "/usr/bin" in env["PATH"]
        assert "HUTCH_SERVER_SECRET" not in env
        assert "s3cret-must-not-leak" not in out.stdout

    async def test_working_directory(self, driver: Driver, sandbox: str) -> None:
        _, out = await run(driver, sandbox, "pwd")
        assert out.stdout == "/home/agentuity\n"
        _, out = await run(driver, sandbox, "pwd", cwd="/tmp")
        assert out.stdout == "/tmp\n"

    async def test_output_streams_while_running(self, driver: Driver, sandbox: str) -> None:
        result, out = await run(driver, sandbox, "sh", "-c", "echo first; sleep 1; echo second")
        done = time.monotonic()
        assert result.exit_code == 0
        assert out.stdout == "first\nsecond\n"
        first_arrival = out.chunks[0][2]
        assert out.chunks[0][1].startswith(b"first")
        assert done - first_arrival > 0.5, "the first line arrived only when the command ended"

    async def test_timeout_kills_and_reports(self, driver: Driver, sandbox: str) -> None:
        started = time.monotonic()
        result, _ = await run(driver, sandbox, "sleep", "30", timeout=0.5)
        assert result.timed_out
        assert result.exit_code == 124
        assert time.monotonic() - started < 5

    async def test_cancel(self, driver: Driver, sandbox: str) -> None:
        execution_id = new_id("ex")
        sink = Recorder()
        task = asyncio.create_task(driver.exec(ExecRequest(execution_id, sandbox, ["sleep", "30"]), sink))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await driver.cancel(execution_id)
        result = await asyncio.wait_for(task, 5)
        assert result.cancelled
        assert result.exit_code == 137
        assert time.monotonic() - started < 5
        await driver.cancel(execution_id)  # finished: a no-op
        # The sandbox is still usable.
        result, out = await run(driver, sandbox, "echo", "still here")
        assert (result.exit_code, out.stdout) == (0, "still here\n")

    async def test_concurrent_executions_keep_their_own_output(self, driver: Driver, sandbox: str) -> None:
        results = await asyncio.gather(*(run(driver, sandbox, "sh", "-c", f"sleep 0.2; echo {i}; exit {i}")
                                         for i in range(10)))
        for i, (result, out) in enumerate(results):
            assert (result.exit_code, out.stdout) == (i, f"{i}\n")

    async def test_large_output_arrives_intact(self, driver: Driver, sandbox: str) -> None:
        payload = bytes(range(256)) * 4096  # 1 MiB through stdin and back
        result, out = await run(driver, sandbox, "cat", stdin=payload)
        assert result.exit_code == 0
        assert b"".join(d for s, d, _ in out.chunks if s == "stdout") == payload

    async def test_files_persist_between_executions(self, driver: Driver, sandbox: str) -> None:
        result, _ = await run(driver, sandbox, "sh", "-c", "echo kept > kept.txt")
        assert result.exit_code == 0
        result, out = await run(driver, sandbox, "cat", "kept.txt")
        assert (result.exit_code, out.stdout) == (0, "kept\n")

    async def test_errors_are_hutch_errors(self, driver: Driver) -> None:
        with pytest.raises(HutchError):
            await run(driver, new_id(), "true")

    async def test_background_processes_persist_and_do_not_block(self, local: Driver) -> None:
        sid = await provision(local)
        started = time.monotonic()
        result, _ = await run(local, sid, "sh", "-c", "sleep 300 & echo $! > bg.pid")
        assert result.exit_code == 0
        assert time.monotonic() - started < 2, "exec waited for a background child"
        result, out = await run(local, sid, "sh", "-c", "kill -0 $(cat bg.pid) && echo alive")
        assert (result.exit_code, out.stdout) == (0, "alive\n")
        await local.destroy(sid)

    async def test_missing_working_directory_is_invalid_input(self, local: Driver) -> None:
        sid = await provision(local)
        with pytest.raises(InvalidInput, match="no-such-dir"):
            await run(local, sid, "pwd", cwd="/no-such-dir")
        await local.destroy(sid)


# -- optional roles: the backends that play them ----------------------------------------


class TestSandboxFiles:
    @pytest.fixture(params=playing(roles.SandboxFiles))
    async def driver(self, request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
        async for d in open_driver(request):
            yield d

    async def test_write_files_then_read_them(self, driver: Driver, sandbox: str) -> None:
        await driver.write_files(sandbox, [
            FileWrite("notes/deep/a.txt", b"relative to home\n"),
            FileWrite("/tmp/b.txt", b"absolute\n", mode=0o600),
        ])
        _, out = await run(driver, sandbox, "cat", "/home/agentuity/notes/deep/a.txt")
        assert out.stdout == "relative to home\n"
        _, out = await run(driver, sandbox, "cat", "/tmp/b.txt")
        assert out.stdout == "absolute\n"
        await driver.write_files(sandbox, [FileWrite("notes/deep/a.txt", b"overwritten\n")])
        _, out = await run(driver, sandbox, "cat", "notes/deep/a.txt")
        assert out.stdout == "overwritten\n"

    async def test_writing_a_python_source_drops_its_cached_bytecode(self, driver: Driver, sandbox: str) -> None:
        """Python trusts a .pyc while the source's mtime second and size match: a module rewritten
        within a second at the same size would run stale (drivers/bytecode.py)."""
        stale = ["pkg/__pycache__/mod.cpython-313.pyc", "pkg/__pycache__/mod.cpython-313.opt-1.pyc"]
        kept = ["pkg/__pycache__/other.cpython-313.pyc", "pkg/__pycache__/modx.cpython-313.pyc"]
        await driver.write_files(sandbox, [FileWrite(p, b"old") for p in stale + kept])
        await driver.write_files(sandbox, [FileWrite("pkg/mod.py", b"x = 1\n")])
        left = {e.name for e in await driver.list_files(sandbox, "pkg/__pycache__")}
        assert left == {"other.cpython-313.pyc", "modx.cpython-313.pyc"}
        await driver.write_files(sandbox, [FileWrite(p, b"old") for p in stale])
        await driver.write_file(sandbox, "pkg/mod.py", _chunks(b"x = 2\n"))
        left = {e.name for e in await driver.list_files(sandbox, "pkg/__pycache__")}
        assert left == {"other.cpython-313.pyc", "modx.cpython-313.pyc"}
        await driver.write_files(sandbox, [FileWrite("fresh/new.py", b"")])  # no cache there: no error

    async def test_sandboxes_do_not_share_files(self, driver: Driver, sandbox: str) -> None:
        await driver.write_files(sandbox, [FileWrite("mine.txt", b"one")])
        other = await provision(driver)
        try:
            result, _ = await run(driver, other, "cat", "mine.txt")
            assert result.exit_code != 0
        finally:
            await driver.destroy(other)

    async def test_a_listing_names_each_entrys_owner_and_group_as_the_sandbox_does(self, driver: Driver,
                                                                                    sandbox: str) -> None:
        await driver.write_files(sandbox, [FileWrite("owned/mine.txt", b"x")])
        _, user = await run(driver, sandbox, "id", "-un")
        _, group = await run(driver, sandbox, "id", "-gn")
        (entry,) = await driver.list_files(sandbox, "owned")
        assert (entry.owner, entry.group) == (user.stdout.strip(), group.stdout.strip()) != ("", "")
        if not isinstance(driver, FakeDriver):  # the fake has no root filesystem of its own
            root = {e.name: e for e in await driver.list_files(sandbox, "/")}
            assert (root["etc"].owner, root["etc"].group) == ("root", "root")

    async def test_rename_moves_a_file_or_a_tree_within_the_sandbox(self, driver: Driver, sandbox: str) -> None:
        await driver.write_files(sandbox, [FileWrite("old.txt", b"one"), FileWrite("tree/a/b.txt", b"two")])
        await driver.rename(sandbox, "old.txt", "moved/into/new.txt")  # the target's parents are made
        await driver.rename(sandbox, "tree", "deeper/tree2")
        _, out = await run(driver, sandbox, "cat", "moved/into/new.txt", "deeper/tree2/a/b.txt")
        assert out.stdout == "onetwo"
        assert {e.name for e in await driver.list_files(sandbox, ".")} >= {"moved"}
        for gone in ("old.txt", "tree"):
            with pytest.raises(FileNotFound):
                await driver.list_files(sandbox, gone)
        await driver.write_files(sandbox, [FileWrite("again.txt", b"three")])
        await driver.rename(sandbox, "again.txt", "moved/into/new.txt")  # a file replaces a file
        _, out = await run(driver, sandbox, "cat", "moved/into/new.txt")
        assert out.stdout == "three"

    async def test_rename_refuses_a_missing_source_and_a_directory_in_the_way(self, driver: Driver,
                                                                              sandbox: str) -> None:
        with pytest.raises(FileNotFound, match="nothing-here"):
            await driver.rename(sandbox, "nothing-here", "elsewhere")
        await driver.write_files(sandbox, [FileWrite("f.txt", b"x"), FileWrite("d/inside", b"y")])
        with pytest.raises(InvalidInput, match="path: d is a directory"):
            await driver.rename(sandbox, "f.txt", "d")
        _, out = await run(driver, sandbox, "cat", "f.txt", "d/inside")
        assert out.stdout == "xy"  # neither was touched

    async def test_a_destroyed_sandbox_takes_no_files(self, driver: Driver) -> None:
        sid = await provision(driver)
        await driver.destroy(sid)
        with pytest.raises(SandboxNotFound):
            await driver.write_files(sid, [FileWrite("x", b"")])


class TestDirectoryWatching:
    @pytest.fixture(params=playing(roles.DirectoryWatching))
    async def driver(self, request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
        async for d in open_driver(request):
            yield d

    async def test_changes_arrive_as_the_kernel_reports_them_and_none_late(self, driver: Driver,
                                                                         sandbox: str) -> None:
        await driver.mkdir(sandbox, "w/sub", parents=True)
        watch = await driver.watch_dir(sandbox, "w", recursive=False)
        try:
            await driver.write_file(sandbox, "w/a.txt", _chunks(b"one"))  # made 0600, then 0644, then written
            assert [(e.kind, e.name) for e in await watch.flush()] == [
                ("create", "a.txt"), ("chmod", "a.txt"), ("write", "a.txt")]
            await driver.rename(sandbox, "w/a.txt", "w/b.txt")
            await run(driver, sandbox, "sh", "-c", "chmod 600 w/b.txt; rm w/b.txt; echo x > w/sub/deep.txt")
            assert [(e.kind, e.name) for e in await watch.flush()] == [
                ("rename", "a.txt"), ("create", "b.txt"), ("chmod", "b.txt"), ("remove", "b.txt")]
            assert await watch.flush() == []  # nothing twice; below it is not watched
        finally:
            await watch.close()
        with pytest.raises(WatchEnded):
            await watch.flush()

    async def test_a_recursive_watch_follows_directories_made_later(self, driver: Driver, sandbox: str) -> None:
        await driver.mkdir(sandbox, "r/old", parents=True)
        watch = await driver.watch_dir(sandbox, "r", recursive=True)
        try:
            await driver.write_files(sandbox, [FileWrite("r/old/x", b"")])
            await driver.mkdir(sandbox, "r/new", parents=False)
            await driver.write_file(sandbox, "r/new/y", _chunks(b"y"))
            got = [(e.kind, e.name) for e in await watch.flush()]
            assert ("create", "old/x") in got and ("create", "new") in got and ("write", "new/y") in got
            assert got.index(("create", "new")) < got.index(("write", "new/y"))
        finally:
            await watch.close()

    async def test_a_directory_moved_in_under_a_recursive_watch_tells_what_it_holds(self, driver: Driver,
                                                                                    sandbox: str) -> None:
        """What a directory holds when it comes under a recursive watch (moved in whole here; a
        file made in a new directory before its own watch is added, in a race) had no event at
        all: it was made before the directory's watch existed. It is told as made (and written,
        a file with bytes) once the directory is watched."""
        await driver.mkdir(sandbox, "m/in", parents=True)
        await run(driver, sandbox, "sh", "-c", "mkdir -p staged/deep && echo y > staged/y && : > staged/deep/z")
        watch = await driver.watch_dir(sandbox, "m/in", recursive=True)
        try:
            await driver.rename(sandbox, "staged", "m/in/came")
            got = [(e.kind, e.name) for e in await watch.flush()]
            for told in (("create", "came"), ("create", "came/y"), ("write", "came/y"), ("create", "came/deep"),
                         ("create", "came/deep/z")):
                assert told in got, (told, got)
            assert ("write", "came/deep/z") not in got  # empty: made, never written
            assert got.index(("create", "came")) < got.index(("create", "came/y"))
        finally:
            await watch.close()

    async def test_a_watch_names_what_it_cannot_watch_and_ends_with_its_sandbox(self, driver: Driver) -> None:
        sid = await provision(driver)
        await driver.write_files(sid, [FileWrite("file.txt", b"")])
        with pytest.raises(FileNotFound, match="missing-dir"):
            await driver.watch_dir(sid, "missing-dir", recursive=False)
        with pytest.raises(InvalidInput, match=r"file\.txt"):
            await driver.watch_dir(sid, "file.txt", recursive=False)
        watch = await driver.watch_dir(sid, ".", recursive=True)
        await driver.destroy(sid)

        async def until_it_ends() -> None:
            async with asyncio.timeout(30):
                while True:
                    await watch.flush()

        with pytest.raises(WatchEnded):
            await until_it_ends()
        await watch.close()


class TestFileMetadata:
    @pytest.fixture(params=playing(roles.FileMetadata))
    async def driver(self, request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
        async for d in open_driver(request):
            yield d

    async def test_metadata_is_listed_replaced_cleared_and_moves_with_a_rename(self, driver: Driver,
                                                                             sandbox: str) -> None:
        await driver.write_files(sandbox, [FileWrite("m/a.txt", b"x"), FileWrite("m/plain.txt", b"y")])
        await driver.set_metadata(sandbox, "m/a.txt", {"author": "ann", "purpose": "test run"})
        listed = {e.name: e.metadata for e in await driver.list_files(sandbox, "m")}
        assert listed == {"a.txt": {"author": "ann", "purpose": "test run"}, "plain.txt": {}}
        await driver.set_metadata(sandbox, "m/a.txt", {"stage": "two"})  # replaces, not merges
        await driver.rename(sandbox, "m/a.txt", "m/b.txt")
        (moved,) = await driver.list_files(sandbox, "m/b.txt")
        assert moved.metadata == {"stage": "two"}
        await driver.set_metadata(sandbox, "m/b.txt", {})
        (cleared,) = await driver.list_files(sandbox, "m/b.txt")
        assert cleared.metadata == {}
        with pytest.raises(FileNotFound, match="m/none"):
            await driver.set_metadata(sandbox, "m/none", {"k": "v"})


class TestTreeTransfer:
    @pytest.fixture(params=playing(roles.TreeTransfer))
    async def driver(self, request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
        async for d in open_driver(request):
            yield d

    async def test_a_tree_goes_out_and_back_in_whole(self, driver: Driver, sandbox: str) -> None:
        await driver.write_files(sandbox, [
            FileWrite("tree/a.txt", b"alpha\n"),
            FileWrite("tree/deep/er/b.bin", bytes(range(256)) * 300, mode=0o600),
            FileWrite("tree/empty.txt", b""),
        ])
        await driver.symlink(sandbox, "tree/link", "deep/er/b.bin")
        await driver.mkdir(sandbox, "tree/hollow", parents=False)
        tar = b"".join([c async for c in driver.export_tar(sandbox, "tree")])
        with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
            members = {m.name.rstrip("/"): m for m in tf.getmembers()}
            assert set(members) == {"a.txt", "deep", "deep/er", "deep/er/b.bin", "empty.txt", "link", "hollow"}
            assert members["link"].issym() and members["link"].linkname == "deep/er/b.bin"
            assert members["hollow"].isdir() and members["deep/er/b.bin"].mode & 0o777 == 0o600
            f = tf.extractfile("deep/er/b.bin")
            assert f is not None and f.read() == bytes(range(256)) * 300
        one = b"".join([c async for c in driver.export_tar(sandbox, "tree/a.txt")])
        with tarfile.open(fileobj=io.BytesIO(one)) as tf:
            assert tf.getnames() == ["a.txt"]

        await driver.import_tar(sandbox, "copy/plain", _chunks(tar), gzipped=False)
        await driver.import_tar(sandbox, "copy/gz", _chunks(gzip.compress(tar)), gzipped=True)
        for dest in ("copy/plain", "copy/gz"):
            _, out = await run(driver, sandbox, "sh", "-c", f"cat {dest}/a.txt {dest}/link | wc -c; "
                               f"ls -d {dest}/hollow {dest}/empty.txt")
            assert out.stdout.split() == [str(6 + 256 * 300), f"{dest}/empty.txt", f"{dest}/hollow"], out.stdout
        names = {e.name for e in await driver.list_files(sandbox, "copy/gz/deep/er")}
        assert names == {"b.bin"}

    async def test_a_missing_tree_is_file_not_found(self, driver: Driver, sandbox: str) -> None:
        with pytest.raises(FileNotFound):
            await _drain(driver.export_tar(sandbox, "no/such/dir"))


class TestPausing:
    @pytest.fixture(params=playing(roles.Pausing))
    async def driver(self, request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
        async for d in open_driver(request):
            yield d

    async def test_pause_and_resume_follow_the_capability(self, driver: Driver, sandbox: str) -> None:
        if not driver.capabilities.pause:  # plays the role, but cannot here (no freezer)
            with pytest.raises(NotSupported):
                await driver.pause(sandbox)
            return
        await driver.pause(sandbox)
        await driver.pause(sandbox)  # idempotent
        if driver.capabilities.pause_running:  # a command started meanwhile is frozen with the rest
            late = asyncio.ensure_future(run(driver, sandbox, "echo", "late"))
            await asyncio.sleep(0.5)
            assert not late.done()
        else:
            with pytest.raises(IllegalTransition):
                await run(driver, sandbox, "true")
        await driver.resume(sandbox)
        await driver.resume(sandbox)
        if driver.capabilities.pause_running:
            result, out = await late
            assert (result.exit_code, out.stdout) == (0, "late\n")
        result, out = await run(driver, sandbox, "echo", "awake")
        assert (result.exit_code, out.stdout) == (0, "awake\n")

    async def test_a_pause_freezes_running_commands_or_says_it_cannot(self, driver: Driver, sandbox: str) -> None:
        """With ``pause_running`` a command is paused with its sandbox, its time limit standing
        still (paused past its 1.5 s limit, it ends well); without, the pause is refused, naming
        the driver, and the command runs on."""
        if not driver.capabilities.pause:
            return
        busy = asyncio.ensure_future(run(driver, sandbox, "sh", "-c", "sleep 1; echo done", timeout=1.5))
        await asyncio.sleep(0.3)
        if not driver.capabilities.pause_running:
            with pytest.raises(NotSupported, match=r"has commands running: the \w+ driver"):
                await driver.pause(sandbox)
            await busy
            return
        await driver.pause(sandbox)
        await asyncio.sleep(2.0)
        assert not busy.done()
        await driver.resume(sandbox)
        result, out = await busy
        assert (result.exit_code, result.timed_out, out.stdout) == (0, False, "done\n")

    async def test_a_filesystem_only_pause_follows_the_capability(self, driver: Driver, sandbox: str) -> None:
        """``pause(memory=False)``: every process ends (a running command as a cancel ends it),
        the files stay, and the resume is a new boot (a new boot id where the driver isolates
        with a kernel of namespaces). A driver without it refuses, naming the field, and its
        sandbox runs on (no quiet pause with the memory kept)."""
        if not driver.capabilities.pause_filesystem:
            with pytest.raises(NotSupported, match=f"{driver.name} driver cannot pause a sandbox filesystem-only") as no:
                await driver.pause(sandbox, memory=False)
            assert no.value.field == "memory"
            result, out = await run(driver, sandbox, "echo", "running")
            assert (result.exit_code, out.stdout) == (0, "running\n")
            return
        await driver.write_files(sandbox, [FileWrite("kept.txt", b"kept\n")])
        _, before = await run(driver, sandbox, "cat", "/proc/sys/kernel/random/boot_id")
        busy = asyncio.ensure_future(run(driver, sandbox, "sleep", "300"))
        await asyncio.sleep(0.3)
        await driver.pause(sandbox, memory=False)
        result, _ = await asyncio.wait_for(busy, 10)
        assert result.cancelled
        with pytest.raises(IllegalTransition, match="paused"):
            await run(driver, sandbox, "true")
        await driver.resume(sandbox)
        result, out = await run(driver, sandbox, "cat", "kept.txt")
        assert (result.exit_code, out.stdout) == (0, "kept\n")
        _, after = await run(driver, sandbox, "cat", "/proc/sys/kernel/random/boot_id")
        assert len(after.stdout.strip()) == 36 and after.stdout != before.stdout

    async def test_destroy_a_paused_sandbox(self, driver: Driver) -> None:
        sid = await provision(driver)
        if driver.capabilities.pause:
            await driver.pause(sid)
        await driver.destroy(sid)
        assert sid not in await driver.alive()


class TestNetworkRules:
    """update_network through each driver that plays it (the node driver over its agent); what
    the rules let through is tested from inside sandboxes in tests/adversarial/test_local_egress_rules.py."""

    @pytest.fixture(params=playing(roles.NetworkRules))
    async def driver(self, request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
        async for d in open_driver(request):
            yield d

    async def test_an_update_changes_only_a_network_the_sandbox_has(self, driver: Driver, sandbox: str) -> None:
        with pytest.raises(NotSupported, match="made without outbound network"):
            await driver.update_network(sandbox, enabled=True, allow=(), deny=())
        await driver.update_network(sandbox, enabled=False, allow=(), deny=())  # off: what it has
        sid = new_id()
        await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="base:latest", network_enabled=True))
        try:
            await driver.update_network(sid, enabled=True, allow=(), deny=("192.0.2.0/24",))
            await driver.update_network(sid, enabled=True, allow=("192.0.2.7/32",), deny=())
            with pytest.raises(InvalidInput, match="does not resolve"):
                await driver.update_network(sid, enabled=True, allow=("no-such-host.invalid",), deny=())
            result, out = await run(driver, sid, "echo", "still")
            assert (result.exit_code, out.stdout) == (0, "still\n")
        finally:
            await driver.destroy(sid)


class TestUsageReporting:
    """What a sandbox uses now, for E2B's metrics (api/e2b/metrics.py): read from the host,
    its limits as its totals. The nomad driver's page cache needs a current plugin on the
    client (docs/e2b.md), and every nomad sandbox has a memory and CPU limit."""

    @pytest.fixture(params=["local", "node", "nomad"])
    async def driver(self, request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
        async for d in open_driver(request):
            yield d

    async def test_memory_disk_and_cpus_now_within_the_limits(self, driver: Driver) -> None:
        limits = ResourceLimits(memory_bytes=256 * 2**20, cpu_millis=1500)
        sid = await provision(driver, resources=limits)
        reads_cache = True
        try:
            if isinstance(driver, NomadDriver):  # the page cache: where the plugin on the client says it
                reads_cache = await plugin_reads_page_cache(driver.running(sid).alloc_id)
            before = await driver.usage(sid, disk=True)
            result, _ = await run(driver, sid, "sh", "-c", "head -c 8388608 /dev/zero > $HOME/eight")
            assert result.exit_code == 0
            after = await driver.usage(sid, disk=True)
        finally:
            await driver.destroy(sid)
        assert (after.memory_total_bytes, after.cpu_count) == (256 * 2**20, 2)
        assert after.memory_bytes is not None and 0 < after.memory_bytes <= 256 * 2**20
        if reads_cache:
            assert after.memory_cache_bytes is not None and 0 <= after.memory_cache_bytes <= after.memory_bytes
        else:
            assert after.memory_cache_bytes is None  # never a stand-in
        assert before.disk_used_bytes is not None and after.disk_used_bytes is not None
        assert after.disk_used_bytes - before.disk_used_bytes >= 8 * 2**20  # the file it wrote
        assert after.disk_total_bytes is not None and after.disk_total_bytes > after.disk_used_bytes
        assert after.cpu_seconds is not None and after.cpu_seconds > 0

    async def test_without_limits_the_totals_are_the_machines(self, driver: Driver, sandbox: str) -> None:
        used = await driver.usage(sandbox)
        if isinstance(driver, NomadDriver):  # never unlimited: a sandbox that asks for none gets the defaults
            assert (used.memory_total_bytes, used.cpu_count) == (512 * 2**20, 1)
            assert (used.disk_used_bytes, used.disk_total_bytes) == (None, None)
            return
        # The node agents run on this machine too; the kernel's count of its pages, not /proc/meminfo.
        assert used.memory_total_bytes == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        assert used.cpu_count == len(os.sched_getaffinity(0))
        # Its disk only where asked: measuring it may walk every file the sandbox wrote.
        assert (used.disk_used_bytes, used.disk_total_bytes) == (None, None)


# -- every role against its capability flag: every backend -------------------------------

# The optional roles a flag stands for; UsageReporting and Adoption have none (a driver that
# does not play them reports nothing and hands nothing over).
ROLE_FLAGS: dict[type, str] = {
    roles.SandboxFiles: "files", roles.DirectoryWatching: "watches", roles.FileMetadata: "metadata",
    roles.TreeTransfer: "tar_streams", roles.Checkpointing: "checkpoints",
    roles.Pausing: "pause", roles.Terminals: "terminals", roles.PortForwarding: "ports",
    roles.NetworkRules: "network_update",
}


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    async for _ in chunks:
        pass


def _probes(by_role: DriverRoles, sid: str) -> dict[str, Callable[[], Awaitable[object]]]:
    """One call of each flagged role's work, by its flag."""
    return {
        "files": lambda: by_role.files.list_files(sid, "."),
        "watches": lambda: by_role.watches.watch_dir(sid, ".", recursive=False),
        "metadata": lambda: by_role.metadata.set_metadata(sid, ".", {}),
        "tar_streams": lambda: _drain(by_role.trees.export_tar(sid, ".")),
        "checkpoints": lambda: by_role.checkpointing.checkpoint(sid, new_id("cp")),
        "pause": lambda: by_role.pausing.pause(sid),
        "terminals": lambda: by_role.terminals.open_terminal(TerminalRequest(sid, ["true"])),
        "ports": lambda: by_role.ports.port_target(sid),
        "network_update": lambda: by_role.network.update_network(sid, enabled=False, allow=(), deny=()),
    }


class TestRolesAndCapabilities:
    async def test_a_capability_is_claimed_only_with_its_role(self, driver: Driver) -> None:
        for role, flag in ROLE_FLAGS.items():
            if getattr(driver.capabilities, flag):
                assert isinstance(driver, role), f"capabilities.{flag} is set, but {driver.name} does not play {role.__name__}"

    async def test_without_its_capability_a_role_refuses(self, driver: Driver, sandbox: str) -> None:
        probes = _probes(DriverRoles.of(driver), sandbox)
        assert set(probes) == set(ROLE_FLAGS.values())
        for flag, probe in probes.items():
            if not getattr(driver.capabilities, flag):
                with pytest.raises(NotSupported):
                    await probe()

    async def test_by_role_a_driver_is_itself_where_it_plays(self, driver: Driver) -> None:
        by_role = DriverRoles.of(driver)
        assert (by_role.lifecycle, by_role.runtimes, by_role.commands) == (driver, driver, driver)
        for field, role in zip(("files", "watches", "metadata", "trees", "checkpointing", "pausing", "terminals",
                                "ports", "network", "usage", "adoption", "fleet"), roles.OPTIONAL_ROLES, strict=True):
            assert (getattr(by_role, field) is driver) == isinstance(driver, role), field
        assert (by_role.name, by_role.capabilities) == (driver.name, driver.capabilities)

    async def test_reporting_roles_report_nothing_where_not_played(self, driver: Driver, sandbox: str) -> None:
        by_role = DriverRoles.of(driver)
        if isinstance(driver, roles.UsageReporting):
            assert isinstance(await by_role.usage.usage(sandbox), Usage)
        else:
            assert await by_role.usage.usage(sandbox) == Usage()
            assert by_role.usage.metrics() == []
        handle = by_role.adoption.handle(sandbox)
        if isinstance(driver, roles.Adoption):
            assert handle and all(isinstance(v, str) for v in handle.values())
        else:
            assert handle is None  # only this process can drive it
        node = by_role.fleet.node_of(sandbox)  # recorded with its start (lifecycle:started)
        if isinstance(driver, roles.NodeFleet):
            assert isinstance(node, str) and node
        else:
            assert node is None  # one machine: nothing to record


# -- the port itself, without a backend ----------------------------------------------------


class _Minimal(Driver):
    """A driver of the required roles only, as small as the port allows."""

    name = "minimal"

    def runtimes_available(self) -> set[str]:
        return {"base:latest"}

    async def provision(self, req: ProvisionRequest) -> None:
        pass

    async def destroy(self, sandbox_id: str) -> None:
        pass

    async def alive(self) -> set[str]:
        return set()

    async def exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult:
        return ExecResult(exit_code=0)

    async def cancel(self, execution_id: str) -> None:
        pass


async def test_a_driver_of_the_required_roles_refuses_the_others_by_name() -> None:
    by_role = DriverRoles.of(_Minimal())
    with pytest.raises(NotSupported, match="driver minimal cannot write files"):
        await by_role.files.write_files("sb", [FileWrite("x", b"")])
    with pytest.raises(NotSupported, match="driver minimal has no terminals"):
        await by_role.terminals.open_terminal(TerminalRequest("sb", ["sh"]))
    with pytest.raises(NotSupported, match="driver minimal cannot signal executions"):
        await by_role.commands.signal("ex", 15)


def test_a_role_listed_must_be_played_whole() -> None:
    class HalfPausing(roles.Pausing, _Minimal):
        async def pause(self, sandbox_id: str) -> None:
            pass

    with pytest.raises(TypeError, match="resume"):
        HalfPausing()  # type: ignore[abstract]


def test_a_driver_must_list_the_roles_whose_methods_it_defines() -> None:
    """Written against the one wide Driver, it would otherwise answer NotSupported in silence."""

    class Unlisted(_Minimal):
        async def pause(self, sandbox_id: str) -> None:
            pass

    with pytest.raises(TypeError, match="Unlisted defines pause of Pausing but does not list Pausing"):
        DriverRoles.of(Unlisted())
