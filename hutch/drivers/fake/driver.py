"""A scriptable driver for testing the layers above drivers. No isolation at all.

Commands are interpreted, never run: ``echo ARGS`` prints, ``sleep SECONDS`` waits,
``exit CODE`` exits, ``cat [FILE]`` copies stdin or an in-memory file, ``sh -c SCRIPT``
understands ``;``-joined builtin pieces with ``>&2``, ``> FILE`` and ``>> FILE``
redirections and ``kill -N $$``, ``yes BYTES`` prints that many bytes, ``oom`` reports
an OOM kill, ``pwd``/``env`` report the sandbox's view (with the same default
environment as the local driver). Tests can also register their own handler for an
``argv[0]`` with ``FakeDriver.script``. It passes ``tests/contracts/test_driver.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import shlex
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sequence

import attrs

from hutch.core import runtimes
from hutch.core.errors import (
    DriverFailure,
    FileNotFound,
    IllegalTransition,
    InvalidInput,
    NotSupported,
    RuntimeNotFound,
    SandboxNotFound,
)
from hutch.drivers import roles
from hutch.drivers.base import (
    Capabilities,
    Driver,
    ExecRequest,
    ExecResult,
    FileInfo,
    FileWrite,
    OutputSink,
    ProvisionRequest,
    Stream,
)
from hutch.drivers.builds import Builds
from hutch.drivers.bytecode import forget_bytecode
from hutch.drivers.egress import resolve

Handler = Callable[[ExecRequest, OutputSink], Awaitable[int]]
HOME = "/home/agentuity"
USER = "agentuity"  # the sandbox user, and its group: the owner of every fake file
DEFAULT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": HOME, "USER": "agentuity", "LOGNAME": "agentuity", "SHELL": "/bin/bash",
    "LANG": "C.UTF-8", "HOSTNAME": "sandbox",
}


class _Redirect:
    """An OutputSink that captures one builtin's stdout into an in-memory file."""

    def __init__(self, sink: OutputSink, files: dict[str, bytes], path: str, append: bool) -> None:
        self.sink, self.files, self.path = sink, files, path
        if not append:
            files[path] = b""
        else:
            files.setdefault(path, b"")

    def write(self, stream: Stream, data: bytes) -> None:
        if stream == "stdout":
            self.files[self.path] += data
        else:
            self.sink.write(stream, data)


def _abspath(path: str, cwd: str | None) -> str:
    return posixpath.normpath(posixpath.join(HOME, cwd or HOME, path))


@attrs.define
class FakeSandbox:
    request: ProvisionRequest
    files: dict[str, bytes] = attrs.field(factory=dict)
    dirs: set[str] = attrs.field(factory=lambda: {"/", "/home", HOME, "/workspace", "/tmp"})
    links: dict[str, str] = attrs.field(factory=dict)
    modes: dict[str, int] = attrs.field(factory=dict)
    paused: bool = False
    rules: tuple[bool, tuple[str, ...], tuple[str, ...]] | None = None  # update_network's last (enabled, allow, deny)
    checkpoints: dict[str, tuple[dict[str, bytes], set[str], dict[str, str], dict[str, int]]] = attrs.field(factory=dict)

    def parent_ok(self, path: str) -> bool:
        return posixpath.dirname(path) in self.dirs


class FakeDriver(roles.SandboxFiles, roles.Checkpointing, roles.Pausing, roles.NetworkRules, Driver):
    name = "fake"
    capabilities = Capabilities(files=True, pause=True, checkpoints=True, network_update=True)

    def __init__(self) -> None:
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.destroyed: list[str] = []
        self.handlers: dict[str, Handler] = {}
        self.fail_provision: str | None = None  # set to make the next provision fail
        # First-use builds, scripted: runtimes listed here are not built until build_runtime;
        # each build takes build_seconds and fails with fail_build's words when that is set.
        self.unbuilt: set[str] = set(filter(None, os.environ.get("HUTCH_FAKE_UNBUILT", "").split(",")))
        self.build_seconds = 0.2
        self.fail_build: str | None = None
        self.builds_started = 0
        self._builds = Builds()
        self._running: dict[str, asyncio.Task[int]] = {}
        self._cancelled: set[str] = set()
        self._signalled: dict[str, int] = {}
        self._owner: dict[str, str] = {}  # execution id -> sandbox id

    def script(self, argv0: str, handler: Handler) -> None:
        self.handlers[argv0] = handler

    def runtimes_available(self) -> set[str]:
        return {r.name for r in runtimes.CATALOG} - self.unbuilt

    def runtimes_building(self) -> set[str]:
        return self._builds.building()

    async def build_runtime(self, name: str, progress: Callable[[str], None]) -> None:
        def work(log: Callable[[str], None]) -> None:
            self.builds_started += 1
            for step in (1, 2):
                log(f"{name}: [{step}/2] fake step")
                time.sleep(self.build_seconds / 2)
            if self.fail_build:
                raise DriverFailure(self.fail_build)

        await self._builds.run(name, progress, work)
        self.unbuilt.discard(name)

    async def provision(self, req: ProvisionRequest) -> None:
        if req.runtime not in self.runtimes_available():
            raise RuntimeNotFound(f"runtime {req.runtime!r} is not available")
        if self.fail_provision:
            message, self.fail_provision = self.fail_provision, None
            raise DriverFailure(message)
        self.sandboxes[req.sandbox_id] = FakeSandbox(req)

    async def destroy(self, sandbox_id: str) -> None:
        if self.sandboxes.pop(sandbox_id, None) is not None:
            self.destroyed.append(sandbox_id)

    def _get(self, sandbox_id: str) -> FakeSandbox:
        try:
            return self.sandboxes[sandbox_id]
        except KeyError:
            raise SandboxNotFound(f"fake driver has no sandbox {sandbox_id}") from None

    async def write_files(self, sandbox_id: str, files: Sequence[FileWrite]) -> None:
        sb = self._get(sandbox_id)
        for f in files:
            path = _abspath(f.path, None)
            self._mkdirs(sb, posixpath.dirname(path))
            sb.files[path] = f.content
            sb.modes[path] = f.mode
        await forget_bytecode(self.list_files, self.remove, sandbox_id, [f.path for f in files])

    # -- files (in memory; paths normalised like a kernel would, symlinks one level deep)

    @staticmethod
    def _mkdirs(sb: FakeSandbox, path: str) -> list[str]:
        made = []
        while path not in sb.dirs:
            made.append(path)
            path = posixpath.dirname(path)
        for d in reversed(made):
            if d in sb.files:
                raise InvalidInput(f"{d} is a file, not a directory", field="path")
            sb.dirs.add(d)
        return made

    async def read_file(self, sandbox_id: str, path: str) -> AsyncIterator[bytes]:
        sb = self._get(sandbox_id)
        p = _abspath(path, None)
        p = sb.links.get(p, p)
        if p in sb.dirs:
            raise InvalidInput(f"path: {path} is a directory", field="path")
        if p not in sb.files:
            raise FileNotFound(f"path: {path} does not exist in sandbox {sandbox_id}", field="path")
        data = sb.files[p]
        for i in range(0, len(data), 65536):
            yield data[i : i + 65536]
            await asyncio.sleep(0)

    async def write_file(
        self, sandbox_id: str, path: str, chunks: AsyncIterable[bytes], *, mode: int = 0o644, parents: bool = True
    ) -> int:
        sb = self._get(sandbox_id)
        p = _abspath(path, None)
        if p in sb.dirs:
            raise InvalidInput(f"path: {path} is a directory", field="path")
        if parents:
            self._mkdirs(sb, posixpath.dirname(p))
        elif not sb.parent_ok(p):
            raise FileNotFound(f"path: the directory of {path} does not exist", field="path")
        buf = bytearray()
        async for chunk in chunks:
            buf += chunk
        sb.files[p] = bytes(buf)
        sb.modes[p] = mode
        await forget_bytecode(self.list_files, self.remove, sandbox_id, [path])
        return len(buf)

    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
        sb = self._get(sandbox_id)
        p = _abspath(path, None)
        if p in sb.files:
            return [FileInfo(name=posixpath.basename(p), size=len(sb.files[p]), is_dir=False, mode=0o100000 | sb.modes.get(p, 0o644), mod_time=0.0, owner=USER, group=USER)]
        if p not in sb.dirs:
            raise FileNotFound(f"path: {path} does not exist in sandbox {sandbox_id}", field="path")
        out = []
        for d in sorted(sb.dirs):
            if d != p and posixpath.dirname(d) == p:
                out.append(FileInfo(name=posixpath.basename(d), size=0, is_dir=True, mode=0o040755, mod_time=0.0, owner=USER, group=USER))
        for f, data in sorted(sb.files.items()):
            if posixpath.dirname(f) == p:
                out.append(FileInfo(name=posixpath.basename(f), size=len(data), is_dir=False, mode=0o100000 | sb.modes.get(f, 0o644), mod_time=0.0, owner=USER, group=USER))
        for link, target in sorted(sb.links.items()):
            if posixpath.dirname(link) == p:
                out.append(FileInfo(name=posixpath.basename(link), size=len(target), is_dir=False, mode=0o120777, mod_time=0.0,
                                    is_symlink=True, link_target=target, owner=USER, group=USER))
        return out

    async def mkdir(self, sandbox_id: str, path: str, *, parents: bool) -> None:
        sb = self._get(sandbox_id)
        p = _abspath(path, None)
        if p in sb.files:
            raise InvalidInput(f"path: {path} exists and is a file", field="path")
        if not parents and not sb.parent_ok(p):
            raise FileNotFound(f"path: the directory of {path} does not exist", field="path")
        self._mkdirs(sb, p)

    async def remove(self, sandbox_id: str, path: str, *, directory: bool, recursive: bool) -> bool:
        sb = self._get(sandbox_id)
        p = _abspath(path, None)
        if p in sb.files or p in sb.links:
            if directory and p in sb.files:
                raise InvalidInput(f"path: {path} is not a directory", field="path")
            sb.files.pop(p, None)
            sb.links.pop(p, None)
            return True
        if p not in sb.dirs:
            return False
        if not directory:
            raise InvalidInput(f"path: {path} is a directory; remove it as a directory", field="path")
        inside = [x for x in [*sb.dirs, *sb.files, *sb.links] if x.startswith(p.rstrip("/") + "/")]
        if inside and not recursive:
            raise InvalidInput(f"path: directory {path} is not empty; remove it recursively", field="path")
        for x in inside:
            sb.dirs.discard(x)
            sb.files.pop(x, None)
            sb.links.pop(x, None)
        sb.dirs.discard(p)
        return True

    async def checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        sb = self._get(sandbox_id)
        sb.checkpoints[checkpoint_id] = (dict(sb.files), set(sb.dirs), dict(sb.links), dict(sb.modes))

    async def restore(self, sandbox_id: str, checkpoint_id: str) -> None:
        sb = self._get(sandbox_id)
        files, dirs, links, modes = sb.checkpoints[checkpoint_id]
        sb.files, sb.dirs, sb.links, sb.modes = dict(files), set(dirs), dict(links), dict(modes)

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        self._get(sandbox_id).checkpoints.pop(checkpoint_id, None)

    async def symlink(self, sandbox_id: str, path: str, target: str) -> None:
        sb = self._get(sandbox_id)
        p = _abspath(path, None)
        self._mkdirs(sb, posixpath.dirname(p))
        sb.links[p] = target

    async def rename(self, sandbox_id: str, source: str, destination: str) -> None:
        sb = self._get(sandbox_id)
        src, dst = _abspath(source, None), _abspath(destination, None)
        if src not in sb.files and src not in sb.links and src not in sb.dirs:
            raise FileNotFound(f"path: {source} does not exist in sandbox {sandbox_id}", field="path")
        if dst in sb.dirs and src not in sb.dirs:
            raise InvalidInput(f"path: {destination} is a directory", field="path")
        self._mkdirs(sb, posixpath.dirname(dst))
        prefix = src.rstrip("/") + "/"

        def moved(keys: Iterable[str]) -> list[tuple[str, str]]:
            return [(k, dst + k[len(src):]) for k in list(keys) if k == src or k.startswith(prefix)]

        for old, new in moved(sb.files):
            sb.files[new] = sb.files.pop(old)
        for old, new in moved(sb.links):
            sb.links[new] = sb.links.pop(old)
        for old, new in moved(sb.modes):
            sb.modes[new] = sb.modes.pop(old)
        for old, new in moved(sb.dirs):
            sb.dirs.discard(old)
            sb.dirs.add(new)

    async def alive(self) -> set[str]:
        return set(self.sandboxes)

    async def cancel(self, execution_id: str) -> None:
        task = self._running.get(execution_id)
        if task is not None:
            self._cancelled.add(execution_id)
            task.cancel()

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> None:
        if not memory:
            raise NotSupported(f"memory: the {self.name} driver cannot pause a sandbox filesystem-only",
                               field="memory")
        sb = self._get(sandbox_id)
        if any(t for eid, t in self._running.items() if self._owner.get(eid) == sandbox_id):
            raise NotSupported(f"sandbox {sandbox_id} has commands running: the fake driver freezes none (a "
                               "pause with commands running needs the local, node or nomad driver); cancel them or "
                               "wait for them, then pause", field="state")
        sb.paused = True

    async def resume(self, sandbox_id: str) -> None:
        self._get(sandbox_id).paused = False

    async def update_network(self, sandbox_id: str, *, enabled: bool, allow: tuple[str, ...],
                             deny: tuple[str, ...]) -> None:
        """Kept, not enforced (a fake sandbox has no network); the local driver's is the real one."""
        sb = self._get(sandbox_id)
        if enabled and not sb.request.network_enabled:
            raise NotSupported(f"network: sandbox {sandbox_id} was made without outbound network, and an update "
                               "cannot give it one", field="network")
        if allow:
            await resolve(allow)
        sb.rules = (enabled, allow, deny)

    async def signal(self, execution_id: str, signum: int) -> None:
        """Any signal ends a fake command as if it had no handler: exit 128+signum."""
        task = self._running.get(execution_id)
        if task is not None:
            self._signalled[execution_id] = signum
            task.cancel()

    async def exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult:
        sb = self._get(req.sandbox_id)
        if sb.paused:
            raise IllegalTransition(f"sandbox {req.sandbox_id} is paused; resume it first")
        self._owner[req.execution_id] = req.sandbox_id
        task = asyncio.create_task(self._interpret(sb, req, sink))
        self._running[req.execution_id] = task
        try:
            code = await asyncio.wait_for(asyncio.shield(task), req.timeout) if req.timeout else await task
            return ExecResult(exit_code=code, oom_killed=code == 137 and req.argv[0] == "oom")
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return ExecResult(exit_code=124, timed_out=True)
        except asyncio.CancelledError:
            if req.execution_id in self._cancelled:
                return ExecResult(exit_code=137, cancelled=True)
            if req.execution_id in self._signalled:
                return ExecResult(exit_code=128 + self._signalled[req.execution_id])
            raise
        finally:
            self._running.pop(req.execution_id, None)
            self._owner.pop(req.execution_id, None)
            self._cancelled.discard(req.execution_id)
            self._signalled.pop(req.execution_id, None)

    async def _interpret(self, sb: FakeSandbox, req: ExecRequest, sink: OutputSink) -> int:
        argv = list(req.argv)
        handler = self.handlers.get(argv[0])
        if handler is not None:
            return await handler(req, sink)
        if argv[:2] == ["sh", "-c"] and len(argv) > 2:
            code = 0
            for piece in argv[2].split(";"):
                words = shlex.split(piece)
                if not words:
                    continue
                out: Stream = "stdout"
                target: OutputSink = sink
                if words[-1] == ">&2":
                    words, out = words[:-1], "stderr"
                elif len(words) > 2 and words[-2] in (">", ">>"):
                    path = _abspath(words[-1], req.cwd)
                    target = _Redirect(sink, sb.files, path, words[-2] == ">>")
                    words = words[:-2]
                if words[:1] == ["kill"] and words[-1] == "$$":
                    return 128 + int(words[1].lstrip("-")) if len(words) > 2 else 143
                code = await self._builtin(sb, req, words, target, out)
                if words[0] == "exit":
                    return code
            return code
        return await self._builtin(sb, req, argv, sink, "stdout")

    async def _builtin(self, sb: FakeSandbox, req: ExecRequest, argv: list[str], sink: OutputSink, out: Stream) -> int:
        cmd, args = argv[0], argv[1:]
        env = {**DEFAULT_ENV, **sb.request.env, **req.env}
        match cmd:
            case "echo" | "true" | "false":
                if cmd == "echo":
                    sink.write(out, (" ".join(args) + "\n").encode())
                return 1 if cmd == "false" else 0
            case "sleep":
                await asyncio.sleep(float(args[0]) if args else 0)
                return 0
            case "exit":
                return int(args[0]) if args else 0
            case "cat":
                if args:
                    for arg in args:
                        path = _abspath(arg, req.cwd)
                        if path not in sb.files:
                            sink.write("stderr", f"cat: {arg}: No such file or directory\n".encode())
                            return 1
                        sink.write(out, sb.files[path])
                    return 0
                sink.write(out, await _all(req.stdin))
                return 0
            case "yes":
                total = int(args[0]) if args else 0
                while total > 0:
                    n = min(total, 65536)
                    sink.write(out, b"y" * n)
                    total -= n
                    await asyncio.sleep(0)
                return 0
            case "oom":
                return 137
            case "pwd":
                sink.write(out, f"{_abspath('.', req.cwd)}\n".encode())
                return 0
            case "id" if args in (["-un"], ["-gn"]):
                sink.write(out, f"{USER}\n".encode())
                return 0
            case "env":
                sink.write(out, "".join(f"{k}={v}\n" for k, v in sorted(env.items())).encode())
                return 0
            case "printenv":
                if args and args[0] in env:
                    sink.write(out, f"{env[args[0]]}\n".encode())
                    return 0
                return 1
        sink.write("stderr", f"{cmd}: command not found\n".encode())
        return 127


async def _all(stdin: bytes | AsyncIterable[bytes] | None) -> bytes:
    """The whole of a (possibly streamed) stdin: the fake only echoes it."""
    if stdin is None or isinstance(stdin, bytes):
        return stdin or b""
    return b"".join([chunk async for chunk in stdin])

