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


class SlowStream:
    """A pipe read late: each read waits first, as a busy sandbox's event loop may."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream

    async def read(self, n: int) -> bytes:
        await asyncio.sleep(0.05)
        return await self.stream.read(n)


async def cell_output(ctx: object, code: str) -> tuple[str, str, list[dict]]:
    out: list[str] = []
    err: list[str] = []
    other: list[dict] = []
    run: AsyncIterator[dict] = ctx.run(code)  # type: ignore[attr-defined]
    async for item in run:
        if item["type"] in ("stdout", "stderr"):
            (out if item["type"] == "stdout" else err).append(item["text"])
        else:
            other.append(item)
    return "".join(out), "".join(err), other


async def test_a_childs_output_on_the_real_stdout_arrives_whole_however_late_it_is_read(
        interpreter: ModuleType, tmp_path: Path) -> None:
    slow_read = interpreter.JsContext._read_raw

    async def read_raw_late(self: object, stream: asyncio.StreamReader, name: str) -> None:
        await slow_read(self, SlowStream(stream), name)

    with mock.patch.object(interpreter.JsContext, "_read_raw", read_raw_late):
        ctx = interpreter.JsContext("javascript", str(tmp_path))
        try:
            child = ("require('child_process').execSync(`python3 -c \"import sys; sys.stdout.write('a' + chr(233) * "
                     "70000); sys.stderr.write('e' * 100000)\"`, { stdio: 'inherit' }); 'ok'")
            for _ in range(2):
                out, err, other = await cell_output(ctx, child)
                assert out == "a" + "\u00e9" * 70000 and err == "e" * 100000
                assert [o["text"] for o in other if o["type"] == "result"] == ["ok"]
            # A cell's console output is unchanged, and what a cell prints that looks like the
            # end mark without its secret is output like any other.
            out, _, _ = await cell_output(ctx, "console.log('\\0 end'); process.stdout.write('x')")
            assert out == "\0 end\nx"
        finally:
            await ctx.stop()


async def test_a_cell_that_closes_the_real_stdout_still_ends(interpreter: ModuleType, tmp_path: Path) -> None:
    ctx = interpreter.JsContext("javascript", str(tmp_path))
    try:
        out, err, _ = await asyncio.wait_for(cell_output(ctx, "require('fs').closeSync(1); 1"), 30)
        assert out == "" and err == ""
        out, _, _ = await asyncio.wait_for(cell_output(ctx, "console.log('still here')"), 30)
        assert out == "still here\n"
    finally:
        await ctx.stop()


async def test_a_file_a_cell_opened_at_fd_1_is_not_written_the_end_mark(
        interpreter: ModuleType, tmp_path: Path) -> None:
    # fd 1 closed, the next file opened takes its number: the kernel wrote the cell's end mark
    # (its secret too) into the tenant's file at every cell's end, then waited for a mark that
    # never came to the pipe (JS_FLUSH_SECONDS, here far longer than the cell may take).
    ctx = interpreter.JsContext("javascript", str(tmp_path))
    try:
        with mock.patch.object(interpreter, "JS_FLUSH_SECONDS", 600.0):
            await asyncio.wait_for(cell_output(ctx, "require('fs').closeSync(1)"), 30)
            _, _, other = await asyncio.wait_for(cell_output(ctx, "var log = require('fs').openSync('log.txt', 'a'); log"), 30)
            assert [o["text"] for o in other if o["type"] == "result"] == ["1"]  # the file is fd 1 now
            out, _, other = await asyncio.wait_for(cell_output(ctx, "console.log('out'); 2"), 30)
            assert out == "out\n" and [o["text"] for o in other if o["type"] == "result"] == ["2"]
        assert (tmp_path / "log.txt").read_bytes() == b""
    finally:
        await ctx.stop()


class ChoppedStream:
    """A pipe read a little at a time, late: a child's last output reaches the queue well after
    the cell's "done"."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream

    async def read(self, n: int) -> bytes:
        data = await self.stream.read(min(n, 4096))
        await asyncio.sleep(0.01)
        return data


async def test_a_caller_slow_to_take_a_cells_output_gets_all_of_it(interpreter: ModuleType, tmp_path: Path) -> None:
    # The wait for a cell's end marks counted the time the caller took over each piece of
    # output (its HTTP client reading slowly): past JS_FLUSH_SECONDS, the output still queued
    # was left behind, and the next cell dropped it as an earlier cell's.
    chopped = interpreter.JsContext._read_raw

    async def read_raw_chopped(self: object, stream: asyncio.StreamReader, name: str) -> None:
        await chopped(self, ChoppedStream(stream), name)

    with mock.patch.object(interpreter.JsContext, "_read_raw", read_raw_chopped), \
            mock.patch.object(interpreter, "JS_FLUSH_SECONDS", 0.2):
        ctx = interpreter.JsContext("javascript", str(tmp_path))
        try:
            code = ("require('child_process').execSync(`python3 -c \"import sys; sys.stderr.write('e' * 60000)\"`, "
                    "{ stdio: 'inherit' }); 'ok'")
            err: list[str] = []
            async for item in ctx.run(code):
                if item["type"] == "stderr":
                    err.append(item["text"])
                    await asyncio.sleep(0.03)  # the caller, slow to take it
            assert "".join(err) == "e" * 60000
        finally:
            await ctx.stop()


class LateStream:
    """A pipe whose every piece reaches the reader half a second after it was written."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream

    async def read(self, n: int) -> bytes:
        data = await self.stream.read(n)
        await asyncio.sleep(0.5)
        return data


async def test_a_caller_leaving_once_the_cell_is_over_does_not_restart_its_context(
        interpreter: ModuleType, tmp_path: Path) -> None:
    # The caller left (its timeout) while the cell, over, had only its child's last output to
    # come: the interrupt that follows signalled the idle kernel, waited for a "done" already
    # taken, and restarted the context (its state lost, the next cell told it did not stop).
    late = interpreter.JsContext._read_raw

    async def read_raw_late(self: object, stream: asyncio.StreamReader, name: str) -> None:
        await late(self, LateStream(stream), name)

    with mock.patch.object(interpreter.JsContext, "_read_raw", read_raw_late):
        ctx = interpreter.JsContext("javascript", str(tmp_path))
        try:
            run = ctx.run("var kept = 7; require('child_process').execSync('printf y', { stdio: 'inherit' }); 1")
            async for item in run:
                if item["type"] == "result":
                    break  # the cell's value, just before its "done"
            waiting = asyncio.ensure_future(anext(run))  # its "done" taken, the child's "y" still to come
            await asyncio.sleep(0.2)
            assert not waiting.done()
            waiting.cancel()  # the caller left: the server interrupts (execute's finally)
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            await asyncio.wait_for(ctx.interrupt(), 30)
            _, err, other = await asyncio.wait_for(cell_output(ctx, "kept"), 30)
            assert err == "" and [o.get("text") for o in other if o["type"] in ("result", "error")] == ["7"]
        finally:
            await ctx.stop()


async def test_a_restarted_context_answers(interpreter: ModuleType, tmp_path: Path) -> None:
    # The stopped kernel's watcher, cancelled as its wait ended (Python 3.11's wait_for keeps
    # the result and drops the cancel), put its "exited" into the new kernel's queue: the
    # restart took it for the new kernel's first word and failed ("did not start").
    ctx = interpreter.JsContext("javascript", str(tmp_path))
    try:
        for n in range(3):
            await asyncio.wait_for(cell_output(ctx, f"var n = {n}"), 30)
            await asyncio.wait_for(ctx.restart(), 30)
            _, _, other = await asyncio.wait_for(cell_output(ctx, "typeof n"), 30)
            assert [o.get("text") for o in other if o["type"] in ("result", "error")] == ["undefined"]
    finally:
        await ctx.stop()


async def test_a_cells_cut_character_does_not_reach_the_next_cells_output(
        interpreter: ModuleType, tmp_path: Path) -> None:
    # A child's output ending mid-character (binary output, a cut stream): the bytes waited in
    # the stream's decoder and came out as U+FFFD at the start of the next cell's output.
    ctx = interpreter.JsContext("javascript", str(tmp_path))
    try:
        child = "require('child_process').execSync(`printf '{}'`, {{ stdio: 'inherit' }}); 1"
        out, _, _ = await asyncio.wait_for(cell_output(ctx, child.format("ab\\\\342\\\\202")), 30)
        assert out == "ab\ufffd"
        out, _, _ = await asyncio.wait_for(cell_output(ctx, child.format("ok")), 30)
        assert out == "ok"
    finally:
        await ctx.stop()
