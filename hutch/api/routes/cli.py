"""What the official Agentuity CLI (``@agentuity/cli@2.0.21``) asks beside ``/sandbox…``.

Pointed at hutch (``AGENTUITY_API_URL`` and ``AGENTUITY_TRANSPORT_URL``), the CLI first asks
``/cli/organization`` and ``/cli/region`` to pick an organization and a region, lists
sandboxes at ``/cli/sandbox``, resolves a sandbox's organization and region at
``/cli/sandbox/{id}``, manages keys at ``/cli/apikey…`` and reads usage at
``/services/stats/{orgId}``. These answer from hutch's own organizations, keys and
sandboxes, in the shapes the CLI's schemas require. Every other ``/cli/…`` request (agents,
deployments, projects' secrets, …: things hutch does not have) is a 501 that names hutch and
the request; never a crash, never a pretend success.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from aiohttp import web

from hutch.api.access import PUBLIC, needs
from hutch.api.http import json_body, ok, q_choice, q_instant, q_int, q_offset
from hutch.api.keys import ENGINE, PRINCIPAL, TENANTS
from hutch.api.render import org_ref
from hutch.core import tenancy
from hutch.core.errors import InvalidInput, NotFound, NotSupported
from hutch.core.models import Mode, SandboxState, SandboxStatus
from hutch.core.packages import check_dependencies
from hutch.core.tenancy import Access, ApiKeyRecord
from hutch.projections.base import SandboxQuery

routes = web.RouteTableDef()
REGION = "local"  # one server, one region: the CLI picks it without asking
_SORTS = {"created": "createdAt", "createdAt": "createdAt", "updated": "updatedAt", "updatedAt": "updatedAt",
          "name": "name", "status": "status", "mode": "mode"}


@routes.get("/cli/organization")
async def organizations(request: web.Request) -> web.Response:
    principal, directory = request[PRINCIPAL], request.app[TENANTS].directory
    orgs = sorted(directory.orgs.values(), key=lambda o: o.created_at)
    if not principal.server_admin:
        orgs = [o for o in orgs if o.org_id == principal.org_id]
    return ok([{"id": o.org_id, "name": o.name} for o in orgs])


@routes.get("/cli/auth/user")
async def whoami(request: web.Request) -> web.Response:
    """``agentuity auth whoami``: hutch has keys, not users; the key stands in for the person."""
    principal, directory = request[PRINCIPAL], request.app[TENANTS].directory
    key = directory.keys.get(principal.key_id)
    orgs = directory.orgs.values() if principal.server_admin else [directory.orgs[principal.org_id]]
    return ok({"firstName": key.name if key else "bootstrap key",
               "lastName": f"({principal.role.value} key {principal.key_id})",
               "organizations": [{"id": o.org_id, "name": o.name} for o in orgs]})


@routes.get("/cli/region")
async def regions(request: web.Request) -> web.Response:
    return ok([{"region": REGION, "description": "this hutch server"}])


def _cli_sandbox(sb: SandboxState) -> dict[str, Any]:
    spec = sb.spec
    return {"id": sb.sandbox_id, "name": spec.name, "description": spec.description, "status": sb.status.value,
            "region": REGION, "createdAt": sb.created_at, "orgId": spec.org_id,
            "orgName": org_ref(spec.org_id)["name"], "projectId": spec.project_id}


@routes.get("/cli/sandbox")
async def list_sandboxes(request: web.Request) -> web.Response:
    sort = q_choice(request, "sort", tuple(_SORTS), "created") or "created"
    query = SandboxQuery(
        name=request.query.get("name") or None,
        mode=q_choice(request, "mode", tuple(m.value for m in Mode)),
        project_id=request.query.get("projectId") or None,
        status=q_choice(request, "status", tuple(s.value for s in SandboxStatus)),
        limit=q_int(request, "limit", 50, lo=1, hi=1000),
        offset=q_offset(request),
        sort=_SORTS[sort],
        direction=q_choice(request, "direction", ("asc", "desc"), "desc") or "desc",
    )
    found, total = await request.app[ENGINE].reads.list(query)
    return ok({"sandboxes": [_cli_sandbox(sb) for sb in found], "total": total})


@routes.get("/cli/sandbox/{sandbox_id}")
async def resolve_sandbox(request: web.Request) -> web.Response:
    """Which organization and region a sandbox is in (the CLI routes later calls by it)."""
    sb = await request.app[ENGINE].reads.require(request.match_info["sandbox_id"], include_deleted=True)
    return ok({"id": sb.sandbox_id, "name": sb.spec.name, "region": REGION, "status": sb.status.value,
               "orgId": sb.spec.org_id, "projectId": sb.spec.project_id})


@routes.get("/cli/project/{project_id}")
async def project(request: web.Request) -> web.Response:
    principal, directory = request[PRINCIPAL], request.app[TENANTS].directory
    found = directory.projects.get(request.match_info["project_id"])
    if found is None or found.org_id != principal.org_id or \
            (principal.projects and found.project_id not in principal.projects):  # as GET /projects lists them
        raise NotFound(f"project {request.match_info['project_id']} not found")
    return ok({"id": found.project_id, "name": found.name, "orgId": found.org_id, "region": REGION,
               "description": None, "tags": [], "secrets": {}, "env": {}, "deployment": None})


@routes.post("/cli/validate/apt-dependencies")
@needs(PUBLIC)  # the CLI sends it without a key: it only checks names, touches nothing
async def validate_apt(request: web.Request) -> web.Response:
    body = await json_body(request)
    packages = body.get("packages")
    if not isinstance(packages, list) or not all(isinstance(p, str) for p in packages):
        raise InvalidInput("packages: expected a list of package names", field="packages")
    valid, invalid = [], []
    for name in packages:
        try:
            check_dependencies([name])
            valid.append(name)
        except InvalidInput as err:
            invalid.append({"package": name, "error": err.message,
                            "searchUrl": f"https://packages.debian.org/search?keywords={name.split('=')[0]}"})
    return ok({"valid": valid, "invalid": invalid})


# ---------------------------------------------------------------- API keys (hutch keys)


def _iso_z(value: str | None) -> str | None:
    """The CLI's schemas take ISO times ending in Z only."""
    if value is None:
        return None
    moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _cli_key(key: ApiKeyRecord, request: web.Request) -> dict[str, Any]:
    directory = request.app[TENANTS].directory
    project = directory.projects.get(key.projects[0]) if key.projects else None
    return {"id": key.key_id, "name": key.name, "orgId": key.org_id, "type": key.role.value,
            "expiresAt": _iso_z(key.expires_at), "lastUsedAt": None, "createdAt": _iso_z(key.created_at),
            "project": {"id": project.project_id, "name": project.name} if project else None}


def _own_keys(request: web.Request) -> list[ApiKeyRecord]:
    principal, directory = request[PRINCIPAL], request.app[TENANTS].directory
    return sorted((k for k in directory.keys.values() if k.org_id == principal.org_id and k.revoked_at is None
                   and tenancy.within(principal.projects, k.projects)), key=lambda k: k.created_at)


@routes.post("/cli/apikey")
@needs(Access.ADMIN)
async def create_key(request: web.Request) -> web.Response:
    """``agentuity cloud apikey create``: a hutch key of the request's organization. Agentuity
    keys have no role; hutch's get ``member`` unless the body names ``role``."""
    body = await json_body(request)
    project = body.get("projectId")
    if project is not None and not isinstance(project, str):  # {} is not "no project"
        raise InvalidInput(f"projectId: expected a project id or name, got {project!r}", field="projectId")
    projects = [project] if project else []
    principal = request[PRINCIPAL]
    secret, key = await request.app[ENGINE].tenancy.create_key(
        principal.org_id, role="member" if body.get("role") is None else body["role"],
        name=body.get("name"), projects=projects, expires_at=body.get("expiresAt"), limit=principal.projects,
        field="projectId", maker=principal.key_id)
    return ok({"id": key.key_id, "value": secret})


@routes.get("/cli/apikey")
@needs(Access.ADMIN)
async def list_keys(request: web.Request) -> web.Response:
    wanted = request.query.get("projectId")
    keys = [k for k in _own_keys(request) if not wanted or wanted in k.projects]
    return ok([_cli_key(k, request) for k in keys])


@routes.get("/cli/apikey/{key_id}")
@needs(Access.ADMIN)
async def get_key(request: web.Request) -> web.Response:
    found = [k for k in _own_keys(request) if k.key_id == request.match_info["key_id"]]
    if not found:
        raise NotFound(f"API key {request.match_info['key_id']} not found")
    return ok(_cli_key(found[0], request))


@routes.delete("/cli/apikey/{key_id}")
@needs(Access.ADMIN)
async def delete_key(request: web.Request) -> web.Response:
    """Revokes it; the answer is the CLI's "rows affected". No such key of this organization is
    a 404 (the CLI says so in the server's words), like every other id hutch does not know."""
    key_id = request.match_info["key_id"]
    if key_id not in {k.key_id for k in _own_keys(request)}:
        raise NotFound(f"API key {key_id} not found")
    principal = request[PRINCIPAL]
    await request.app[ENGINE].tenancy.revoke_key(principal.org_id, key_id, principal.projects)
    return ok(1)


# ---------------------------------------------------------------- usage


@routes.get("/services/stats/{org_id}")
async def service_stats(request: web.Request) -> web.Response:
    """``agentuity cloud sandbox stats``: the organization's sandbox usage, as the CLI reads it."""
    principal = request[PRINCIPAL]
    if request.match_info["org_id"] != principal.org_id:
        raise NotFound(f"organization {request.match_info['org_id']} not found")
    engine = request.app[ENGINE]
    used = await engine.usage.report(q_instant(request, "start"), q_instant(request, "end"),
                                     scope=engine.reads.scoped(SandboxQuery()))
    live, _ = await engine.reads.list(SandboxQuery(live=True, limit=10**9))
    return ok({"services": {"sandbox": {
        "totalActive": len(live),
        "running": sum(sb.status is SandboxStatus.RUNNING for sb in live),
        "idle": sum(sb.status is SandboxStatus.IDLE for sb in live),
        "creating": sum(sb.status is SandboxStatus.CREATING for sb in live),
        "totalExecutions": used["executions"]["total"] + used["jobs"]["total"],
        "totalCpuTimeMs": round(used["cpu"]["seconds"] * 1000),
        "totalMemoryByteSec": round(used["memory"]["gibSeconds"] * 2**30),  # peak x lifetime, as /sandbox/stats
        "totalNetworkEgressBytes": 0,  # not metered by hutch (README says so); the CLI's schema needs a number
    }}})


# ---------------------------------------------------------------- the rest: not hutch's


def _methods_elsewhere(request: web.Request) -> list[str]:
    """The methods another route takes at this very path (/cli/apikey/{id} takes GET and DELETE):
    a wrong method there is 405 with an Allow header, not "hutch does not have that"."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource is request.match_info.route.resource:
            continue
        info = resource.get_info()
        pattern = info.get("pattern")
        if info.get("path") == request.path or (pattern is not None and pattern.fullmatch(request.path)):
            allowed |= {route.method for route in resource if route.method not in ("HEAD", "*")}
    return sorted(allowed)


async def _not_here(request: web.Request) -> web.Response:
    if allowed := _methods_elsewhere(request):
        return web.json_response(
            {"success": False, "code": "METHOD_NOT_ALLOWED",
             "message": f"{request.method} {request.path}: not a method of this path; it takes {', '.join(allowed)}"},
            status=405, headers={"Allow": ", ".join(allowed)})
    raise NotSupported(f"{request.method} {request.path}: hutch serves the sandbox commands of the Agentuity CLI "
                       "(and its organization, region and API key calls); this one is for something hutch does "
                       "not have (agents, deployments, projects' settings, …)")


for _method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
    routes.route(_method, "/cli/{tail:.*}")(_not_here)
