"""A workspace as tools for an LLM agent (what the document's ``createSandboxTools`` promised).

    tools = workspace.tools()
    tools.openai()       # [{"type": "function", "function": {name, description, parameters}}]
    tools.anthropic()    # [{"name", "description", "input_schema"}]
    reply = await tools.dispatch(call)   # an OpenAI tool call or an Anthropic tool_use block

``dispatch`` answers in the call's own format: ``{"role": "tool", "tool_call_id", "content"}``
for OpenAI, ``{"type": "tool_result", "tool_use_id", "content", "is_error"}`` for Anthropic.
A bad call (unknown tool, arguments that are not JSON, miss a field or do not fit its schema,
a path outside the workspace) is an error result the model can read, never an exception in
the agent loop, and runs nothing.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from typing import Any, Protocol


class Ran(Protocol):
    """What a run answers (``hutch.workspace.CodeResult``)."""

    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...
    @property
    def exit_code(self) -> int: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def error(self) -> str | None: ...


class Snapshotted(Protocol):
    """What a snapshot answers (``hutch.workspace.WorkspaceSnapshot``)."""

    @property
    def files(self) -> Mapping[str, str]: ...
    @property
    def snapshot_id(self) -> str | None: ...


class WorkspaceLike(Protocol):
    """What the tools call on a workspace (:class:`hutch.workspace.Workspace` is one): typed on
    this rather than on the class, so that the workspace can import its tools and not the
    other way round."""

    async def run(self, code: str, *, language: str | None = None,
                  timeout_seconds: float | None = None) -> Ran: ...
    async def shell(self, command: str, *, timeout_seconds: float | None = None) -> Ran: ...
    async def write_file(self, path: str, contents: str) -> None: ...
    async def read_file(self, path: str) -> str | None: ...
    async def list_files(self, path: str = ".") -> list[dict[str, Any]]: ...
    async def snapshot(self) -> Snapshotted: ...


_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "run_code": ("Run code in the workspace and get its stdout, stderr and exit code.", {
        "type": "object", "required": ["code"], "additionalProperties": False,
        "properties": {"code": {"type": "string"},
                       "language": {"type": "string", "enum": ["node", "python", "shell"]},
                       "timeout_seconds": {"type": "number", "minimum": 1, "maximum": 3600}}}),
    "shell": ("Run a shell command in the workspace.", {
        "type": "object", "required": ["command"], "additionalProperties": False,
        "properties": {"command": {"type": "string"}, "timeout_seconds": {"type": "number", "minimum": 1}}}),
    "write_file": ("Write a file in the workspace (parent directories are made).", {
        "type": "object", "required": ["path", "contents"], "additionalProperties": False,
        "properties": {"path": {"type": "string"}, "contents": {"type": "string"}}}),
    "read_file": ("Read a file of the workspace; null when it does not exist.", {
        "type": "object", "required": ["path"], "additionalProperties": False,
        "properties": {"path": {"type": "string"}}}),
    "list_files": ("List a directory of the workspace (default: its root): each entry's name, "
                   "whether it is a directory, and its size.", {
        "type": "object", "required": [], "additionalProperties": False,
        "properties": {"path": {"type": "string"}}}),
    "snapshot": ("Save the workspace's files; answers the snapshot id (a new sandbox can start "
                 "from it) and the files saved.", {
        "type": "object", "required": [], "additionalProperties": False, "properties": {}}),
}


def _check(tool: str, key: str, value: object, schema: Mapping[str, Any]) -> None:
    """One argument against its schema (the subset the tools use: a string or a number, an enum,
    bounds), a ValueError naming it: a model's ``"timeout_seconds": "5"`` was a TypeError out of
    ``dispatch``, raised after its command had started (and left it running), and ``-3`` ended
    a command at once as timed out."""
    kind = schema.get("type")
    if kind == "string" and not isinstance(value, str):
        raise ValueError(f"{tool}: {key}: expected a string, got {value!r}")
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{tool}: {key}: expected a number, got {value!r}")
        if ("minimum" in schema and value < schema["minimum"]) or ("maximum" in schema and value > schema["maximum"]):
            bounds = f"from {schema['minimum']} to {schema['maximum']}" if "maximum" in schema else \
                f"of at least {schema['minimum']}"
            raise ValueError(f"{tool}: {key}: expected a number {bounds}, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        raise ValueError(f"{tool}: {key}: expected one of {', '.join(map(str, schema['enum']))}, got {value!r}")


class WorkspaceTools:
    def __init__(self, workspace: WorkspaceLike) -> None:
        self.workspace = workspace

    def openai(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": n, "description": d, "parameters": p}}
                for n, (d, p) in _SPECS.items()]

    def anthropic(self) -> list[dict[str, Any]]:
        return self.definitions()

    @staticmethod
    def definitions() -> list[dict[str, Any]]:
        """Each tool's name, description and JSON Schema (fresh copies: callers may extend them),
        for a server that serves these tools to other clients (hutch/mcp_server.py)."""
        return [{"name": n, "description": d, "input_schema": copy.deepcopy(p)} for n, (d, p) in _SPECS.items()]

    async def call(self, name: str, args: Mapping[str, Any]) -> Any:
        """Run one tool; its result as JSON-ready data (ValueError for a bad call)."""
        if name not in _SPECS:
            raise ValueError(f"unknown tool {name!r}; tools: {', '.join(_SPECS)}")
        required, props = _SPECS[name][1]["required"], _SPECS[name][1]["properties"]
        missing = [k for k in required if k not in args]
        extra = [k for k in args if k not in props]
        if missing or extra:
            raise ValueError(f"{name}: missing {missing} / unknown {extra} arguments")
        for key, value in args.items():
            if value is not None or key in required:  # null for an optional one: its default, as absent
                _check(name, key, value, props[key])
        ws = self.workspace
        if name == "run_code":
            r = await ws.run(str(args["code"]), language=args.get("language"), timeout_seconds=args.get("timeout_seconds"))
        elif name == "shell":
            r = await ws.shell(str(args["command"]), timeout_seconds=args.get("timeout_seconds"))
        elif name == "write_file":
            await ws.write_file(str(args["path"]), str(args["contents"]))
            return {"written": args["path"]}
        elif name == "read_file":
            return {"path": args["path"], "contents": await ws.read_file(str(args["path"]))}
        elif name == "list_files":
            path = str(args.get("path") or ".")
            return {"path": path, "files": await ws.list_files(path)}
        else:
            snap = await ws.snapshot()
            return {"snapshot_id": snap.snapshot_id, "files": sorted(snap.files)}
        ran = {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code, "timed_out": r.timed_out}
        return {**ran, "error": r.error} if r.error else ran

    async def dispatch(self, call: Mapping[str, Any]) -> dict[str, Any]:
        """Answer an OpenAI tool call (``{"id", "function": {"name", "arguments"}}``) or an
        Anthropic tool use (``{"type": "tool_use", "id", "name", "input"}``) in its format."""
        anthropic = call.get("type") == "tool_use"
        try:
            if anthropic:
                name, args = str(call.get("name")), call.get("input") or {}
            else:
                fn = call.get("function") or {}
                name, raw = str(fn.get("name")), fn.get("arguments") or "{}"
                args = json.loads(raw) if isinstance(raw, str) else raw
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
            content, error = json.dumps(await self.call(name, args)), False
        except (ValueError, RuntimeError) as err:  # json errors are ValueErrors too
            content, error = json.dumps({"error": str(err)}), True
        if anthropic:
            return {"type": "tool_result", "tool_use_id": call.get("id"), "content": content, "is_error": error}
        return {"role": "tool", "tool_call_id": call.get("id"), "content": content}
