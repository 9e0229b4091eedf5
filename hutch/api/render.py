"""Domain values as the wire shows them (what api/wire_schemas.py describes), and a sandbox
and an execution as a request sees them: their stream URLs and port URL depend on the address
the request came in on. Optional fields are omitted, never ``null``: the real client's zod
schemas reject null. The requests' bodies go the other way in api/parse.py.

An answer the SDK reads whole (an execution, a job, a runtime reference) is built from its
``core.wire`` class, the one the SDK parses it into, so the two cannot drift; the others stay
dicts until their SDK classes carry every field the server sends (a sandbox's ``updatedAt``,
``networkAllow``, ``reason``; a snapshot's ``projectId``, ``dependencies`` …).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from aiohttp import web

from hutch.api.http import base_url
from hutch.api.keys import CONFIG, ENGINE, PRINCIPAL
from hutch.core import runtimes
from hutch.core.events import Event, encode
from hutch.core.models import ExecutionState, SandboxState, SnapshotState
from hutch.core.serde import to_wire
from hutch.core.wire import ExecutionInfo, Job, RuntimeRef
from hutch.drivers.base import Usage
from hutch.service.engine import Engine


def org_ref(org_id: str) -> dict[str, str]:
    """An organization as the wire names it: its id is ``org_`` + its name (core/tenancy.py)."""
    return {"id": org_id, "name": org_id.removeprefix("org_")}


USER = {"id": "user_local"}  # one tenant: every private snapshot is this user's


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def runtime_summary(name: str) -> dict[str, Any]:
    recipe = runtimes.find(name)
    if recipe is None:
        return to_wire(RuntimeRef(id="srt_unknown", name=name))
    return to_wire(RuntimeRef(id=recipe.id, name=recipe.name, icon_url=recipe.icon_url, brand_color=recipe.brand_color,
                              tags=list(recipe.tags)))


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


def sandbox_info(sb: SandboxState, stream_urls: tuple[str, str] | None, url: str | None = None,
                 usage: Usage | None = None, node: str | None = None) -> dict[str, Any]:
    """``stream_urls``: the initial command's (stdout, stderr) URLs, if it had one; ``url``:
    where its exposed port is served (api/routes/proxy.py), if it has one; ``usage``: what a
    live sandbox has used so far (an ended one's was recorded as it ended); ``node``: where it
    runs, for the operator only (NODE_FIELDS)."""
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
            "networkDeny": list(spec.network.deny) or None,  # hutch's extension
            "url": url,
            "org": org_ref(spec.org_id),
            "projectId": spec.project_id,
            "timeout": _drop_none({"idle": spec.timeout.idle, "execution": spec.timeout.execution, "paused": spec.timeout.paused}),
            "command": _drop_none({"exec": list(spec.command), "mode": spec.mode.value,
                                   "omittedBytes": spec.command_omitted_bytes,
                                   "sha256": spec.command_sha256}) if spec.command else None,
            "snapshot": {"id": spec.snapshot_id, "public": False, "user": USER} if spec.snapshot_id else None,
            "dependencies": list(spec.dependencies) or None,  # hutch extra
            "packages": list(spec.packages) or None,  # hutch extra
            "reason": sb.reason,  # hutch extra: why it failed or ended
            "cpuTimeMs": round(cpu * 1000) if cpu is not None else None,
            # Peak x lifetime: an upper bound of the byte-seconds it held (what stats counts too).
            "memoryByteSec": round(peak * _lifetime(sb)) if peak is not None and sb.status.is_final else None,
            "memoryPeakBytes": peak,  # hutch extra
            "node": node,  # hutch extra, the operator's only
        }
    )


def _lifetime(sb: SandboxState) -> float:
    def unix(iso: str) -> float:
        return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()

    return max(0.0, unix(sb.updated_at) - unix(sb.created_at))


_JOB_STATUS = {"queued": "pending", "running": "running", "cancelled": "cancelled", "failed": "failed", "timeout": "failed"}


def job_info(job: ExecutionState, stdout_url: str, stderr_url: str) -> dict[str, Any]:
    """Jobs are executions of kind "job"; the wire gives them their own statuses."""
    status = _JOB_STATUS.get(job.status.value) or ("completed" if job.exit_code == 0 else "failed")
    return to_wire(Job(job_id=job.execution_id, sandbox_id=job.sandbox_id, command=list(job.command), status=status,
                       exit_code=job.exit_code, started_at=job.started_at, completed_at=job.completed_at,
                       error=job.error, stdout_stream_url=stdout_url, stderr_stream_url=stderr_url,
                       command_omitted_bytes=job.command_omitted_bytes, command_sha256=job.command_sha256))


def execution_info(ex: ExecutionState, stdout_url: str | None, stderr_url: str | None) -> dict[str, Any]:
    return to_wire(ExecutionInfo(
        execution_id=ex.execution_id, sandbox_id=ex.sandbox_id, type=ex.type, status=ex.status.value,
        command=list(ex.command), exit_code=ex.exit_code, duration_ms=ex.duration_ms, started_at=ex.started_at,
        completed_at=ex.completed_at, error=ex.error, stdout_stream_url=stdout_url, stderr_stream_url=stderr_url,
        output_truncated=ex.output_truncated, command_omitted_bytes=ex.command_omitted_bytes,
        command_sha256=ex.command_sha256,
    ))


def _full_name(snap: SnapshotState) -> str:
    org = org_ref(snap.org_id)["name"]
    return f"@{org}/{snap.name}:{snap.tag}" if snap.tag else f"@{org}/{snap.name}"


def snapshot_info(snap: SnapshotState, download_url: str | None = None) -> dict[str, Any]:
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


def lineage_entry(snap: SnapshotState, deleted: bool) -> dict[str, Any]:
    entry = {k: v for k, v in snapshot_info(snap).items()
             if k in ("snapshotId", "name", "fullName", "message", "tag", "parentSnapshotId", "public", "org", "user",
                      "createdAt")}
    entry["deleted"] = deleted
    return entry


# Where sandboxes run is the operator's business: a tenant that learnt which of its sandboxes
# share a machine with whose would know where to aim (co-residency). Event fields naming nodes.
NODE_FIELDS = ("node", "fromNode", "toNode")


def operator(request: web.Request) -> bool:
    """The request's key is the server administrator's (its bootstrap key): it sees nodes."""
    principal = request.get(PRINCIPAL)
    return principal is not None and principal.server_admin


def redact_event(event: Event, *, operator: bool = False) -> dict[str, Any]:
    """The events API payload: env values are secrets, so only their names are shown; the
    node a sandbox runs on only to the operator."""
    data = encode(event)["data"]
    if not operator:
        for field in NODE_FIELDS:
            data.pop(field, None)
    spec = data.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("env"), dict):
        spec["env"] = {k: "***" for k in spec["env"]}
    if event.type == "env" and isinstance(data.get("set"), dict):
        data["set"] = {k: "***" for k in data["set"]}
    return data


# ---------------------------------------------------------------- as a request sees them


def stream_urls(request: web.Request, engine: Engine, owner_id: str) -> tuple[str, str]:
    """The output stream URLs of an execution, or of a sandbox (all its executions' output:
    service/sandbox_streams.py)."""
    base = base_url(request)
    return (
        f"{base}/streams/{engine.streams.derive(owner_id, 'stdout')}",
        f"{base}/streams/{engine.streams.derive(owner_id, 'stderr')}",
    )


def render_sandbox(request: web.Request, sb: SandboxState, usage: Usage | None = None) -> dict:
    engine = request.app[ENGINE]
    urls = stream_urls(request, engine, sb.initial_execution_id or sb.sandbox_id)
    return sandbox_info(sb, urls, port_url(request, sb), usage, sb.node if operator(request) else None)


def port_url(request: web.Request, sb: SandboxState) -> str | None:
    port = sb.spec.network.port
    return sandbox_url(request, base_url(request), sb.sandbox_id, port) if port is not None else None


def render_execution(request: web.Request, ex: ExecutionState) -> dict:
    out, err = stream_urls(request, request.app[ENGINE], ex.execution_id)
    return execution_info(ex, out, err)


PROXY_PREFIX = "/proxy"  # the path form of a port URL (api/routes/proxy.py serves it)


def sandbox_url(request: web.Request, base: str, sandbox_id: str, port: int) -> str:
    """A sandbox port's URL: its own host under HUTCH_SANDBOX_DOMAIN when set, else the path form."""
    domain = request.app[CONFIG].sandbox_domain
    if domain:
        scheme = base.split("://", 1)[0]
        return f"{scheme}://{port}-{sandbox_id.removeprefix('sbx_')}.{domain}/"
    return f"{base}{PROXY_PREFIX}/{sandbox_id}/"
