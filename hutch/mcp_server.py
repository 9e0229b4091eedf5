"""``hutch mcp``: the Workspace's tools over the Model Context Protocol (issue 36).

An MCP client (Claude Desktop, Claude Code, Cursor, …) gets the Workspace's own tools
(hutch/workspace_tools.py: run_code, shell, write_file, read_file, list_files, snapshot), each
with a ``sandbox_id`` argument, plus create_sandbox, list_sandboxes and destroy_sandbox.

A session acts with one hutch API key and so sees only that key's organization: hutch's own
tenancy decides, this module never filters. stdio has one session (the process, with
HUTCH_API_KEY / --api-key); streamable HTTP has one per MCP session, with the key of the
client's ``Authorization: Bearer`` header (hutch/mcp_http.py checks it). The sandboxes a
session creates are destroyed when it ends, unless created with ``keep: true``: an agent that
forgets to clean up (or whose client crashes) must not leave sandboxes holding its
organization's quota, and one that wants its work to outlive the conversation says so.

Needs ``pip install 'hutch[mcp]'`` (the official ``mcp`` SDK); the light SDK never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import jsonschema
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from hutch._bounded import archive_names
from hutch.client import SandboxClient
from hutch.errors import HutchError
from hutch.workspace import DEFAULT_RUNTIME, SANDBOX_ROOT, Workspace
from hutch.workspace_tools import WorkspaceTools

log = logging.getLogger("hutch.mcp")

#: The language run_code uses when a call names none (the Workspace's own default is node, the
#: document's; agents over MCP mostly write Python).
LANGUAGE = "python"
INSTRUCTIONS = (
    "Isolated Linux sandboxes from a hutch server. Call create_sandbox first and pass its "
    "sandbox_id to the other tools; paths are relative to the sandbox's home directory. "
    f"run_code runs {LANGUAGE} unless language says otherwise. Sandboxes you create are destroyed "
    "when this session ends unless created with keep=true."
)
_SANDBOX_ID = {"type": "string", "description": "the sandbox to act in (what create_sandbox answered)"}
_SANDBOX_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "create_sandbox": (
        "Create an isolated sandbox; answers its sandbox_id. It is destroyed when this session ends "
        "unless keep is true.", {
            "type": "object", "required": [], "additionalProperties": False,
            "properties": {
                "runtime": {"type": "string", "description": f"the runtime (default {DEFAULT_RUNTIME}: "
                            "python, node and a shell)"},
                "snapshot": {"type": "string", "description": "start from this snapshot (the snapshot tool's id)"},
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
                "network": {"type": "boolean", "description": "allow outbound network (default: none)"},
                "keep": {"type": "boolean", "description": "keep it after this session ends (default false)"},
            }}),
    "list_sandboxes": ("List the sandboxes of your organization.", {
        "type": "object", "required": [], "additionalProperties": False, "properties": {}}),
    "destroy_sandbox": ("Destroy a sandbox.", {
        "type": "object", "required": ["sandbox_id"], "additionalProperties": False,
        "properties": {"sandbox_id": _SANDBOX_ID}}),
}
_LISTED = 200  # list_sandboxes answers at most this many (a model's context is the limit)
# What one tool call brings from a sandbox into this server (hutch/_bounded.py): a file read,
# each of a run's stdout and stderr. An HTTP server holds every organization's calls at once.
# An answer carries its text twice (content and structuredContent), a byte may take 7 in JSON
# (a NUL, escaped, in JSON text in JSON), and the MCP SDK's client takes events up to 1 MiB:
# 2 streams x 2 copies x 7 x 32 KiB fits.
MAX_BYTES = 32 * 2**10
_NAMES = 1000  # list_files and the snapshot tool name at most this many files


def _workspace_tools() -> dict[str, tuple[str, dict[str, Any]]]:
    """The Workspace's tool definitions, each taking the sandbox it acts in."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for tool in WorkspaceTools.definitions():
        schema = tool["input_schema"]
        schema["properties"] = {"sandbox_id": _SANDBOX_ID, **schema["properties"]}
        schema["required"] = ["sandbox_id", *schema["required"]]
        found[tool["name"]] = (tool["description"], schema)
    return found


TOOLS: dict[str, tuple[str, dict[str, Any]]] = {**_SANDBOX_TOOLS, **_workspace_tools()}


class ToolError(Exception):
    """A call the model got wrong; its message goes back as the tool's error."""


class McpSession:
    """One MCP session: a hutch client with the session's key, and the sandboxes it created."""

    def __init__(self, url: str | None, api_key: str | None, org_id: str | None = None) -> None:
        self.client = SandboxClient(url, api_key, org_id=org_id)
        self.made: dict[str, bool] = {}  # sandbox id -> keep

    async def call(self, name: str, args: Mapping[str, Any]) -> Any:
        if name not in TOOLS:
            raise ToolError(f"unknown tool {name!r}; tools: {', '.join(TOOLS)}")
        errors = sorted(jsonschema.Draft202012Validator(TOOLS[name][1]).iter_errors(dict(args)), key=str)
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path)
            raise ToolError(f"{name}: {where + ': ' if where else ''}{errors[0].message}")
        if name == "create_sandbox":
            return await self._create(args)
        if name == "list_sandboxes":
            return await self._list()
        sandbox_id = str(args["sandbox_id"])
        if name == "destroy_sandbox":
            await self.client.destroy(sandbox_id)
            self.made.pop(sandbox_id, None)
            return {"destroyed": sandbox_id}
        sandbox = await self.client.connect(sandbox_id)  # another organization's: not found
        if name == "snapshot":
            return await self._snapshot(sandbox_id)
        ws = Workspace.over(self.client, sandbox, language=LANGUAGE, max_bytes=MAX_BYTES)
        rest = {k: v for k, v in args.items() if k != "sandbox_id"}
        found = await WorkspaceTools(ws).call(name, rest)
        if name == "list_files" and len(found["files"]) > _NAMES:
            found = {**found, "files": found["files"][:_NAMES], "files_not_listed": len(found["files"]) - _NAMES}
        return found

    async def _snapshot(self, sandbox_id: str) -> dict[str, Any]:
        """The Workspace's snapshot tool answers the snapshot's id and its files' names: taken
        here from the archive as it streams by (the Workspace's own snapshot keeps every file's
        bytes, which this server must not hold)."""
        snap = await self.client.create_snapshot(sandbox_id, name="workspace")
        names, files = await archive_names(self.client.iter_archive(sandbox_id, path=SANDBOX_ROOT, format="tar"),
                                           _NAMES)
        found: dict[str, Any] = {"snapshot_id": snap.snapshot_id, "files": sorted(names)}
        if files > len(names):
            found["files_not_listed"] = files - len(names)
        return found

    async def _create(self, args: Mapping[str, Any]) -> dict[str, Any]:
        snapshot = args.get("snapshot")
        sandbox = await self.client.create(
            runtime=None if snapshot else args.get("runtime") or DEFAULT_RUNTIME, snapshot=snapshot,
            env=args.get("env") or None, network=args.get("network") or None)
        keep = bool(args.get("keep"))
        self.made[sandbox.id] = keep
        return {"sandbox_id": sandbox.id, "status": sandbox.status, "kept": keep}

    async def _list(self) -> dict[str, Any]:
        found = []
        async for info in self.client.iter_sandboxes():
            found.append({"sandbox_id": info.sandbox_id, "status": info.status, "name": info.name,
                          "runtime": info.runtime.name if info.runtime else None, "created_at": info.created_at,
                          "this_session": info.sandbox_id in self.made})
            if len(found) == _LISTED:
                break
        return {"sandboxes": found}

    async def close(self) -> None:
        """Destroy what this session made and did not keep; close the client."""
        doomed = [sid for sid, keep in self.made.items() if not keep]
        self.made.clear()
        try:
            results = await asyncio.gather(*(self.client.destroy(sid) for sid in doomed), return_exceptions=True)
            for sid, result in zip(doomed, results, strict=True):
                if isinstance(result, BaseException) and not _gone(result):
                    log.warning("could not destroy %s at the session's end: %s", sid, result)
        finally:
            await self.client.close()


def _gone(err: BaseException) -> bool:
    return isinstance(err, HutchError) and err.status == 404  # the model destroyed it by another way


async def answer(sessions: McpSessions, ctx: Any, name: str, args: Mapping[str, Any] | None) -> types.CallToolResult:
    """Run one call; every failure is a tool error with hutch's message, never the server's."""
    try:
        result = await sessions.of(ctx).call(name, args or {})
    except (ToolError, HutchError, ValueError, RuntimeError) as err:
        message = err.message if isinstance(err, HutchError) else str(err)
        code = f" [{err.code}]" if isinstance(err, HutchError) and err.code else ""
        return types.CallToolResult(content=[types.TextContent(type="text", text=message + code)], is_error=True)
    except Exception as err:  # a bug of ours: said to the model, logged, and the server goes on
        log.exception("tool %s failed", name)
        text = f"{name} failed unexpectedly: {type(err).__name__}: {err}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(result))],
                                structured_content=result)


def tool_list() -> list[types.Tool]:
    return [types.Tool(name=name, description=desc, input_schema=schema) for name, (desc, schema) in TOOLS.items()]


class McpSessions:
    """Finds the session of a request. stdio: the one of the process. HTTP: one per MCP
    connection, made at its first tool call with the key its requests carry and ended with
    it; the ending runs as a task of ours, because the SDK gives a connection's cleanup only a
    few seconds."""

    def __init__(self, url: str | None, api_key: str | None = None, *, per_connection: bool,
                 org_id: str | None = None) -> None:
        self.url, self.api_key, self.per_connection, self.org_id = url, api_key, per_connection, org_id
        self._only: McpSession | None = None
        self._ending: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()

    def of(self, ctx: Any) -> McpSession:
        if not self.per_connection:
            if self._only is None:
                self._only = McpSession(self.url, self.api_key, self.org_id)
            return self._only
        # The SDK keeps a connection's state and cleanup on its Connection; the request's
        # session proxy is the one way a lowlevel handler reaches it.
        connection = ctx.session._connection
        found = connection.state.get("hutch")
        if found is None:
            headers = getattr(ctx.request, "headers", None) or {}
            key = bearer_key(headers.get("authorization"))
            if key is None:  # never None behind mcp_http's gate; without a key the client would use this machine's
                raise ToolError("this request carries no hutch API key (Authorization: Bearer KEY)")
            found = connection.state["hutch"] = McpSession(self.url, key)
            connection.exit_stack.push_async_callback(self._end, found)
        assert isinstance(found, McpSession)
        return found

    async def _end(self, session: McpSession) -> None:
        task = asyncio.get_running_loop().create_task(session.close())
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def close(self) -> None:
        """At shutdown: end the stdio session, wait for the HTTP sessions' endings."""
        try:
            if self._only is not None:
                only, self._only = self._only, None
                await only.close()
            if self._ending:
                await asyncio.gather(*list(self._ending), return_exceptions=True)
        finally:
            self.closed.set()


def bearer_key(authorization: str | None) -> str | None:
    """The hutch key of an ``Authorization: Bearer KEY`` header's value."""
    scheme, _, key = (authorization or "").strip().partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


def build_server(sessions: McpSessions) -> Server[Any]:
    @contextlib.asynccontextmanager
    async def lifespan(_: Server[Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            yield {}
        finally:
            # Shielded: the server may be leaving because it was cancelled (SIGTERM, shutdown),
            # and this is what destroys the sessions' sandboxes.
            with anyio.CancelScope(shield=True), anyio.move_on_after(60):
                await sessions.close()

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tool_list())

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await answer(sessions, ctx, params.name, params.arguments)

    from hutch._version import __version__

    return Server("hutch", version=__version__, instructions=INSTRUCTIONS, lifespan=lifespan,
                  on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(url: str | None, api_key: str | None, org_id: str | None = None) -> None:
    """One session over this process's stdin and stdout, until the client closes stdin, or
    SIGTERM / SIGINT (what a client sends when a server is slow to leave; Ctrl-C). ``org_id``:
    the organization a key that may act for several acts in (default: the key's own)."""
    sessions = McpSessions(url, api_key, per_connection=False, org_id=org_id)
    server = build_server(sessions)
    serving, loop = asyncio.current_task(), asyncio.get_running_loop()
    assert serving is not None

    def stop() -> None:
        serving.cancel()  # the server's lifespan ends the session and destroys its sandboxes
        loop.create_task(_leave_once_closed(sessions))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _leave_once_closed(sessions: McpSessions) -> None:
    # The SDK reads stdin in a worker thread that only end-of-file ends, so a cancelled server
    # never finishes leaving while the client holds stdin open: once the session is closed
    # (its sandboxes destroyed), nothing is left to do but exit.
    await sessions.closed.wait()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
