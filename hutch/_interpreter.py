"""``Sandbox.run_code``: code run in a kernel that keeps its state (Python's a Jupyter kernel,
JavaScript's and TypeScript's a Node process), with rich results (text, PNG charts, HTML
tables) and structured errors, from the ``code-interpreter`` runtime.

The runtime's ``hutch-interpreter`` serves E2B's interpreter protocol on port 49999 inside the
sandbox; hutch reaches it through its own proxy (the sandbox's ``url``, from ``network.port``
49999), the way any caller reaches a sandbox's port. A request to that URL never carries a hutch
credential (content a sandbox serves never runs with one): this module talks to it over a
session of its own. The URL is public, so the server is started with a token of its own (random,
per sandbox, kept in the sandbox) that every call carries.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import aiohttp
import attrs

from hutch._connection import Connection
from hutch._shapes import Files
from hutch.errors import FileNotFound, InvalidInput, SandboxError
from hutch.handles import JobHandle
from hutch.models import Job

RUNTIME = "code-interpreter"
PORT = 49999
TOKEN_FILE = "/home/agentuity/.hutch-interpreter-token"
SERVER = ["env", f"HUTCH_INTERPRETER_TOKEN_FILE={TOKEN_FILE}", "hutch-interpreter"]
# The first kernel's start (imports of ipykernel) on a busy 2-core host took up to 20 s.
START_SECONDS = 120.0

OutputHandler = Callable[[str], Awaitable[None] | None]


@attrs.frozen
class CodeOutput:
    """One result of a cell: its value (``is_main_result``) or something it displayed. Each
    MIME type the kernel sent is a field; ``png``/``jpeg`` are the image's bytes."""

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: bytes | None = None
    jpeg: bytes | None = None
    latex: str | None = None
    json: Any = None
    javascript: str | None = None
    is_main_result: bool = False
    extra: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class CodeError:
    """The exception a cell raised: its class name, message and the kernel's traceback."""

    name: str
    value: str
    traceback: str


@attrs.frozen
class CodeContext:
    """A kernel of its own (its own variables and working directory)."""

    id: str
    language: str
    cwd: str


@attrs.frozen
class CodeExecution:
    results: tuple[CodeOutput, ...] = ()
    stdout: tuple[str, ...] = ()
    stderr: tuple[str, ...] = ()
    error: CodeError | None = None
    execution_count: int | None = None

    @property
    def text(self) -> str | None:
        """The cell's value as text (the last expression's), None when it had none."""
        return next((r.text for r in self.results if r.is_main_result), None)


def _output(item: Mapping[str, Any]) -> CodeOutput:
    known = {f.name for f in attrs.fields(CodeOutput)}
    fields: dict[str, Any] = {k: v for k, v in item.items() if k in known}
    for image in ("png", "jpeg"):  # base64 on the wire, bytes here
        if isinstance(fields.get(image), str):
            fields[image] = base64.b64decode(fields[image])
    return CodeOutput(**fields)


class InterpreterHost(Protocol):
    """What the interpreter needs of its sandbox: the members of :class:`hutch.Sandbox` it uses,
    named here so this module does not import the sandbox that imports it."""

    id: str
    url: str | None

    async def read_bytes(self, path: str) -> bytes: ...
    async def write_files(self, files: Files) -> int: ...
    async def create_job(self, command: Sequence[str], *, streams: Mapping[str, Any] | None = None) -> JobHandle: ...
    async def get_job(self, job_id: str) -> Job: ...


class Interpreter:
    """The sandbox's interpreter server, started on first use."""

    def __init__(self, sandbox: InterpreterHost, connection: Connection) -> None:
        self._sandbox = sandbox
        self._connection = connection
        self._token: str | None = None
        self._lock = asyncio.Lock()

    def _base(self) -> str:
        url = self._sandbox.url
        if not url:
            raise InvalidInput(
                f"run_code: sandbox {self._sandbox.id} has no port URL; create it with runtime={RUNTIME!r} and "
                f"network={{'port': {PORT}}} (Workspace(runtime={RUNTIME!r}) does both)", field="runtime")
        return url if url.endswith("/") else url + "/"

    @contextlib.asynccontextmanager
    async def _http(self) -> AsyncIterator[aiohttp.ClientSession]:
        """A session that sends no hutch credential. A server's proxy is reached over a session
        of this module's own; the engine in this process (no server) serves its proxy only on
        its private socket, through the connection's session (it adds the key per request, not
        to the session, so these requests carry none)."""
        connection = self._connection
        if connection.embedded:
            yield await connection.session()
            return
        async with aiohttp.ClientSession() as http:
            yield http

    def _headers(self) -> dict[str, str]:
        assert self._token is not None
        return {"X-Access-Token": self._token}

    async def _ensure(self, http: aiohttp.ClientSession) -> None:
        async with self._lock:
            if self._token is not None:
                return
            try:
                token = (await self._sandbox.read_bytes(TOKEN_FILE)).decode().strip()
            except FileNotFound:
                token = ""
            self._token = token or secrets.token_urlsafe(32)
            if token and await self._answers(http):
                return  # another client of this sandbox started it
            if not token:
                await self._sandbox.write_files({TOKEN_FILE: self._token})
            job = await self._sandbox.create_job(SERVER)
            deadline = time.monotonic() + START_SECONDS
            while not await self._answers(http):
                state = await self._sandbox.get_job(job.id)
                if state.status not in ("pending", "running"):
                    self._token = None
                    raise SandboxError(f"run_code: hutch-interpreter ended ({state.status}, exit {state.exit_code}) "
                                       f"in sandbox {self._sandbox.id}; is its runtime {RUNTIME!r}?",
                                       sandbox_id=self._sandbox.id)
                if time.monotonic() > deadline:
                    self._token = None
                    raise SandboxError(f"run_code: hutch-interpreter did not answer on port {PORT} within "
                                       f"{START_SECONDS:.0f}s", sandbox_id=self._sandbox.id)
                await asyncio.sleep(0.25)

    async def _answers(self, http: aiohttp.ClientSession) -> bool:
        try:
            async with http.get(self._base() + "contexts", headers=self._headers()) as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    async def run_code(
        self,
        code: str,
        *,
        context: CodeContext | str | None = None,
        language: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
    ) -> CodeExecution:
        if not isinstance(code, str):
            raise InvalidInput("code: expected a string of source code", field="code")
        if context is not None and language is not None:
            raise InvalidInput("run_code: give context or language, not both", field="context")
        body: dict[str, Any] = {"code": code, "context_id": getattr(context, "id", context), "language": language,
                                "env_vars": dict(env) if env else None}
        results: list[CodeOutput] = []
        stdout: list[str] = []
        stderr: list[str] = []
        error: CodeError | None = None
        count: int | None = None
        async with self._http() as http:
            await self._ensure(http)  # the server's start is not the cell's time
            try:
                async with http.post(self._base() + "execute", json=body, headers=self._headers(),
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    await _check(resp, "run_code")
                    async for raw in _lines(resp.content):
                        if not raw.strip():
                            continue
                        item = json.loads(raw)
                        kind = item.get("type")
                        if kind in ("stdout", "stderr"):
                            (stdout if kind == "stdout" else stderr).append(item["text"])
                            handler = on_stdout if kind == "stdout" else on_stderr
                            if handler is not None:
                                called = handler(item["text"])
                                if called is not None:
                                    await called
                        elif kind == "result":
                            results.append(_output(item))
                        elif kind == "error":
                            error = CodeError(item.get("name") or "", item.get("value") or "",
                                              item.get("traceback") or "")
                        elif kind == "number_of_executions":
                            count = item.get("execution_count")
            except TimeoutError:
                raise SandboxError(f"run_code: the cell did not finish within {timeout:g}s (it was interrupted; "
                                   "the context keeps its state)", code="EXECUTION_TIMEOUT", status=408,
                                   sandbox_id=self._sandbox.id) from None
        return CodeExecution(tuple(results), tuple(stdout), tuple(stderr), error, count)

    async def create_context(self, *, language: str | None = None, cwd: str | None = None) -> CodeContext:
        body = {k: v for k, v in (("language", language), ("cwd", cwd)) if v is not None}
        async with self._http() as http:
            await self._ensure(http)
            async with http.post(self._base() + "contexts", json=body, headers=self._headers()) as resp:
                await _check(resp, "create_code_context")
                data = await resp.json()
        return CodeContext(data["id"], data["language"], data["cwd"])


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The body's lines, however long: aiohttp's own line reading stops at 512 KiB
    (LineTooLong), and one stdout message or a chart's base64 PNG can be longer."""
    pending = bytearray()
    async for chunk in content.iter_any():
        searched = len(pending)  # what came before holds no newline
        pending += chunk
        while (end := pending.find(b"\n", searched)) >= 0:
            yield bytes(pending[:end])
            del pending[:end + 1]
            searched = 0
    if pending:
        yield bytes(pending)


async def _check(resp: aiohttp.ClientResponse, what: str) -> None:
    if resp.status < 400:
        return
    text = (await resp.text()).strip()
    if resp.status == 400:
        raise InvalidInput(f"{what}: {text}")
    if resp.status == 404:
        raise SandboxError(f"{what}: {text}", code="NOT_FOUND", status=404)
    raise SandboxError(f"{what}: the interpreter answered {resp.status}: {text[:500]}", status=resp.status)
