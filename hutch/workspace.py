"""A persistent workspace for agents that edit files, run code and resume across turns and
processes: the seeds' "Sandbox Agent", in Python, with hutch's isolation as the default.

    async with Workspace(files={"app.py": "print(1)"}, language="python") as ws:
        result = await ws.run("print(6 * 7)")            # .stdout, .stderr, .output, .exit_code, .timed_out
        await ws.write_file("notes/todo.md", "- fix")    # parents made
        saved = (await ws.snapshot()).to_dict()          # plain JSON: every file (base64) and the env
    ws2 = await Workspace.resume(WorkspaceSnapshot.from_dict(saved))   # anywhere, any backend

Backends:

- ``sandbox`` (the default): a hutch sandbox on this machine through the in-process engine
  (hutch/_embedded.py): no server, root or rootless. An agent's code is untrusted; the
  document's default (``unix-local``) runs it as you, on your machine.
- ``remote``: a hutch server (or any Agentuity-compatible one) by ``url`` and ``api_key``.
- ``unix-local``: a temporary directory and a child process, as the document has it: for
  trusted code only (it runs with your user's rights; only the paths are confined).
- ``docker``: a temporary directory bind-mounted into a container of a Docker engine on this
  machine (hutch/_workspace_docker.py): the files as unix-local, the code confined as far as
  Docker allows. Needs ``pip install 'hutch[docker]'``.
- ``e2b``: a sandbox of any E2B-compatible server (hutch's own E2B wire too) through E2B's SDK
  (hutch/_workspace_e2b.py), found by ``E2B_API_KEY``/``E2B_API_URL``/``E2B_SANDBOX_URL`` or by
  ``api_key``, ``url`` and ``sandbox_url``. Needs ``pip install 'hutch[e2b]'``.

The workspace root is the sandbox user's home (``/home/agentuity``) in a sandbox, the
temporary directory locally (bind-mounted at ``/home/agentuity`` for docker). A path that
would leave it (``../x``, an absolute path elsewhere, a symlink the workspace's code planted)
is refused with ``ValueError``: the document's "blocked by the filesystem" holds for a sandbox
anyway, and locally nothing else would hold it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import logging
import os
import posixpath
import shutil
import signal
import subprocess
import tarfile
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hutch import _workspace_files as local_files
from hutch._blocking import Blocking, _Portal
from hutch._bounded import Kept, read_at_most
from hutch._interpreter import PORT as INTERPRETER_PORT
from hutch._interpreter import RUNTIME as INTERPRETER_RUNTIME
from hutch._interpreter import CodeError, CodeOutput
from hutch.client import Sandbox, SandboxClient, local_client
from hutch.errors import SandboxError
from hutch.workspace_tools import WorkspaceTools

if TYPE_CHECKING:
    from hutch._workspace_docker import DockerBox
    from hutch._workspace_e2b import E2bBox

__all__ = ["CodeResult", "RunResult", "Workspace", "WorkspaceSnapshot"]

BACKENDS = ("sandbox", "remote", "unix-local", "docker", "e2b")
LANGUAGES = {"node": ("node", "-e"), "python": ("python3", "-c"), "shell": ("/bin/sh", "-c")}
# run_code's kernels in the code-interpreter runtime; no language there is Python's, as it always was.
KERNELS: dict[str | None, str] = {None: "python", "python": "python", "node": "javascript"}
# One runtime with every language above: a call picks its language, whatever the constructor's.
DEFAULT_RUNTIME = "workspace:latest"
SANDBOX_ROOT = "/home/agentuity"
TIMED_OUT = 124  # the document's (and timeout(1)'s) exit code for a command killed at its limit


@attrs.frozen
class CodeResult:
    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    #: Why the sandbox ended the command, when it did (e.g. ``killed: out of memory (limit
    #: 64Mi)``): an exit code alone (137) does not say. None otherwise.
    error: str | None = None
    #: ``run_code`` in the code-interpreter runtime: what the cell showed (its value, charts as
    #: PNG bytes, tables as HTML) and the exception it raised (name, value, traceback).
    results: tuple[CodeOutput, ...] = ()
    exception: CodeError | None = None

    @property
    def output(self) -> str:
        """stdout then stderr (the document's combined ``output``)."""
        return self.stdout + self.stderr


# The workspace's first name for it, kept importable; the client's RunResult (hutch.RunResult) is
# another class, the answer of a one-shot sandbox run.
RunResult = CodeResult


@attrs.frozen
class WorkspaceSnapshot:
    """Every file (base64) and the env; with ``snapshot_id`` a native hutch snapshot too (the
    sandbox and remote backends), which ``resume`` prefers on the same server."""

    files: Mapping[str, str]
    env: Mapping[str, str]
    backend: str
    snapshot_id: str | None = None
    url: str | None = None  # where snapshot_id lives (remote); None: this machine's engine

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "files": dict(self.files), "env": dict(self.env), "backend": self.backend,
                "snapshotId": self.snapshot_id, "url": self.url}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkspaceSnapshot:
        if data.get("version") != 1 or not isinstance(data.get("files"), dict):
            raise ValueError("not a workspace snapshot (version 1 with files)")
        return cls(files=data["files"], env=data.get("env") or {}, backend=str(data.get("backend", "")),
                   snapshot_id=data.get("snapshotId"), url=data.get("url"))


class Workspace:
    def __init__(
        self,
        *,
        backend: str = "sandbox",
        files: Mapping[str, str | bytes] | None = None,
        git_clones: Sequence[Mapping[str, str]] = (),
        env: Mapping[str, str] | None = None,
        timeout_seconds: float = 60.0,
        language: str = "node",
        runtime: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        workspace_id: str | None = None,
        sandbox_url: str | None = None,
        max_bytes: int | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
        if language not in LANGUAGES:
            raise ValueError(f"language: {language!r} is not one of {', '.join(LANGUAGES)}")
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
            raise ValueError(f"max_bytes: expected a number of bytes, 1 or more (or None), got {max_bytes!r}")
        url = url or (os.environ.get("HUTCH_URL") if backend == "remote" else None)
        if backend == "remote" and not url:
            raise ValueError("backend 'remote' needs url= or HUTCH_URL (and api_key=, or HUTCH_API_KEY)")
        if backend == "docker":  # the document's "dockerode is required": said before anything starts
            from hutch._workspace_docker import require_sdk

            require_sdk()
        if backend == "e2b":  # the same, and the key, which E2B's SDK would only miss at create
            from hutch._workspace_e2b import require_sdk as require_e2b

            require_e2b()
            if not (api_key or os.environ.get("E2B_API_KEY")):
                raise ValueError("backend 'e2b' needs api_key= or E2B_API_KEY (and url=/E2B_API_URL for a server "
                                 "other than E2B's cloud)")
        self.backend = backend
        self.files = dict(files or {})
        self.git_clones = list(git_clones)
        self.env = dict(env or {})
        self.timeout_seconds = timeout_seconds
        self.language = language
        self.runtime = runtime or DEFAULT_RUNTIME
        self.url, self.api_key, self.data_dir, self.sandbox_url = url, api_key, data_dir, sandbox_url
        #: The most one call brings into this process from a sandbox (sandbox and remote
        #: backends): a read_file's file (larger: ValueError), each of a run's stdout and stderr
        #: (the rest counted, not kept). None: no bound. ``hutch mcp`` sets it: it serves many.
        self.max_bytes = max_bytes
        #: The sandbox id (sandbox, remote and e2b backends) or container id (docker): reattach with
        #: ``Workspace(workspace_id=…)``.
        self.id: str | None = workspace_id
        self._ready = False
        self._stack: AsyncExitStack | None = None
        self._client: SandboxClient | None = None
        self._sandbox: Sandbox | None = None
        self._dir: Path | None = None
        self._box: DockerBox | None = None
        self._e2b: E2bBox | None = None
        self._from_snapshot: str | None = None

    @property
    def ready(self) -> bool:
        return self._ready

    async def __aenter__(self) -> Workspace:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Create the workspace (or reattach to ``workspace_id``), write the seeded files, run
        the git clones. Idempotent."""
        if self._ready:
            return
        self._stack = AsyncExitStack()
        try:
            if self.backend == "unix-local":
                self._dir = Path(tempfile.mkdtemp(prefix="hutch-workspace-"))
            elif self.backend == "docker":
                await self._open_box()
            elif self.backend == "e2b":
                await self._open_e2b()
            else:
                await self._open_sandbox()
            if self._from_snapshot is None:  # a resumed or reattached workspace has its files (and clones)
                for path, contents in self.files.items():
                    await self.write_file(path, contents, "binary" if isinstance(contents, bytes) else "utf8",
                                          _starting=True)
                for clone in self.git_clones:
                    await self._clone(clone)
        except BaseException:
            await self._teardown(destroy=True)
            raise
        self._ready = True

    async def _open_sandbox(self) -> None:
        assert self._stack is not None
        from hutch import _config

        served = _config.local_server_url() if self.backend == "sandbox" and self.data_dir is None else None
        if self.backend == "remote" or served:  # this machine's `hutch serve`, when one runs
            self._client = await self._stack.enter_async_context(SandboxClient(self.url or served, self.api_key))
        else:
            self._client = await self._stack.enter_async_context(local_client(data_dir=self.data_dir))
        if self.id is not None:  # reattach: another process made it
            self._sandbox = await self._client.connect(self.id)
            self._from_snapshot = "reattached"
            return
        # Network only when a git clone needs it (the clones run first, in the sandbox); the
        # interpreter's port is reached through hutch's proxy, which needs no network.
        network: dict[str, Any] = {"enabled": True} if self.git_clones else {}
        if self.runtime == INTERPRETER_RUNTIME:
            network["port"] = INTERPRETER_PORT
        self._sandbox = await self._client.create(runtime=None if self._from_snapshot else self.runtime,
                                                  env=self.env or None, network=network or None,
                                                  snapshot=self._from_snapshot)
        self.id = self._sandbox.id

    async def _open_box(self) -> None:
        from hutch._workspace_docker import DockerBox

        if self.id is not None:  # reattach: another process made it
            self._box = await DockerBox.attach(self.id)
            self._from_snapshot = "reattached"
        else:
            self._box = await DockerBox.create(self.runtime, self.env)
        self.id, self._dir = self._box.id, self._box.root

    async def _open_e2b(self) -> None:
        from hutch._workspace_e2b import E2bBox

        opts = {"api_key": self.api_key, "api_url": self.url, "sandbox_url": self.sandbox_url}
        if self.id is not None:  # reattach: another process made it
            self._e2b = await E2bBox.attach(self.id, opts)
            self._from_snapshot = "reattached"
        else:  # the runtime is the template: hutch's wire takes any runtime name
            self._e2b = await E2bBox.create(self.runtime, self.env, bool(self.git_clones), opts)
        self.id = self._e2b.id

    async def _clone(self, clone: Mapping[str, str]) -> None:
        url, into = clone.get("url"), clone.get("dir") or posixpath.basename(str(clone.get("url", ""))).removesuffix(".git")
        if not url:
            raise ValueError("git_clones: each needs a url")
        target = self._path(into)  # a clone lands inside the workspace too
        argv = ["git", "clone", "--depth", "1", *(["--branch", clone["ref"]] if clone.get("ref") else []), url, into]
        # docker: with the host's git into the bind mount, before any of the workspace's code has
        # run, so the container never needs a network.
        run = self._host_exec if self._box is not None else self._exec
        result = await run(argv, self.timeout_seconds * 5)
        if result.exit_code != 0:
            raise RuntimeError(f"git clone {url} failed (exit {result.exit_code}): {result.output.strip()[-500:]}")
        if self._box is not None and self._dir is not None:
            await asyncio.to_thread(local_files.give, self._dir, target, self._box.owner)

    async def close(self) -> None:
        """Remove the workspace (the temporary directory, or the sandbox). Idempotent."""
        if self._stack is None and not self._ready:
            return
        await self._teardown(destroy=True)

    async def detach(self) -> None:
        """Leave the sandbox running for another process to reattach by :attr:`id`."""
        await self._teardown(destroy=False)

    async def _teardown(self, *, destroy: bool) -> None:
        self._ready = False
        try:
            if destroy and self._sandbox is not None:
                with contextlib.suppress(Exception):
                    await self._sandbox.destroy()
            if destroy and self._e2b is not None:
                try:
                    await self._e2b.kill()
                except Exception as err:  # close() runs in finally blocks: say so, do not raise
                    logging.getLogger("hutch.workspace").warning("e2b workspace %s: %s", self.id, err)
            if self._box is not None:  # the container, its directory and its uid; or only the connection
                try:
                    await (self._box.remove() if destroy else asyncio.to_thread(self._box.close))
                except Exception as err:  # close() runs in finally blocks: say so, do not raise
                    logging.getLogger("hutch.workspace").warning("docker workspace %s: %s", self.id, err)
            elif self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
        finally:
            stack, self._stack, self._sandbox, self._client, self._dir = self._stack, None, None, None, None
            self._box, self._e2b = None, None
            if stack is not None:
                await stack.aclose()

    # ------------------------------------------------------------ code

    async def run(self, code: str, *, language: str | None = None, timeout_seconds: float | None = None) -> CodeResult:
        lang = language or self.language
        if lang not in LANGUAGES:
            raise ValueError(f"language: {lang!r} is not one of {', '.join(LANGUAGES)}")
        program, flag = LANGUAGES[lang]
        return await self._exec([program, flag, code], timeout_seconds or self.timeout_seconds)

    async def run_code(self, code: str, *, language: str | None = None,
                       timeout_seconds: float | None = None) -> CodeResult:
        """``run``, except in the code-interpreter runtime (``runtime="code-interpreter"``): there
        the code runs in a kernel that keeps its variables between calls (Python's, or with
        ``language="node"`` JavaScript's), and the result carries ``results`` (text, html, png
        bytes) and ``exception`` (name, value, traceback)."""
        if self._sandbox is None or self.runtime != INTERPRETER_RUNTIME or language not in KERNELS:
            return await self.run(code, language=language, timeout_seconds=timeout_seconds)
        limit = timeout_seconds or self.timeout_seconds
        try:
            ran = await self._sandbox.run_code(code, language=KERNELS[language], timeout=limit)
        except SandboxError as err:
            if err.code != "EXECUTION_TIMEOUT":
                raise
            return CodeResult("", str(err), TIMED_OUT, True)
        return CodeResult("".join(ran.stdout), "".join(ran.stderr), 1 if ran.error else 0,
                          results=ran.results, exception=ran.error)

    async def shell(self, command: str, *, timeout_seconds: float | None = None) -> CodeResult:
        return await self.run(command, language="shell", timeout_seconds=timeout_seconds)

    async def _exec(self, argv: list[str], timeout: float) -> CodeResult:
        self._need_started()
        if self._sandbox is not None:
            if self.max_bytes is None:
                ex = await self._sandbox.execute(argv, timeout=f"{timeout:g}s")
                stdout, stderr = ex.stdout or "", ex.stderr or ""
            else:
                out, err = Kept(self.max_bytes), Kept(self.max_bytes)
                ex = await self._sandbox.execute(argv, timeout=f"{timeout:g}s", stdout=out, stderr=err, capture=False)
                stdout, stderr = out.text("stdout"), err.text("stderr")
            timed_out = ex.status == "timeout"
            code = TIMED_OUT if timed_out else (ex.exit_code if ex.exit_code is not None else 1)
            error = ex.error if ex.status not in ("completed", "timeout") else None  # timed_out says that one
            return CodeResult(stdout, stderr, code, timed_out, error)
        if self._box is not None:
            return CodeResult(*await self._box.exec(argv, timeout))
        if self._e2b is not None:
            return CodeResult(*await self._e2b.exec(argv, timeout))
        return await self._host_exec(argv, timeout)

    async def _host_exec(self, argv: list[str], timeout: float) -> CodeResult:
        """A child process of this one, in the workspace directory (unix-local; docker's clones)."""
        assert self._dir is not None
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=self._dir, env={**os.environ, "HOME": str(self._dir), **self.env},
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the child and what it started
            out, err = await proc.communicate()
            return CodeResult(out.decode(errors="replace"), err.decode(errors="replace"), TIMED_OUT, True)
        return CodeResult(out.decode(errors="replace"), err.decode(errors="replace"), proc.returncode or 0)

    # ------------------------------------------------------------ files

    def _path(self, path: str) -> str:
        """The path inside the workspace root, or ValueError for one that leaves it."""
        root = str(self._dir) if self._dir is not None else self._e2b.home if self._e2b is not None else SANDBOX_ROOT
        if not path or "\x00" in path:
            raise ValueError(f"path: {path!r} is not a usable path")
        full = posixpath.normpath(posixpath.join(root, path))
        if full != root and not full.startswith(root.rstrip("/") + "/"):
            raise ValueError(f"path: {path!r} is outside the workspace ({root})")
        return full

    async def write_file(self, path: str, contents: str | bytes, encoding: str = "utf8", *,
                         _starting: bool = False) -> None:
        """Write a file (parents made). ``encoding="base64"``: ``contents`` is base64 text."""
        if not _starting:
            self._need_started()
        data = (base64.b64decode(contents) if encoding == "base64" else
                contents if isinstance(contents, bytes) else contents.encode())
        full = self._path(path)
        if self._sandbox is not None:
            await self._sandbox.write_files({full: data})
            return
        if self._e2b is not None:
            await self._e2b.write(full, data)
            return
        assert self._dir is not None
        owner = self._box.owner if self._box is not None else None
        await asyncio.to_thread(local_files.write, self._dir, full, data, path, owner)

    async def read_file(self, path: str, encoding: str = "utf8") -> str | None:
        """The file's text (``encoding="base64"``: base64), or None when it does not exist."""
        self._need_started()
        full = self._path(path)
        if self._sandbox is not None:
            from hutch.errors import FileNotFound

            try:
                if self.max_bytes is None:
                    data = await self._sandbox.read_bytes(full)
                elif (found_bytes := await read_at_most(self._sandbox.read_file(full), self.max_bytes)) is None:
                    raise ValueError(f"path: {path!r} is larger than the {self.max_bytes} bytes read_file answers "
                                     "here; read part of it with a command (head, tail, grep)")
                else:
                    data = found_bytes
            except FileNotFound:
                return None
        elif self._e2b is not None:
            found = await self._e2b.read(full)
            if found is None:
                return None
            data = found
        else:
            assert self._dir is not None
            found = await asyncio.to_thread(local_files.read, self._dir, full)
            if found is None:
                return None
            data = found
        return base64.b64encode(data).decode() if encoding == "base64" else data.decode(errors="replace")

    async def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        """The entries of a directory of the workspace: ``{"name", "is_dir", "size"}`` each,
        sorted by name (one level; ValueError when there is no such directory)."""
        self._need_started()
        full = self._path(path)
        if self._sandbox is not None:
            from hutch.errors import FileNotFound

            try:
                found = [(e.path, e.is_dir, e.size or 0) for e in await self._sandbox.list_files(full)]
            except FileNotFound:
                raise ValueError(f"path: {path!r}: no such directory in the workspace") from None
        else:
            if self._e2b is not None:
                listed = await self._e2b.listing(full)
            else:
                assert self._dir is not None
                listed = await asyncio.to_thread(local_files.listing, self._dir, full)
            if listed is None:
                raise ValueError(f"path: {path!r}: no such directory in the workspace")
            found = listed
        return [{"name": name, "is_dir": is_dir, "size": 0 if is_dir else size} for name, is_dir, size in sorted(found)]

    # ------------------------------------------------------------ snapshots

    async def snapshot(self) -> WorkspaceSnapshot:
        """Every file of the workspace (base64) and the env; with a sandbox, also a native hutch
        snapshot (its id), which resumes without shipping the files through memory."""
        self._need_started()
        files: dict[str, str] = {}
        async for rel, data in self._walk():
            files[rel] = base64.b64encode(data).decode()
        snapshot_id = None
        if self._sandbox is not None and self._client is not None:
            snapshot_id = (await self._client.create_snapshot(self._sandbox.id, name="workspace")).snapshot_id
        return WorkspaceSnapshot(files=files, env=dict(self.env), backend=self.backend, snapshot_id=snapshot_id,
                                 url=self.url if self.backend == "remote" else None)

    async def _walk(self) -> AsyncIterator[tuple[str, bytes]]:
        if self._dir is not None:
            for item in await asyncio.to_thread(local_files.files, self._dir):
                yield item
            return
        if self._e2b is not None:
            for item in await self._e2b.files():
                yield item
            return
        assert self._sandbox is not None
        raw = b"".join([c async for c in self._sandbox.iter_archive(path=SANDBOX_ROOT, format="tar")])
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for member in tar.getmembers():
                if member.isfile():
                    handle = tar.extractfile(member)
                    if handle is not None:
                        yield member.name.removeprefix("./"), handle.read()

    @classmethod
    async def resume(cls, snapshot: WorkspaceSnapshot, **options: Any) -> Workspace:
        """A new, started workspace with the snapshot's files and env (``options``: the
        constructor's, e.g. another backend). The native snapshot is used when it is on the
        same server; otherwise the files are written."""
        options.setdefault("backend", snapshot.backend or "sandbox")
        ws = cls(env={**snapshot.env, **options.pop("env", {})}, **options)
        native = snapshot.snapshot_id and ws.backend != "unix-local" and (
            (ws.backend == "sandbox" and snapshot.url is None) or (ws.backend == "remote" and ws.url == snapshot.url))
        if native:
            ws._from_snapshot = snapshot.snapshot_id
        else:
            ws.files = {path: base64.b64decode(data) for path, data in snapshot.files.items()}
        await ws.start()
        return ws

    async def fork(self, count: int = 1) -> list[Workspace]:
        """``count`` new workspaces with this one's files and env as they are now, for
        exploring alternatives in parallel (sandbox and remote backends; processes are not
        carried). They use this workspace's connection: close them before it."""
        self._need_started()
        if self._sandbox is None or self._client is None:
            why = " (E2B's API has none)" if self.backend == "e2b" else ""
            raise RuntimeError(f"fork: backend {self.backend!r} cannot fork{why}; use the sandbox or remote backend")
        children = []
        for sandbox in await self._sandbox.fork(count):
            child = Workspace(backend=self.backend, env=self.env, timeout_seconds=self.timeout_seconds,
                              language=self.language, runtime=self.runtime, url=self.url, api_key=self.api_key,
                              data_dir=self.data_dir, workspace_id=sandbox.id)
            child._client, child._sandbox, child._from_snapshot, child._ready = self._client, sandbox, "forked", True
            child._stack = AsyncExitStack()  # nothing of its own to close but its sandbox
            children.append(child)
        return children

    @classmethod
    def over(cls, client: SandboxClient, sandbox: Sandbox, **options: Any) -> Workspace:
        """A started workspace on a sandbox that someone else made and keeps (an MCP session):
        it owns neither, so drop it without ``close()`` (which would destroy the sandbox)."""
        ws = cls(backend="remote", url=client.url, api_key=client.api_key, workspace_id=sandbox.id, **options)
        ws._client, ws._sandbox, ws._from_snapshot, ws._ready = client, sandbox, "reattached", True
        ws._stack = AsyncExitStack()  # nothing of its own to close
        return ws

    def tools(self) -> WorkspaceTools:
        """Tool definitions and a dispatcher for LLM tool calling (hutch/workspace_tools.py)."""
        return WorkspaceTools(self)

    def _need_started(self) -> None:
        if not self._ready and self._stack is None:
            raise RuntimeError("the workspace is not started (call start(), or use `async with`)")


class SyncWorkspace:
    """The blocking twin: the same constructor; every coroutine method blocks (derived from
    :class:`Workspace`, not written twice). ``resume`` is :meth:`SyncWorkspace.resume`."""

    def __init__(self, **options: Any) -> None:
        self._portal = _Portal()
        self.aio = self._portal.call(_make(options))
        self._blocking = Blocking(self._portal, self.aio)

    @classmethod
    def resume(cls, snapshot: WorkspaceSnapshot, **options: Any) -> SyncWorkspace:
        ws = cls.__new__(cls)
        ws._portal = _Portal()
        ws.aio = ws._portal.call(Workspace.resume(snapshot, **options))
        ws._blocking = Blocking(ws._portal, ws.aio)
        return ws

    def __getattr__(self, name: str) -> Any:
        if name in ("ready", "id", "backend"):
            return getattr(self.aio, name)
        if name == "tools":
            return self.aio.tools
        return getattr(self._blocking, name)

    def __enter__(self) -> SyncWorkspace:
        self._blocking.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._blocking.close()
        finally:
            self._portal.close()


async def _make(options: Mapping[str, Any]) -> Workspace:
    return Workspace(**options)  # made on the portal's loop, where it will run
