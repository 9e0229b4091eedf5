"""A JavaScript context's output that reaches the kernel's real stdout (a child process that
inherited it) belongs whole to the cell that made it, however late its pipe is read.

The cell's end comes on the kernel's message pipe and its child's output on the real stdout:
two pipes, read by two tasks, so "done" could be taken before the last of that output was
read, and the tail was lost (once in three cells of 140 kB in a loaded sandbox). Here the real
stdout is read slowly on purpose, so the old answer loses the tail every time.

The program runs on the host with the host's node (it needs nothing of the sandbox's image for a
JavaScript context); the Jupyter modules it imports for Python contexts are not used here, so
they are stood in for."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.machinery
import importlib.util
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest

PROGRAM = Path(__file__).parents[2] / "hutch" / "core" / "runtime_files" / "hutch-interpreter"
JUPYTER = ("jupyter_client", "jupyter_client.kernelspec", "jupyter_client.manager")


@pytest.fixture
def interpreter() -> ModuleType:
    assert shutil.which("node"), "the JavaScript kernel needs node on PATH"
    loader = importlib.machinery.SourceFileLoader("hutch_interpreter_program", str(PROGRAM))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict(sys.modules, {name: mock.MagicMock() for name in JUPYTER}):
        loader.exec_module(module)
    return module


@pytest.fixture
async def ctx(interpreter: ModuleType, tmp_path: Path) -> AsyncIterator[object]:
    """A JavaScript context in the test's directory; its kernel starts at its first cell (so a
    patch the test makes before that applies to it), and is stopped after."""
    made = interpreter.JsContext("javascript", str(tmp_path))
    try:
        yield made
    finally:
        await made.stop()


class DelayedStream:
    """The real stdout or stderr read late: ``before`` each read (a busy sandbox's event loop),
    ``after`` it (its piece reaches the queue that much later), ``chunk`` bytes at most a read."""

    def __init__(self, stream: asyncio.StreamReader, *, before: float = 0.0, after: float = 0.0,
                 chunk: int | None = None) -> None:
        self.stream, self.before, self.after, self.chunk = stream, before, after, chunk

    async def read(self, n: int) -> bytes:
        await asyncio.sleep(self.before)
        data = await self.stream.read(min(n, self.chunk or n))
        await asyncio.sleep(self.after)
        return data


def read_late(interpreter: ModuleType, **delays: float) -> contextlib.AbstractContextManager[object]:
    """Patched in: every context's real stdout and stderr read through ``DelayedStream``."""
    read_raw = interpreter.JsContext._read_raw

    async def delayed(self: object, stream: asyncio.StreamReader, name: str) -> None:
        await read_raw(self, DelayedStream(stream, **delays), name)  # type: ignore[arg-type]

    return mock.patch.object(interpreter.JsContext, "_read_raw", delayed)


async def cell_output(ctx: object, code: str) -> tuple[str, str, list[dict]]:
    """A cell's stdout, stderr and other messages; 30 s at most."""
    out: list[str] = []
    err: list[str] = []
    other: list[dict] = []

    async def take() -> None:
        run: AsyncIterator[dict] = ctx.run(code)  # type: ignore[attr-defined]
        async for item in run:
            if item["type"] in ("stdout", "stderr"):
                (out if item["type"] == "stdout" else err).append(item["text"])
            else:
                other.append(item)

    await asyncio.wait_for(take(), 30)
    return "".join(out), "".join(err), other


def results(other: list[dict], kinds: tuple[str, ...] = ("result",)) -> list[str | None]:
    return [o.get("text") for o in other if o["type"] in kinds]


async def test_a_childs_output_on_the_real_stdout_arrives_whole_however_late_it_is_read(
        interpreter: ModuleType, ctx: object) -> None:
    with read_late(interpreter, before=0.05):
        child = ("require('child_process').execSync(`python3 -c \"import sys; sys.stdout.write('a' + chr(233) * "
                 "70000); sys.stderr.write('e' * 100000)\"`, { stdio: 'inherit' }); 'ok'")
        for _ in range(2):
            out, err, other = await cell_output(ctx, child)
            assert out == "a" + "\u00e9" * 70000 and err == "e" * 100000
            assert results(other) == ["ok"]
        # A cell's console output is unchanged, and what a cell prints that looks like the
        # end mark without its secret is output like any other.
        out, _, _ = await cell_output(ctx, "console.log('\\0 end'); process.stdout.write('x')")
        assert out == "\0 end\nx"


async def test_a_cell_that_closes_the_real_stdout_still_ends(ctx: object) -> None:
    out, err, _ = await cell_output(ctx, "require('fs').closeSync(1); 1")
    assert out == "" and err == ""
    out, _, _ = await cell_output(ctx, "console.log('still here')")
    assert out == "still here\n"


async def test_a_file_a_cell_opened_at_fd_1_is_not_written_the_end_mark(
        interpreter: ModuleType, ctx: object, tmp_path: Path) -> None:
    # fd 1 closed, the next file opened takes its number: the kernel wrote the cell's end mark
    # (its secret too) into the tenant's file at every cell's end, then waited for a mark that
    # never came to the pipe (JS_FLUSH_SECONDS, here far longer than the cell may take).
    with mock.patch.object(interpreter, "JS_FLUSH_SECONDS", 600.0):
        await cell_output(ctx, "require('fs').closeSync(1)")
        _, _, other = await cell_output(ctx, "var log = require('fs').openSync('log.txt', 'a'); log")
        assert results(other) == ["1"]  # the file is fd 1 now
        out, _, other = await cell_output(ctx, "console.log('out'); 2")
        assert out == "out\n" and results(other) == ["2"]
    assert (tmp_path / "log.txt").read_bytes() == b""


async def test_a_caller_slow_to_take_a_cells_output_gets_all_of_it(interpreter: ModuleType, ctx: object) -> None:
    # The wait for a cell's end marks counted the time the caller took over each piece of
    # output (its HTTP client reading slowly): past JS_FLUSH_SECONDS, the output still queued
    # was left behind, and the next cell dropped it as an earlier cell's.
    with read_late(interpreter, after=0.01, chunk=4096), mock.patch.object(interpreter, "JS_FLUSH_SECONDS", 0.2):
        code = ("require('child_process').execSync(`python3 -c \"import sys; sys.stderr.write('e' * 60000)\"`, "
                "{ stdio: 'inherit' }); 'ok'")
        err: list[str] = []
        async for item in ctx.run(code):  # type: ignore[attr-defined]
            if item["type"] == "stderr":
                err.append(item["text"])
                await asyncio.sleep(0.03)  # the caller, slow to take it
        assert "".join(err) == "e" * 60000


async def test_a_caller_leaving_once_the_cell_is_over_does_not_restart_its_context(
        interpreter: ModuleType, ctx: object) -> None:
    # The caller left (its timeout) while the cell, over, had only its child's last output to
    # come: the interrupt that follows signalled the idle kernel, waited for a "done" already
    # taken, and restarted the context (its state lost, the next cell told it did not stop).
    with read_late(interpreter, after=0.5):
        run = ctx.run("var kept = 7; require('child_process').execSync('printf y', { stdio: 'inherit' }); 1")  # type: ignore[attr-defined]
        async for item in run:
            if item["type"] == "result":
                break  # the cell's value, just before its "done"
        waiting = asyncio.ensure_future(anext(run))  # its "done" taken, the child's "y" still to come
        await asyncio.sleep(0.2)
        assert not waiting.done()
        waiting.cancel()  # the caller left: the server interrupts (execute's finally)
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        await asyncio.wait_for(ctx.interrupt(), 30)  # type: ignore[attr-defined]
        _, err, other = await cell_output(ctx, "kept")
        assert err == "" and results(other, ("result", "error")) == ["7"]


async def test_a_restarted_context_answers(ctx: object) -> None:
    # The stopped kernel's watcher, cancelled as its wait ended (Python 3.11's wait_for keeps
    # the result and drops the cancel), put its "exited" into the new kernel's queue: the
    # restart took it for the new kernel's first word and failed ("did not start").
    for n in range(3):
        await cell_output(ctx, f"var n = {n}")
        await asyncio.wait_for(ctx.restart(), 30)  # type: ignore[attr-defined]
        _, _, other = await cell_output(ctx, "typeof n")
        assert results(other, ("result", "error")) == ["undefined"]


async def test_a_cells_cut_character_does_not_reach_the_next_cells_output(ctx: object) -> None:
    # A child's output ending mid-character (binary output, a cut stream): the bytes waited in
    # the stream's decoder and came out as U+FFFD at the start of the next cell's output.
    child = "require('child_process').execSync(`printf '{}'`, {{ stdio: 'inherit' }}); 1"
    out, _, _ = await cell_output(ctx, child.format("ab\\\\342\\\\202"))
    assert out == "ab\ufffd"
    out, _, _ = await cell_output(ctx, child.format("ok"))
    assert out == "ok"


async def test_a_cells_late_callback_output_and_throw_reach_no_later_cell(ctx: object) -> None:
    # A callback a cell left behind (a child's exec, a timer) runs while the next cell does: its
    # console.log and its throw were taken for that cell's own (tagged with the running cell).
    # They belong to the cell that started them, which is over: dropped, as a Python thread's.
    late = ("require('child_process').exec('sleep 0.3; echo late-exec', (e, out) => console.log(out));"
            "setTimeout(() => console.error('late-timer'), 300);"
            "setTimeout(() => { throw new Error('late-throw') }, 300);"
            "setTimeout(() => Promise.reject(new Error('late-reject')), 300); 1")
    out, err, other = await cell_output(ctx, late)
    assert (out, err, results(other, ("result", "error"))) == ("", "", ["1"])
    following = "await new Promise(r => setTimeout(r, 1500)); console.log('own'); 2"
    out, err, other = await cell_output(ctx, following)
    assert (out, err, results(other, ("result", "error"))) == ("own\n", "", ["2"])
    # A callback the running cell started is still its own, a throw in it the cell's error.
    out, _, other = await cell_output(
        ctx, "await new Promise(r => setTimeout(() => { console.log('mine'); r() }, 50)); "
             "setTimeout(() => { throw new TypeError('its own') }, 0); await new Promise(r => setTimeout(r, 100))")
    assert out == "mine\n" and [(o["name"], o["value"]) for o in other if o["type"] == "error"] == [
        ("TypeError", "its own")]
