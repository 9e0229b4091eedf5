"""The Driver contract: every backend passes these tests unchanged.

Commands are kept to what a POSIX sandbox and the fake driver's interpreter both
understand (echo, cat, sleep, env, pwd, ``sh -c`` with ``;``, ``>&2``, ``>``, ``exit``,
``kill -N $$``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hutch.core.errors import (
    HutchError,
    IllegalTransition,
    NotSupported,
    RuntimeNotFound,
    SandboxNotFound,
)
from hutch.drivers.base import Driver, ExecRequest, ExecResult, FileToWrite
from tests.drivers_support import (
    Recorder,
    built_runtimes,  # noqa: F401  (fixture)
    local_data_dir,  # noqa: F401  (fixture)
    local_driver_fixture,
    new_id,
    nomad_driver_fixture,
    provision,
)

BACKENDS = ["fake", "local", "nomad"]


@pytest.fixture(params=BACKENDS)
async def driver(request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
    if request.param == "fake":
        from hutch.drivers.fake.driver import FakeDriver

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
    async for local in local_driver_fixture(request):
        yield local


@pytest.fixture
async def sandbox(driver: Driver) -> AsyncIterator[str]:
    sid = await provision(driver, env={"SANDBOX_VAR": "from-sandbox", "OVERRIDE": "sandbox"})
    yield sid
    await driver.destroy(sid)


async def run(driver: Driver, sid: str, *argv: str, **kw: Any) -> tuple[ExecResult, Recorder]:
    """Run ``argv``; ``kw`` are further ExecRequest fields (stdin, env, cwd, ...)."""
    sink = Recorder()
    result = await driver.exec(ExecRequest(execution_id=new_id("ex"), sandbox_id=sid, argv=argv, **kw), sink)
    return result, sink


async def test_base_runtime_is_available(driver: Driver) -> None:
    assert "base:latest" in driver.runtimes_available()


async def test_provisioned_sandbox_is_alive_until_destroyed(driver: Driver) -> None:
    sid = await provision(driver)
    assert sid in await driver.alive()
    await driver.destroy(sid)
    assert sid not in await driver.alive()


async def test_stdout_stderr_and_exit_code(driver: Driver, sandbox: str) -> None:
    result, out = await run(driver, sandbox, "sh", "-c", "echo out; echo err >&2; exit 3")
    assert result == ExecResult(exit_code=3)
    assert out.stdout == "out\n"
    assert out.stderr == "err\n"


@pytest.mark.parametrize(("argv", "code"), [(("true",), 0), (("false",), 1), (("sh", "-c", "exit 42"), 42)])
async def test_exit_codes(driver: Driver, sandbox: str, argv: tuple[str, ...], code: int) -> None:
    result, _ = await run(driver, sandbox, *argv)
    assert result.exit_code == code
    assert not result.timed_out
    assert not result.cancelled
    assert not result.oom_killed


async def test_killed_by_signal_is_128_plus_n(driver: Driver, sandbox: str) -> None:
    result, _ = await run(driver, sandbox, "sh", "-c", "kill -9 $$")
    assert result.exit_code == 137
    assert not result.cancelled


async def test_unknown_command_is_127(driver: Driver, sandbox: str) -> None:
    result, out = await run(driver, sandbox, "no-such-command-xyz")
    assert result.exit_code == 127
    assert "no-such-command-xyz" in out.stderr


async def test_stdin_is_delivered(driver: Driver, sandbox: str) -> None:
    result, out = await run(driver, sandbox, "cat", stdin=b"hello from stdin\n")
    assert result.exit_code == 0
    assert out.stdout == "hello from stdin\n"


async def test_environment(driver: Driver, sandbox: str, monkeypatch: pytest.MonkeyPatch) -> None:
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


async def test_working_directory(driver: Driver, sandbox: str) -> None:
    _, out = await run(driver, sandbox, "pwd")
    assert out.stdout == "/home/agentuity\n"
    _, out = await run(driver, sandbox, "pwd", cwd="/tmp")
    assert out.stdout == "/tmp\n"


async def test_output_streams_while_running(driver: Driver, sandbox: str) -> None:
    result, out = await run(driver, sandbox, "sh", "-c", "echo first; sleep 1; echo second")
    done = time.monotonic()
    assert result.exit_code == 0
    assert out.stdout == "first\nsecond\n"
    first_arrival = out.chunks[0][2]
    assert out.chunks[0][1].startswith(b"first")
    assert done - first_arrival > 0.5, "the first line arrived only when the command ended"


async def test_timeout_kills_and_reports(driver: Driver, sandbox: str) -> None:
    started = time.monotonic()
    result, _ = await run(driver, sandbox, "sleep", "30", timeout=0.5)
    assert result.timed_out
    assert result.exit_code == 124
    assert time.monotonic() - started < 5


async def test_cancel(driver: Driver, sandbox: str) -> None:
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


async def test_concurrent_executions_keep_their_own_output(driver: Driver, sandbox: str) -> None:
    results = await asyncio.gather(*(run(driver, sandbox, "sh", "-c", f"sleep 0.2; echo {i}; exit {i}")
                                     for i in range(10)))
    for i, (result, out) in enumerate(results):
        assert (result.exit_code, out.stdout) == (i, f"{i}\n")


async def test_large_output_arrives_intact(driver: Driver, sandbox: str) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB through stdin and back
    result, out = await run(driver, sandbox, "cat", stdin=payload)
    assert result.exit_code == 0
    assert b"".join(d for s, d, _ in out.chunks if s == "stdout") == payload


async def test_write_files_then_read_them(driver: Driver, sandbox: str) -> None:
    await driver.write_files(sandbox, [
        FileToWrite("notes/deep/a.txt", b"relative to home\n"),
        FileToWrite("/tmp/b.txt", b"absolute\n", mode=0o600),
    ])
    _, out = await run(driver, sandbox, "cat", "/home/agentuity/notes/deep/a.txt")
    assert out.stdout == "relative to home\n"
    _, out = await run(driver, sandbox, "cat", "/tmp/b.txt")
    assert out.stdout == "absolute\n"
    await driver.write_files(sandbox, [FileToWrite("notes/deep/a.txt", b"overwritten\n")])
    _, out = await run(driver, sandbox, "cat", "notes/deep/a.txt")
    assert out.stdout == "overwritten\n"


async def test_writing_a_python_source_drops_its_cached_bytecode(driver: Driver, sandbox: str) -> None:
    """Python trusts a .pyc while the source's mtime second and size match: a module rewritten
    within a second at the same size would run stale (drivers/bytecode.py)."""
    stale = ["pkg/__pycache__/mod.cpython-313.pyc", "pkg/__pycache__/mod.cpython-313.opt-1.pyc"]
    kept = ["pkg/__pycache__/other.cpython-313.pyc", "pkg/__pycache__/modx.cpython-313.pyc"]
    await driver.write_files(sandbox, [FileToWrite(p, b"old") for p in stale + kept])
    await driver.write_files(sandbox, [FileToWrite("pkg/mod.py", b"x = 1\n")])
    left = {e.name for e in await driver.list_files(sandbox, "pkg/__pycache__")}
    assert left == {"other.cpython-313.pyc", "modx.cpython-313.pyc"}
    await driver.write_files(sandbox, [FileToWrite(p, b"old") for p in stale])
    await driver.write_file(sandbox, "pkg/mod.py", _chunks(b"x = 2\n"))
    left = {e.name for e in await driver.list_files(sandbox, "pkg/__pycache__")}
    assert left == {"other.cpython-313.pyc", "modx.cpython-313.pyc"}
    await driver.write_files(sandbox, [FileToWrite("fresh/new.py", b"")])  # no cache there: no error


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def test_files_persist_between_executions(driver: Driver, sandbox: str) -> None:
    result, _ = await run(driver, sandbox, "sh", "-c", "echo kept > kept.txt")
    assert result.exit_code == 0
    result, out = await run(driver, sandbox, "cat", "kept.txt")
    assert (result.exit_code, out.stdout) == (0, "kept\n")


async def test_sandboxes_do_not_share_files(driver: Driver, sandbox: str) -> None:
    await driver.write_files(sandbox, [FileToWrite("mine.txt", b"one")])
    other = await provision(driver)
    try:
        result, _ = await run(driver, other, "cat", "mine.txt")
        assert result.exit_code != 0
    finally:
        await driver.destroy(other)


async def test_destroy_is_idempotent_and_final(driver: Driver) -> None:
    sid = await provision(driver)
    await driver.destroy(sid)
    await driver.destroy(sid)
    await driver.destroy(new_id())  # never existed
    with pytest.raises(SandboxNotFound):
        await run(driver, sid, "true")
    with pytest.raises(SandboxNotFound):
        await driver.write_files(sid, [FileToWrite("x", b"")])


async def test_unknown_runtime(driver: Driver) -> None:
    with pytest.raises(RuntimeNotFound):
        await provision(driver, runtime="cobol:1959")
    assert await driver.alive() == set()


async def test_errors_are_hutch_errors(driver: Driver) -> None:
    with pytest.raises(HutchError):
        await run(driver, new_id(), "true")


# -- backends with real processes ---------------------------------------------------


@pytest.fixture
async def local(request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
    async for d in local_driver_fixture(request):
        yield d


async def test_background_processes_persist_and_do_not_block(local: Driver) -> None:
    sid = await provision(local)
    started = time.monotonic()
    result, _ = await run(local, sid, "sh", "-c", "sleep 300 & echo $! > bg.pid")
    assert result.exit_code == 0
    assert time.monotonic() - started < 2, "exec waited for a background child"
    result, out = await run(local, sid, "sh", "-c", "kill -0 $(cat bg.pid) && echo alive")
    assert (result.exit_code, out.stdout) == (0, "alive\n")
    await local.destroy(sid)


async def test_unbuilt_runtime_says_how_to_build(local: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    from hutch.drivers.local import rootfs

    monkeypatch.setattr(rootfs, "is_built", lambda cache, recipe: False)
    with pytest.raises(RuntimeNotFound, match=r"hutch runtime build base:latest"):
        await provision(local)


async def test_pause_and_resume_follow_the_capability(driver: Driver, sandbox: str) -> None:
    if not driver.capabilities.pause:
        with pytest.raises(NotSupported):
            await driver.pause(sandbox)
        return
    await driver.pause(sandbox)
    await driver.pause(sandbox)  # idempotent
    with pytest.raises(IllegalTransition):
        await run(driver, sandbox, "true")
    await driver.resume(sandbox)
    await driver.resume(sandbox)
    result, out = await run(driver, sandbox, "echo", "awake")
    assert (result.exit_code, out.stdout) == (0, "awake\n")


async def test_destroy_a_paused_sandbox(driver: Driver) -> None:
    sid = await provision(driver)
    if driver.capabilities.pause:
        await driver.pause(sid)
    await driver.destroy(sid)
    assert sid not in await driver.alive()


async def test_missing_working_directory_is_invalid_input(local: Driver) -> None:
    from hutch.core.errors import InvalidInput

    sid = await provision(local)
    with pytest.raises(InvalidInput, match="no-such-dir"):
        await run(local, sid, "pwd", cwd="/no-such-dir")
    await local.destroy(sid)
