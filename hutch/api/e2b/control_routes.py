"""E2B's control plane (the API at ``E2B_API_URL``: e2b-dev/E2B spec/openapi.yml) on hutch's
service layer: create, get, list, kill, pause, resume and connect. A sandbox made here is a
hutch sandbox like any other: recorded, in the key's organization, within its quotas, with the
network off unless asked for.

E2B's ``timeout`` (seconds until the sandbox is ended) is hutch's idle timeout counted from
when it was set (``timeout.since`` "set"): the sandbox ends that long after its create, busy or
not, as E2B's does; set_timeout (and connect's ``timeout``, and a resume) sets it anew, counted
from then. What hutch does not have answers E2B's error shape naming it (docs/e2b.md)."""

from __future__ import annotations

import base64
import binascii
import math
import urllib.parse
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
from aiohttp import web

from hutch.api.e2b import ports, public, query_params
from hutch.api.e2b.access import (
    PRINCIPAL_KEY,
    control,
    envd_token,
    hutch_id,
    traffic_token,
    wire_id,
)
from hutch.api.e2b.idempotency import IdempotentCreates
from hutch.api.e2b.network import e2b_network, hutch_network, hutch_update
from hutch.api.http import choice_value, parse_json, shown
from hutch.api.keys import ENGINE, STILL_AUTHORIZED
from hutch.api.parse import parse_create
from hutch.core import runtimes
from hutch.core.driver_types import Capabilities
from hutch.core.errors import (
    Conflict,
    IllegalTransition,
    InvalidInput,
    NotFound,
    NotSupported,
    SandboxNotFound,
)
from hutch.core.models import (
    ON_IDLE_PAUSE,
    ON_IDLE_PAUSE_FILESYSTEM,
    SandboxState,
    SandboxStatus,
    SnapshotState,
)
from hutch.core.quantities import stored_duration
from hutch.core.snapshots import DEFAULT_TAG
from hutch.core.tenancy import Access
from hutch.projections.base import SandboxQuery, SnapshotQuery
from hutch.service.engine import Engine

routes = web.RouteTableDef()
IDEMPOTENCY: web.AppKey[IdempotentCreates] = web.AppKey("e2b_idempotency", IdempotentCreates)

ENVD_VERSION = "0.6.4"  # what the SDK is told envd speaks: commands with stdin, a default user, watch entries
DEFAULT_TIMEOUT = 300  # seconds, E2B's default
MAX_TIMEOUT = 24 * 3600
# E2B's template names -> hutch's runtimes; code-interpreter-v1 is e2b-code-interpreter's default.
# E2B's base template has python3 (agents and E2B's own tests run `python3` in it): hutch's
# python:3.13 (Debian with Python), not the shell-only base:latest.
TEMPLATES = {"base": "python:3.13", "code-interpreter-v1": ports.RUNTIME}
_LIVE = (SandboxStatus.CREATING, SandboxStatus.IDLE, SandboxStatus.RUNNING, SandboxStatus.PAUSED)
# Create fields hutch has no counterpart for: refused when set to anything but empty/false.
_UNSUPPORTED = {"iam": "workload identity (IAM)", "volumeMounts": "volumes"}
# E2B's templates' account (home /home/user); not the code interpreter's, whose server reads
# its token from agentuity's home (api/e2b/ports.py).
E2B_USER = "user"
_KNOWN = {"templateID", "timeout", "metadata", "envVars", "allow_internet_access", "secure", "autoPause",
          "autoPauseMemory", "autoResume", "network", "mcp", *_UNSUPPORTED}


async def _snapshot_named(engine: Engine, template: str) -> SnapshotState | None:
    """The organization's snapshot named ``name[:tag]`` (E2B names a snapshot as a template; no
    tag: the latest), or None."""
    name, _, tag = template.partition(":")
    found, _ = await engine.snapshots.list(SnapshotQuery(name=name, tag=tag or DEFAULT_TAG, limit=1))
    return found[0] if found else None


def _template_of(sb: SandboxState) -> str:
    for name, runtime in TEMPLATES.items():
        if sb.spec.runtime == runtime:
            return name
    return sb.spec.snapshot_id or sb.spec.runtime


def timeout_of(body: dict[str, Any], *, lowest: int = 1, required: bool = False) -> int:
    if required and "timeout" not in body:  # E2B's body requires it: no default stands in for a forgotten one
        raise InvalidInput(f"timeout: required, whole seconds from {lowest} to {MAX_TIMEOUT}", field="timeout")
    value = body.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= MAX_TIMEOUT:
        raise InvalidInput(f"timeout: expected whole seconds from {lowest} to {MAX_TIMEOUT}, got {value!r}",
                           field="timeout")
    return value


def _pause_at_timeout(body: dict[str, Any], caps: Capabilities) -> str | None:
    """E2B's ``lifecycle``: ``on_timeout`` "pause" (autoPause) pauses the sandbox at its
    timeout, and a connect resumes it: with the memory kept (``timeout.on_idle`` "pause"), or,
    ``autoPauseMemory`` false (the SDK's ``keep_memory=False``, ``mode: "filesystem"``), its
    files only ("pause-filesystem"), the resume a new boot. None: it ends at its timeout.
    ``autoResume`` is what hutch does anyway: a request that needs the sandbox (envd's, the
    interpreter's port) wakes a paused one, so enabled it is accepted and changes nothing;
    E2B refuses it with a filesystem-only pause (its SDK before sending), and so does hutch."""
    auto_pause, memory, resume = body.get("autoPause"), body.get("autoPauseMemory"), body.get("autoResume")
    for field, value in (("autoPause", auto_pause), ("autoPauseMemory", memory)):
        if value is not None and not isinstance(value, bool):
            raise InvalidInput(f"{field}: expected true or false, got {value!r}", field=field)
    if resume is not None and not (isinstance(resume, dict) and isinstance(resume.get("enabled", False), bool)):
        raise InvalidInput(f"autoResume: expected {{\"enabled\": true|false}}, got {resume!r}", field="autoResume")
    if not auto_pause:
        return None
    if memory is False:
        if isinstance(resume, dict) and resume.get("enabled"):
            raise InvalidInput("autoResume: a sandbox paused filesystem-only at its timeout resumes only when "
                               "asked (connect); leave autoResume off or keep the memory", field="autoResume")
        if not caps.pause_filesystem:
            raise NotSupported("autoPauseMemory: this server's driver cannot pause a sandbox filesystem-only "
                               "(mode \"filesystem\")", field="autoPauseMemory")
        return ON_IDLE_PAUSE_FILESYSTEM
    if not caps.pause:
        raise NotSupported("autoPause: this server's driver cannot pause sandboxes", field="autoPause")
    return ON_IDLE_PAUSE


def _strings(body: dict[str, Any], field: str) -> dict[str, str]:
    value = body.get(field) or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidInput(f"{field}: expected an object of string values", field=field)
    return value


async def read_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    request[STILL_AUTHORIZED]()  # the body may have taken as long as its sender liked: a key revoked meanwhile acts no more
    body = parse_json(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise InvalidInput("body: expected a JSON object", field="body")
    return body


def render(request: web.Request, sb: SandboxState, *, detail: bool, token: bool = True) -> dict[str, Any]:
    """E2B's Sandbox (``detail``: SandboxDetail). The envd and traffic tokens are always issued
    (E2B's ``secure``, whatever was asked); a listing leaves them out, as E2B's does."""
    principal = request[PRINCIPAL_KEY]
    out: dict[str, Any] = {"templateID": _template_of(sb), "sandboxID": wire_id(sb.sandbox_id), "clientID": "hutch",
                           "envdVersion": ENVD_VERSION, "alias": _template_of(sb), "domain": None}
    if token:
        # Two tokens (api/e2b/access.py): envd's runs commands and reads files; the traffic token,
        # the one a user shares so that others may reach the sandbox's ports, opens those only.
        engine = request.app[ENGINE]
        out["envdAccessToken"] = envd_token(engine, sb.sandbox_id, principal.key_id)
        out["trafficAccessToken"] = traffic_token(engine, sb.sandbox_id, principal.key_id)
    if detail:
        started = datetime.fromisoformat(sb.created_at.replace("Z", "+00:00"))
        res = sb.spec.resources
        meta = sb.spec.metadata if isinstance(sb.spec.metadata, dict) else {}
        out.update(startedAt=started.isoformat(), endAt=_ends_at(sb).isoformat(),
                   cpuCount=math.ceil((res.cpu_millis or 0) / 1000), memoryMB=(res.memory_bytes or 0) // 2**20,
                   diskSizeMB=(res.disk_bytes or 0) // 2**20,
                   state="paused" if sb.status is SandboxStatus.PAUSED else "running",
                   metadata={k: v for k, v in meta.items() if isinstance(v, str)},
                   allowInternetAccess=sb.spec.network.enabled)
        rules = e2b_network(sb.spec.network.allow, sb.spec.network.deny)
        if rules is not None:
            out["network"] = rules
    return out


def _ends_at(sb: SandboxState) -> datetime:
    """When its timeout ends it: counted from when it was set (a sandbox made here), or, for an
    idle timeout (one made on hutch's own API), if nothing happens in it before (hutch's reaper
    may know of a later activity: a file read is not an event)."""
    idle = stored_duration("timeout.idle", sb.spec.timeout.idle) if sb.spec.timeout.idle else 0
    since = sb.timeout_set_at if sb.spec.timeout.since == "set" and sb.timeout_set_at else sb.updated_at
    return datetime.fromisoformat(since.replace("Z", "+00:00")) + timedelta(seconds=idle)


async def live_sandbox(request: web.Request, sandbox_id: str) -> SandboxState:
    """The sandbox, if the key's organization has it and it has not ended (an ended one is
    gone, as in E2B)."""
    try:
        sb = await request.app[ENGINE].reads.require(hutch_id(sandbox_id), include_deleted=False)
    except NotFound:
        sb = None
    if sb is None or sb.status not in _LIVE:
        raise SandboxNotFound(f"sandbox {sandbox_id} not found")  # as the client named it
    return sb


@routes.post("/sandboxes")
@routes.post("/v2/sandboxes")
@control(Access.WRITE)
async def create(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    body = await read_body(request)
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise InvalidInput(f"{unknown[0]}: not a field of a new sandbox", field=unknown[0])
    for field, what in _UNSUPPORTED.items():
        if body.get(field):
            raise NotSupported(f"{field}: hutch does not offer {what} on the E2B wire yet", field=field)
    if body.get("mcp") is not None and not isinstance(body["mcp"], dict):
        raise InvalidInput(f"mcp: expected an object of MCP servers, got {body['mcp']!r}", field="mcp")
    # ``mcp`` asks for nothing of the server: E2B's SDK itself starts the gateway in the new
    # sandbox (``mcp-gateway --config ...``, a command like any other) and kills the sandbox if
    # that fails. The gateway is a program of E2B's mcp-gateway template, which hutch's runtimes
    # lack: unless the template (a snapshot) has it, the create ends in the SDK's "Failed to start
    # MCP gateway", the sandbox killed, as on E2B with its base template.
    template = body.get("templateID")
    if not isinstance(template, str) or not template:
        raise InvalidInput("templateID: required, a template name such as base", field="templateID")
    hutch_body: dict[str, Any] = {"env": _strings(body, "envVars"), "metadata": _strings(body, "metadata"),
                                  "timeout": {"idle": f"{timeout_of(body)}s"}}
    net = hutch_network(body.get("allow_internet_access"), body.get("network"))
    given_net = body.get("network")
    public.mark(hutch_body["metadata"], isinstance(given_net, dict) and given_net.get("allowPublicTraffic") is True)
    if net is not None:  # hutch's default is off, whatever E2B's is
        hutch_body["network"] = net
    snapshot = None
    if template.startswith("snp_"):
        snapshot = await engine.snapshots.resolve(template, "templateID")
    elif runtimes.find(TEMPLATES.get(template, template)) is None:
        snapshot = await _snapshot_named(engine, template)
        if snapshot is None:
            raise NotFound(f"template {template!r} not found (hutch has base and its runtimes, e.g. python:3.13, "
                           "or a snapshot: its id snp_... or its name[:tag])", field="templateID")
    if snapshot is not None:
        hutch_body["snapshot"] = snapshot.snapshot_id
        runtime = snapshot.runtime
    else:
        runtime = TEMPLATES.get(template, template)
        hutch_body["runtime"] = runtime
        if runtime == ports.RUNTIME:  # its server on its port, reached as the SDK reaches it (api/e2b/ports.py)
            hutch_body["network"] = {**hutch_body.get("network", {}), "port": ports.PORT}
    pause_at_timeout = _pause_at_timeout(body, engine.provisioning.capabilities)
    req = parse_create(hutch_body, snapshot)
    # E2B's timeout ends the sandbox that long from now, whatever runs in it (a command still
    # running is ended with it): not hutch's idle timeout, which a busy sandbox never reaches.
    req = attrs.evolve(req, spec=attrs.evolve(req.spec, timeout=attrs.evolve(
        req.spec.timeout, since="set", on_idle=pause_at_timeout or req.spec.timeout.on_idle)))
    if runtime != ports.RUNTIME and engine.provisioning.capabilities.named_user:
        # E2B's templates run as "user", home /home/user (where a snapshot's files go too): E2B's
        # SDK and code expect so. A driver that cannot name the account keeps agentuity's.
        req = attrs.evolve(req, spec=attrs.evolve(req.spec, user=E2B_USER))
    principal = request[PRINCIPAL_KEY]

    async def make() -> str:
        created = await engine.provisioning.create(req, api_key_id=principal.key_id)
        return created.sandbox.sandbox_id

    key = request.headers.get("Idempotency-Key")
    sandbox_id, made = await request.app[IDEMPOTENCY].once(principal.org_id, key, make) if key else (await make(), True)
    try:
        sb = await engine.reads.wait_not_creating(sandbox_id)
    except NotFound:
        if made:
            raise
        sb = None
    if not made and (sb is None or sb.status not in _LIVE):
        raise Conflict(f"Idempotency-Key {key!r}: the sandbox it made, {sandbox_id}, has ended; use a new key")
    assert sb is not None
    if sb.status not in _LIVE:
        raise NotSupported(f"sandbox {sb.sandbox_id} did not start: {sb.reason or sb.status.value}")
    if made and sb.spec.runtime == ports.RUNTIME:
        try:
            await ports.start_interpreter(request.app, sb.sandbox_id)
        except Exception:
            # A template whose server never answers is no sandbox to hand out: not left running.
            ports.forget(request.app, sb.sandbox_id)
            await engine.control.destroy(sb.sandbox_id)
            raise
    return web.json_response(render(request, sb, detail=False), status=201)


@routes.get("/sandboxes/{sandbox_id}")
@control(Access.READ)
async def get(request: web.Request) -> web.Response:
    sb = await live_sandbox(request, request.match_info["sandbox_id"])
    return web.json_response(render(request, sb, detail=True))


def _metadata_filter(request: web.Request) -> dict[str, str]:
    raw = request.query.get("metadata", "")
    try:
        return dict(urllib.parse.parse_qsl(raw, keep_blank_values=True, strict_parsing=bool(raw)))
    except ValueError as err:
        raise InvalidInput(f"metadata: expected key=value pairs joined by &, got {raw!r}", field="metadata") from err


def _states(request: web.Request) -> set[str]:
    raw = request.query.get("state")
    return set(query_params.items(query_params.STATE, raw) if raw else query_params.STATES)


def _started_after(request: web.Request) -> datetime | None:
    raw = request.query.get("startedAfter")
    return query_params.datetime_value("startedAfter", raw) if raw else None


def _started(sb: SandboxState) -> datetime:
    return datetime.fromisoformat(sb.created_at.replace("Z", "+00:00"))


def _digits(raw: str, most: int) -> int | None:
    """``raw`` as a number of at most ``most`` digits (leading zeros aside); None if it is none.
    Counted before int(): "²" is isdigit but no int, and int() of more than 4,300 digits
    raises ValueError (a 500 here before), leading zeros too: they are left out of it."""
    digits = raw.lstrip("0")
    if not (raw.isascii() and raw.isdigit()) or len(digits) > most:
        return None
    return int(digits or "0")


def limit_of(request: web.Request) -> int:
    return query_params.integer(query_params.LIMIT, request.query.get("limit") or "100")


def _not_a_token(raw: str) -> InvalidInput:
    return InvalidInput(f"nextToken: not a token this server gave, got {shown(raw)}", field="nextToken")


def page_of(request: web.Request) -> tuple[int, int]:
    """A listing's page: (limit, offset) from its limit and the x-next-token a previous page gave
    (an offset: no listing is 10^18 long)."""
    raw_next = request.query.get("nextToken") or "0"
    offset = _digits(raw_next, 18)
    if offset is None:
        raise _not_a_token(raw_next)
    return limit_of(request), offset


Place = tuple[datetime, str]


def _place(sb: SandboxState) -> Place:
    """Where a sandbox stands in a listing: by its start, then its id (starts may be equal)."""
    return _started(sb), sb.sandbox_id


def _token(sb: SandboxState) -> str:
    """The next page's token: the place of the last sandbox listed, not a count of those
    before it, which a sandbox made or killed between two pages would shift."""
    return base64.urlsafe_b64encode(f"{sb.created_at} {sb.sandbox_id}".encode()).decode().rstrip("=")


def _token_place(request: web.Request) -> Place | None:
    raw = request.query.get("nextToken")
    if not raw:
        return None
    try:
        at, sandbox_id = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode().split(" ")
        when = datetime.fromisoformat(at.replace("Z", "+00:00"))
    except (ValueError, binascii.Error) as err:  # UnicodeDecodeError is a ValueError
        raise _not_a_token(raw) from err
    if when.tzinfo is None or not sandbox_id.startswith("sbx_"):
        raise _not_a_token(raw)
    return when, sandbox_id


@routes.get("/sandboxes")
@routes.get("/v2/sandboxes")
@control(Access.READ)
async def list_sandboxes(request: web.Request) -> web.Response:
    """The organization's live sandboxes, filtered as E2B's query says: state, metadata
    (key=value&…), template, startedAfter; ordered by start (order asc|desc, newest first
    unless asked); paged by limit and the x-next-token the previous page gave (a place in
    that order: made or killed sandboxes shift no later page)."""
    engine = request.app[ENGINE]
    wanted, states, after = _metadata_filter(request), _states(request), _started_after(request)
    template = request.query.get("template") or None
    order = choice_value("order", request.query.get("order") or "desc", ("asc", "desc"))
    limit, since = limit_of(request), _token_place(request)
    found: dict[str, SandboxState] = {}  # by id: a create during the reads shifts their pages
    page_at = 0
    while True:  # the filters are E2B's, not the store's: read every live sandbox of the organization
        page, _total = await engine.reads.list(SandboxQuery(live=True, limit=100, offset=page_at,
                                                            sort="createdAt", direction=order))
        found.update((sb.sandbox_id, sb) for sb in page)
        page_at += len(page)
        if len(page) < 100:
            break
    chosen = sorted((sb for sb in found.values()
                     if ("paused" if sb.status is SandboxStatus.PAUSED else "running") in states
                     and (template is None or _template_of(sb) == template)
                     and (after is None or _started(sb) >= after)
                     and all(isinstance(sb.spec.metadata, dict) and sb.spec.metadata.get(k) == v
                             for k, v in wanted.items())
                     and (since is None or (_place(sb) < since if order == "desc" else _place(sb) > since))),
                    key=_place, reverse=order == "desc")
    window = chosen[:limit]
    response = web.json_response([render(request, sb, detail=True, token=False) for sb in window])
    if len(chosen) > limit:
        response.headers["x-next-token"] = _token(window[-1])
    return response


@routes.delete("/sandboxes/{sandbox_id}")
@control(Access.WRITE)
async def kill(request: web.Request) -> web.Response:
    sb = await live_sandbox(request, request.match_info["sandbox_id"])
    await request.app[ENGINE].control.destroy(sb.sandbox_id)
    ports.forget(request.app, sb.sandbox_id)
    return web.Response(status=204)


@routes.post("/sandboxes/{sandbox_id}/pause")
@control(Access.WRITE)
async def pause(request: web.Request) -> web.Response:
    memory = (await read_body(request)).get("memory")
    if memory is not None and not isinstance(memory, bool):
        raise InvalidInput(f"memory: expected true or false, got {memory!r}", field="memory")
    # memory false: E2B's filesystem-only pause (the SDK's keep_memory=False, mode "filesystem"):
    # every process ends, the files are kept, and the resume (connect) is a new boot.
    # E2B's SDK reads a 409 as "already paused" (pause() returns False, no error): so a 409
    # means exactly that here, and a pause refused for any other reason says so otherwise.
    sandbox_id = request.match_info["sandbox_id"]
    sb = await live_sandbox(request, sandbox_id)
    try:
        if sb.status is not SandboxStatus.PAUSED:
            await request.app[ENGINE].control.pause(sb.sandbox_id, memory=memory is not False)
            return web.Response(status=204)
    except IllegalTransition as refused:
        # Its commands are frozen with it (docs/e2b.md); a driver that cannot freeze them says so
        # with a 501 of its own. An IllegalTransition is the sandbox ending (a 404, as E2B's) or
        # pausing meanwhile (a 409); anything else is no "already paused".
        sb = await live_sandbox(request, sandbox_id)
        if sb.status in (SandboxStatus.RUNNING, SandboxStatus.IDLE):
            raise NotSupported(f"sandbox {sandbox_id} could not be paused: {refused.message}",
                               field="state") from None
        if sb.status is not SandboxStatus.PAUSED:
            raise
    return web.json_response({"code": 409, "message": f"sandbox {sb.sandbox_id} is already paused"}, status=409)


@routes.post("/sandboxes/{sandbox_id}/resume")
@routes.post("/sandboxes/{sandbox_id}/connect")
@routes.post("/v2/sandboxes/{sandbox_id}/connect")
@control(Access.WRITE)
async def connect(request: web.Request) -> web.Response:
    """Connect (and resume, a paused one): the answer carries the envd token, for this key. A
    ``timeout`` given that would end the sandbox later than now planned is the idle timeout
    from now on, as set_timeout's; one that would end it sooner changes nothing."""
    engine = request.app[ENGINE]
    body = await read_body(request)
    sb = await live_sandbox(request, request.match_info["sandbox_id"])
    resumed = sb.status is SandboxStatus.PAUSED
    if resumed:
        await engine.control.resume(sb.sandbox_id)
    extend = body.get("timeout") is not None and (
        datetime.now(UTC) + timedelta(seconds=timeout_of(body, lowest=0)) > _ends_at(sb))
    if extend:  # as E2B's connect: a later end, never an earlier one
        await engine.control.set_idle_timeout(sb.sandbox_id, f"{max(1, timeout_of(body, lowest=0))}s")
    if resumed or extend:
        sb = await engine.reads.require(sb.sandbox_id)
    return web.json_response(render(request, sb, detail=False), status=201 if resumed else 200)


@routes.post("/sandboxes/{sandbox_id}/timeout")
@control(Access.WRITE)
async def set_timeout(request: web.Request) -> web.Response:
    """The sandbox ends ``timeout`` seconds from now unless something happens in it (hutch's
    idle timeout, set anew); 0 is the shortest hutch has, a second."""
    body = await read_body(request)
    seconds = timeout_of(body, lowest=0, required=True)
    sb = await live_sandbox(request, request.match_info["sandbox_id"])
    await request.app[ENGINE].control.set_idle_timeout(sb.sandbox_id, f"{max(1, seconds)}s")
    return web.Response(status=204)


@routes.put("/sandboxes/{sandbox_id}/network")
@control(Access.WRITE)
async def update_network(request: web.Request) -> web.Response:
    """E2B's update_network: the sandbox's egress rules replaced whole (api/e2b/network.py says
    how they map), swapped by the driver at once and recorded (event ``network``)."""
    body = await read_body(request)
    sb = await live_sandbox(request, request.match_info["sandbox_id"])
    enabled, allow, deny = hutch_update(body)
    await request.app[ENGINE].egress.update(sb.sandbox_id, enabled=enabled, allow=allow, deny=deny)
    return web.Response(status=204)
