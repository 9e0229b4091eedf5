"""Turns wire JSON into validated domain values and domain values into wire JSON.

Every check names the field it rejects (``resources.memory: invalid value 'lots'…``).
Optional fields are omitted, never ``null``: the real client's zod schemas reject null.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping
from typing import Any

from hutch.core import egress, limits, runtimes
from hutch.core.errors import InvalidInput, NotSupported, RuntimeNotFound
from hutch.core.events import Event, encode
from hutch.core.models import (
    Execution,
    Mode,
    Network,
    Resources,
    Sandbox,
    SandboxSpec,
    Snapshot,
    Timeouts,
)
from hutch.core.packages import check_dependencies, check_packages
from hutch.core.quantities import parse_bytes, parse_duration, parse_millicores
from hutch.drivers.base import FileToWrite, Usage
from hutch.service.output import StreamOptions
from hutch.service.requests import CreateRequest, ExecuteRequest


def org_ref(org_id: str) -> dict[str, str]:
    """An organization as the wire names it: its id is ``org_`` + its name (core/tenancy.py)."""
    return {"id": org_id, "name": org_id.removeprefix("org_")}
USER = {"id": "user_local"}  # one tenant: every private snapshot is this user's
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


def parse_files(value: object, field: str) -> list[FileToWrite]:
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
        files.append(FileToWrite(path=path, content=data))
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


def parse_create(body: Mapping[str, Any], snapshot: Snapshot | None = None) -> CreateRequest:
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


def _check_snapshot_ref(body: Mapping[str, Any], snapshot: Snapshot | None) -> None:
    if body.get("snapshot") is not None:
        if snapshot is None:
            raise InvalidInput("snapshot: the reference was not resolved", field="snapshot")
        if body.get("runtime") is not None or body.get("runtimeId") is not None:
            raise InvalidInput("snapshot: give either snapshot or runtime/runtimeId, not both; "
                               "a snapshot brings its own runtime", field="snapshot")


def _parse_runtime(body: Mapping[str, Any], snapshot: Snapshot | None) -> runtimes.RuntimeRecipe:
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


def _parse_resources(body: Mapping[str, Any]) -> Resources:
    """As given; what is left out gets the server's defaults later (service/defaults.py)."""
    res = _object(body, "resources")
    memory = expect(res, "memory", (str, int), "a size such as 512Mi", "resources.")
    cpu = expect(res, "cpu", (str, int, float), "cpu such as 500m or 1", "resources.")
    disk = expect(res, "disk", (str, int), "a size such as 1Gi", "resources.")
    resources = Resources(
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


def _parse_network(body: Mapping[str, Any]) -> Network:
    net = _object(body, "network")
    enabled = expect(net, "enabled", bool, "true or false", "network.") or False
    port = expect(net, "port", int, "an integer port", "network.")
    if port is not None and not 1024 <= port <= 65535:
        raise InvalidInput(f"network.port: {port} is outside 1024-65535", field="network.port")
    allow = egress.parse_allow(net["allow"]) if net.get("allow") is not None else ()
    if allow and not enabled:
        raise InvalidInput("network.allow: limits an enabled network; add network.enabled: true", field="network.allow")
    return Network(enabled=enabled, port=port, allow=allow)


def _parse_timeouts(body: Mapping[str, Any]) -> Timeouts:
    tmo = _object(body, "timeout")
    timeouts = {}
    for key in ("idle", "execution", "paused"):
        value = expect(tmo, key, str, "a duration such as 30s or 5m", "timeout.")
        if value is not None:
            parse_duration(f"timeout.{key}", value)
        timeouts[key] = value
    return Timeouts(**timeouts)


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


# ---------------------------------------------------------------- rendering


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def runtime_summary(name: str) -> dict[str, Any]:
    recipe = runtimes.find(name)
    if recipe is None:
        return {"id": "srt_unknown", "name": name}
    return _drop_none(
        {"id": recipe.id, "name": recipe.name, "iconUrl": recipe.icon_url, "brandColor": recipe.brand_color, "tags": list(recipe.tags)}
    )


def runtime_info(recipe: runtimes.RuntimeRecipe, available: bool, built: dict[str, Any] | None = None,
                 building: bool = False) -> dict[str, Any]:
    """``built``: the driver's facts of its build (``sizeBytes``, ``builtAt``, ``buildSeconds``)."""
    req = recipe.requirements
    return _drop_none(
        {
            "id": recipe.id,
            "name": recipe.name,
            "description": recipe.description,
            "iconUrl": recipe.icon_url,
            "brandColor": recipe.brand_color,
            "url": recipe.url,
            "tags": list(recipe.tags),
            "requirements": _drop_none(
                {"memory": req.memory, "cpu": req.cpu, "disk": req.disk, "networkEnabled": req.network_enabled}
            ),
            "readme": recipe.readme,
            "available": available,  # hutch extras: built on this host (else built on first use),
            "building": building or None,  # being built now, its size and last build
            **(built or {}),
        }
    )


def sandbox_info(sb: Sandbox, stream_urls: tuple[str, str] | None, url: str | None = None,
                 usage: Usage | None = None) -> dict[str, Any]:
    """``stream_urls``: the initial command's (stdout, stderr) URLs, if it had one; ``url``:
    where its exposed port is served (api/routes/proxy.py), if it has one; ``usage``: what a
    live sandbox has used so far (an ended one's was recorded as it ended)."""
    spec = sb.spec
    cpu = usage.cpu_seconds if usage and usage.cpu_seconds is not None else sb.cpu_seconds
    peak = usage.memory_peak_bytes if usage and usage.memory_peak_bytes is not None else sb.memory_peak_bytes
    return _drop_none(
        {
            "sandboxId": sb.sandbox_id,
            "identifier": sb.sandbox_id.removeprefix("sbx_")[-12:],
            "name": spec.name,
            "description": spec.description,
            "status": sb.status.value,
            "mode": spec.mode.value,
            "createdAt": sb.created_at,
            "updatedAt": sb.updated_at,
            "region": "local",
            "runtime": runtime_summary(spec.runtime),
            "executions": sb.executions,
            "exitCode": sb.exit_code if sb.status.is_final else None,
            "stdoutStreamUrl": stream_urls[0] if stream_urls else None,
            "stderrStreamUrl": stream_urls[1] if stream_urls else None,
            "metadata": spec.metadata,
            "resources": _drop_none({"memory": spec.resources.memory, "cpu": spec.resources.cpu, "disk": spec.resources.disk}),
            "networkEnabled": spec.network.enabled,
            "networkPort": spec.network.port,
            "networkAllow": list(spec.network.allow) or None,  # hutch's extension
            "url": url,
            "org": org_ref(spec.org_id),
            "projectId": spec.project_id,
            "timeout": _drop_none({"idle": spec.timeout.idle, "execution": spec.timeout.execution, "paused": spec.timeout.paused}),
            "command": _drop_none({"exec": list(spec.command), "mode": spec.mode.value}) if spec.command else None,
            "snapshot": {"id": spec.snapshot_id, "public": False, "user": USER} if spec.snapshot_id else None,
            "dependencies": list(spec.dependencies) or None,  # hutch extra
            "packages": list(spec.packages) or None,  # hutch extra
            "reason": sb.reason,  # hutch extra: why it failed or ended
            "cpuTimeMs": round(cpu * 1000) if cpu is not None else None,
            # Peak x lifetime: an upper bound of the byte-seconds it held (what stats counts too).
            "memoryByteSec": round(peak * _lifetime(sb)) if peak is not None and sb.status.is_final else None,
            "memoryPeakBytes": peak,  # hutch extra
        }
    )


def _lifetime(sb: Sandbox) -> float:
    def unix(iso: str) -> float:
        return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()

    return max(0.0, unix(sb.updated_at) - unix(sb.created_at))


_JOB_STATUS = {"queued": "pending", "running": "running", "cancelled": "cancelled", "failed": "failed", "timeout": "failed"}


def job_info(job: Execution, stdout_url: str, stderr_url: str) -> dict[str, Any]:
    """Jobs are executions of kind "job"; the wire gives them their own statuses."""
    status = _JOB_STATUS.get(job.status.value) or ("completed" if job.exit_code == 0 else "failed")
    return _drop_none(
        {
            "jobId": job.execution_id,
            "sandboxId": job.sandbox_id,
            "command": list(job.command),
            "status": status,
            "exitCode": job.exit_code,
            "startedAt": job.started_at,
            "completedAt": job.completed_at,
            "error": job.error,
            "stdoutStreamUrl": stdout_url,
            "stderrStreamUrl": stderr_url,
        }
    )


def parse_job(body: Mapping[str, Any]) -> tuple[str, ...]:
    if body.get("command") is None:
        raise InvalidInput("command: required (an array of strings)", field="command")
    return parse_command(body["command"], "command")


def execution_info(ex: Execution, stdout_url: str | None, stderr_url: str | None) -> dict[str, Any]:
    return _drop_none(
        {
            "executionId": ex.execution_id,
            "sandboxId": ex.sandbox_id,
            "type": ex.type,
            "status": ex.status.value,
            "command": list(ex.command),
            "exitCode": ex.exit_code,
            "durationMs": ex.duration_ms,
            "startedAt": ex.started_at,
            "completedAt": ex.completed_at,
            "error": ex.error,
            "stdoutStreamUrl": stdout_url,
            "stderrStreamUrl": stderr_url,
            "outputTruncated": ex.output_truncated,
        }
    )


def _full_name(snap: Snapshot) -> str:
    org = org_ref(snap.org_id)["name"]
    return f"@{org}/{snap.name}:{snap.tag}" if snap.tag else f"@{org}/{snap.name}"


def snapshot_info(snap: Snapshot, download_url: str | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "snapshotId": snap.snapshot_id,
        "runtimeId": snap.runtime_id,
        "runtime": snap.runtime,  # hutch extra: the runtime's name
        "name": snap.name,
        "fullName": _full_name(snap),
        "description": snap.description,
        "message": snap.message,
        "tag": snap.tag,
        "sizeBytes": snap.size_bytes,
        "fileCount": snap.file_count,
        "parentSnapshotId": snap.parent_snapshot_id,
        "sourceSandboxId": snap.source_sandbox_id,  # hutch extra
        "projectId": snap.project_id,  # hutch extra: its sandbox's project (absent: organization-wide)
        "status": snap.status.value,  # hutch extra: building | ready
        "public": snap.public,
        "createdAt": snap.created_at,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256, "contentType": f.content_type, "mode": f.mode}
                  for f in snap.files],
        "env": snap.env,  # hutch extra: what sandboxes made from it start with
        "dependencies": list(snap.dependencies) or None,  # hutch extra: apt packages its sandboxes get
        "packages": list(snap.packages) or None,  # hutch extra: npm packages its sandboxes get
        "userMetadata": snap.metadata,
        "downloadUrl": download_url,
    }
    if snap.public:
        org = org_ref(snap.org_id)
        info.update(org={**org, "slug": org["name"]}, orgName=org["name"], orgSlug=org["name"])
    else:
        info["user"] = USER
    return _drop_none(info)


def lineage_entry(snap: Snapshot, deleted: bool) -> dict[str, Any]:
    entry = {k: v for k, v in snapshot_info(snap).items()
             if k in ("snapshotId", "name", "fullName", "message", "tag", "parentSnapshotId", "public", "org", "user",
                      "createdAt")}
    entry["deleted"] = deleted
    return entry


def redact_event(event: Event) -> dict[str, Any]:
    """The events API payload: env values are secrets, so only their names are shown."""
    data = encode(event)["data"]
    spec = data.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("env"), dict):
        spec["env"] = {k: "***" for k in spec["env"]}
    if event.type == "env" and isinstance(data.get("set"), dict):
        data["set"] = {k: "***" for k in data["set"]}
    return data
