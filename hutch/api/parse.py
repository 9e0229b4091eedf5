"""Turns wire JSON into validated domain values: the requests' bodies (what
api/wire_schemas.py describes) into ``SandboxSpec``, ``CreateRequest``, ``ExecuteRequest`` ….

Every check names the field it rejects (``resources.memory: invalid value 'lots'…``).
The answers go the other way in api/render.py.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from hutch.core import egress, limits, runtimes
from hutch.core.errors import InvalidInput, NotSupported, RuntimeNotFound
from hutch.core.models import (
    Mode,
    NetworkSpec,
    ResourceSpec,
    SandboxSpec,
    SnapshotState,
    TimeoutSpec,
)
from hutch.core.packages import check_dependencies, check_packages
from hutch.core.quantities import parse_bytes, parse_duration, parse_millicores
from hutch.drivers.base import FileWrite
from hutch.service.output import StreamOptions
from hutch.service.requests import CreateRequest, ExecuteRequest

MAX_FILES = 1000
_ENV_NAME_OK = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def expect(body: Mapping[str, Any], key: str, types: type | tuple[type, ...], what: str, prefix: str = "") -> Any:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise InvalidInput(f"{prefix}{key}: expected {what}, got {value!r}", field=prefix + key)
    if not isinstance(value, types):
        raise InvalidInput(f"{prefix}{key}: expected {what}, got {type(value).__name__}", field=prefix + key)
    return value


def _object(body: Mapping[str, Any], key: str, prefix: str = "") -> Mapping[str, Any]:
    return expect(body, key, dict, "an object", prefix) or {}


def parse_command(value: object, field: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise InvalidInput(f"{field}: expected a non-empty array of strings", field=field)
    for i, part in enumerate(value):
        if not isinstance(part, str):
            raise InvalidInput(f"{field}[{i}]: expected a string, got {type(part).__name__}", field=field)
        if "\x00" in part:
            raise InvalidInput(f"{field}[{i}]: contains a NUL byte", field=field)
    limits.check_argv(value, field)
    return tuple(value)


def parse_env(value: object, field: str = "env", *, allow_null: bool = False) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{field}: expected an object of string values", field=field)
    limits.check_env_count(len(value), field)  # before looking at each of 30,000
    out: dict[str, Any] = {}
    for k, v in value.items():
        limits.check_env_entry(k, v if isinstance(v, str) else None, field)
        if not k or not set(k) <= _ENV_NAME_OK or k[0].isdigit():
            raise InvalidInput(
                f"{field}.{k}: invalid variable name (letters, digits and _; not starting with a digit)",
                field=f"{field}.{k}",
            )
        if v is None and allow_null:
            out[k] = None
            continue
        if not isinstance(v, str):
            raise InvalidInput(f"{field}.{k}: expected a string, got {type(v).__name__}", field=f"{field}.{k}")
        if "\x00" in v:
            raise InvalidInput(f"{field}.{k}: contains a NUL byte", field=f"{field}.{k}")
        out[k] = v
    return out


def parse_files(value: object, field: str) -> list[FileWrite]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput(f"{field}: expected an array of {{path, content}}", field=field)
    if len(value) > MAX_FILES:
        raise InvalidInput(f"{field}: at most {MAX_FILES} files per request", field=field)
    files = []
    for i, item in enumerate(value):
        f = f"{field}[{i}]"
        if not isinstance(item, dict):
            raise InvalidInput(f"{f}: expected an object with path and content", field=f)
        path, content = item.get("path"), item.get("content")
        if not isinstance(path, str) or not path.strip():
            raise InvalidInput(f"{f}.path: expected a non-empty string", field=f + ".path")
        if "\x00" in path:
            raise InvalidInput(f"{f}.path: contains a NUL byte", field=f + ".path")
        if len(path.encode()) > limits.PATH_BYTES:
            raise InvalidInput(f"{f}.path: longer than {limits.PATH_BYTES} bytes (PATH_MAX)", field=f + ".path")
        if not isinstance(content, str):
            raise InvalidInput(f"{f}.content: expected a base64 string", field=f + ".content")
        try:
            data = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError) as err:
            raise InvalidInput(f"{f}.content: not valid base64", field=f + ".content") from err
        files.append(FileWrite(path=path, content=data))
    return files


def parse_stream(body: Mapping[str, Any]) -> StreamOptions:
    """``stream``: ``timestamps`` (each output line prefixed with its time), ``stdout`` /
    ``stderr`` as ``"ignore"``, and ``stdin`` as ``"ignore"`` or a stdin stream's id
    (``POST /streams``). Agentuity stream-service ids for output are not served here: refused by
    name, never ignored (the output is at the stream URLs hutch returns)."""
    stream = _object(body, "stream")
    ignore = set()
    for name in ("stdout", "stderr"):
        value = expect(stream, name, str, '"ignore"', "stream.")
        if value == "ignore":
            ignore.add(name)
        elif value is not None:
            raise NotSupported(f"stream.{name}: {value!r} names an Agentuity stream-service stream for output, "
                               f"which hutch does not serve; leave it out (hutch's stream URLs carry the output) "
                               f"or use \"ignore\"", field=f"stream.{name}")
    stdin = expect(stream, "stdin", str, '"ignore" or a stdin stream id (POST /streams)', "stream.")
    timestamps = expect(stream, "timestamps", bool, "true or false", "stream.")
    return StreamOptions(timestamps=bool(timestamps), ignore=frozenset(ignore),
                         stdin=stdin if stdin and stdin != "ignore" else None)


MIN_DISK = 16 * 2**20  # the file system a limit makes needs room for itself and the skeleton


def parse_create(body: Mapping[str, Any], snapshot: SnapshotState | None = None) -> CreateRequest:
    """``snapshot``: what the body's ``snapshot`` reference resolved to (the route resolves
    it, since that reads the store); its runtime and env are the new sandbox's base."""
    if not isinstance(body, dict):
        raise InvalidInput("body: expected a JSON object", field="body")
    _check_snapshot_ref(body, snapshot)
    dependencies = check_dependencies(body.get("dependencies"))
    packages = check_packages(body.get("packages"))
    recipe = _parse_runtime(body, snapshot)
    resources = _parse_resources(body)
    network = _parse_network(body)
    timeouts = _parse_timeouts(body)
    cmd_obj = _object(body, "command")
    command, mode = _parse_initial_command(cmd_obj, given=body.get("command") is not None)
    metadata = expect(body, "metadata", dict, "an object")
    limits.check_metadata(metadata)
    files = parse_files(body.get("files"), "files") + parse_files(cmd_obj.get("files"), "command.files")
    name, description = expect(body, "name", str, "a string"), expect(body, "description", str, "a string")
    limits.check_chars(name, "name", limits.NAME_CHARS)
    limits.check_chars(description, "description", limits.TEXT_CHARS)
    spec = SandboxSpec(
        runtime=recipe.name,
        runtime_id=recipe.id,
        mode=mode,
        name=name,
        description=description,
        resources=resources,
        env={**(snapshot.env if snapshot else {}), **parse_env(body.get("env"))},
        network=network,
        timeout=timeouts,
        command=command,
        metadata=metadata,
        project_id=expect(body, "projectId", str, "a string"),
        snapshot_id=snapshot.snapshot_id if snapshot else None,
        dependencies=_merged(snapshot.dependencies if snapshot else (), dependencies),
        packages=_merged(snapshot.packages if snapshot else (), packages),
    )
    limits.check_env(spec.env)  # the snapshot's and the body's together: what every command starts with
    if body.get("scopes"):
        raise NotSupported("scopes: hutch has no Agentuity services (key-value, vector, object storage) to grant "
                           "a sandbox access to; leave scopes out", field="scopes")
    return CreateRequest(spec=spec, files=files, command=command, stream=parse_stream(body))


def _check_snapshot_ref(body: Mapping[str, Any], snapshot: SnapshotState | None) -> None:
    if body.get("snapshot") is not None:
        if snapshot is None:
            raise InvalidInput("snapshot: the reference was not resolved", field="snapshot")
        if body.get("runtime") is not None or body.get("runtimeId") is not None:
            raise InvalidInput("snapshot: give either snapshot or runtime/runtimeId, not both; "
                               "a snapshot brings its own runtime", field="snapshot")


def _parse_runtime(body: Mapping[str, Any], snapshot: SnapshotState | None) -> runtimes.RuntimeRecipe:
    """The runtime the sandbox runs: the snapshot's, else ``runtime`` or ``runtimeId``, else the default."""
    runtime_name = expect(body, "runtime", str, "a runtime name such as python:3.13")
    runtime_id = expect(body, "runtimeId", str, "a runtime id (srt_...)")
    if runtime_name and runtime_id:
        a, b = runtimes.find(runtime_name), runtimes.find(runtime_id)
        if a is None or b is None or a.name != b.name:
            raise InvalidInput("runtime and runtimeId name different runtimes; give one", field="runtimeId")
    wanted = (snapshot.runtime if snapshot else None) or runtime_name or runtime_id or runtimes.DEFAULT_RUNTIME
    recipe = runtimes.find(wanted)
    if recipe is None:
        known = ", ".join(r.name for r in runtimes.CATALOG)
        field = "runtime" if runtime_name else "runtimeId"
        raise RuntimeNotFound(f"{field}: unknown runtime {wanted!r}; known runtimes: {known}", field=field)
    return recipe


def _parse_resources(body: Mapping[str, Any]) -> ResourceSpec:
    """As given; what is left out gets the server's defaults later (service/defaults.py)."""
    res = _object(body, "resources")
    memory = expect(res, "memory", (str, int), "a size such as 512Mi", "resources.")
    cpu = expect(res, "cpu", (str, int, float), "cpu such as 500m or 1", "resources.")
    disk = expect(res, "disk", (str, int), "a size such as 1Gi", "resources.")
    resources = ResourceSpec(
        memory=str(memory) if memory is not None else None,
        cpu=str(cpu) if cpu is not None else None,
        disk=str(disk) if disk is not None else None,
        memory_bytes=parse_bytes("resources.memory", memory) if memory is not None else None,
        cpu_millis=parse_millicores("resources.cpu", cpu) if cpu is not None else None,
        disk_bytes=parse_bytes("resources.disk", disk) if disk is not None else None,
    )
    if resources.disk_bytes is not None and resources.disk_bytes < MIN_DISK:
        raise InvalidInput(f"resources.disk: at least {MIN_DISK >> 20}Mi is needed for a sandbox's own files, "
                           f"got {disk}", field="resources.disk")
    if resources.memory_bytes is not None and resources.memory_bytes < 16 * 2**20:
        raise InvalidInput("resources.memory: at least 16Mi is needed to start a sandbox", field="resources.memory")
    return resources


def _parse_network(body: Mapping[str, Any]) -> NetworkSpec:
    net = _object(body, "network")
    enabled = expect(net, "enabled", bool, "true or false", "network.") or False
    port = expect(net, "port", int, "an integer port", "network.")
    if port is not None and not 1024 <= port <= 65535:
        raise InvalidInput(f"network.port: {port} is outside 1024-65535", field="network.port")
    return NetworkSpec(enabled=enabled, port=port, **egress_lists(net, enabled))


def parse_network_update(body: Mapping[str, Any]) -> tuple[bool, tuple[str, ...], tuple[str, ...]]:
    """PUT /sandbox/{id}/network: ``enabled`` (required), and ``allow`` or ``deny``."""
    enabled = expect(body, "enabled", bool, "true or false")
    if enabled is None:
        raise InvalidInput("enabled: required: true (with allow or deny, or neither: unrestricted) or false",
                           field="enabled")
    lists = egress_lists(body, enabled)
    return enabled, lists["allow"], lists["deny"]


def egress_lists(net: Mapping[str, Any], enabled: bool) -> dict[str, tuple[str, ...]]:
    """``network.allow`` and ``network.deny`` of a create or a network update: one or the other."""
    allow = egress.parse_allow(net["allow"]) if net.get("allow") is not None else ()
    deny = egress.parse_deny(net["deny"]) if net.get("deny") is not None else ()
    for field, given in (("allow", allow), ("deny", deny)):
        if given and not enabled:
            raise InvalidInput(f"network.{field}: limits an enabled network; add network.enabled: true",
                               field=f"network.{field}")
    if allow and deny:
        raise InvalidInput("network.deny: with network.allow everything it does not list is denied already; "
                           "give one of them", field="network.deny")
    return {"allow": allow, "deny": deny}


def _parse_timeouts(body: Mapping[str, Any]) -> TimeoutSpec:
    tmo = _object(body, "timeout")
    timeouts = {}
    for key in ("idle", "execution", "paused"):
        value = expect(tmo, key, str, "a duration such as 30s or 5m", "timeout.")
        if value is not None:
            parse_duration(f"timeout.{key}", value)
        timeouts[key] = value
    return TimeoutSpec(**timeouts)


def _parse_initial_command(cmd_obj: Mapping[str, Any], *, given: bool) -> tuple[tuple[str, ...] | None, Mode]:
    """``command``: the command a sandbox starts with and whether it ends with it (oneshot).
    Given at all (``{}`` too), it needs its ``exec``: an empty object is not "no command"."""
    command = parse_command(cmd_obj["exec"], "command.exec") if cmd_obj.get("exec") is not None else None
    if given and command is None:
        raise InvalidInput("command.exec: required when command is given", field="command.exec")
    mode_raw = expect(cmd_obj, "mode", str, "oneshot or interactive", "command.")
    try:
        mode = Mode(mode_raw) if mode_raw else Mode.INTERACTIVE
    except ValueError as err:
        raise InvalidInput(f"command.mode: expected oneshot or interactive, got {mode_raw!r}", field="command.mode") from err
    if mode is Mode.ONESHOT and command is None:
        raise InvalidInput("command.exec: a oneshot sandbox needs a command", field="command.exec")
    return command, mode


def _merged(base: tuple[str, ...], extra: tuple[str, ...]) -> tuple[str, ...]:
    return base + tuple(x for x in extra if x not in base)


def parse_execute(body: Mapping[str, Any]) -> ExecuteRequest:
    if not isinstance(body, dict):
        raise InvalidInput("body: expected a JSON object", field="body")
    if body.get("command") is None:
        raise InvalidInput("command: required (an array of strings)", field="command")
    timeout_raw = expect(body, "timeout", (str, int, float), "a duration such as 30s")
    return ExecuteRequest(
        command=parse_command(body["command"], "command"),
        files=parse_files(body.get("files"), "files"),
        timeout=parse_duration("timeout", timeout_raw) if timeout_raw is not None else None,
        stream=parse_stream(body),
    )


def parse_job(body: Mapping[str, Any]) -> tuple[str, ...]:
    if body.get("command") is None:
        raise InvalidInput("command: required (an array of strings)", field="command")
    return parse_command(body["command"], "command")
