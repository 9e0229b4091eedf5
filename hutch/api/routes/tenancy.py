"""Organizations, projects, API keys and quotas (hutch's own routes; core/tenancy.py).

``/orgs``: the server's administrator (the bootstrap key) creates organizations and sees all
of them; any other key sees its own. ``/projects`` and ``/keys`` act in the request's
organization (``orgId`` picks another for the administrator). Keys need an admin key;
projects are listed by anyone in the organization and created by admins. An admin key
limited to projects administers inside them only: the keys it makes, lists and revokes are
limited to (some of) its projects, and it makes no projects (``core.tenancy.within``). A quota is read by
anyone in its organization and set by the server's administrator only: limits an
organization could lift itself would limit nothing. A key's secret
is in the answer to its creation and nowhere else, ever.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from hutch.api.access import needs
from hutch.api.http import json_body, ok
from hutch.api.keys import ENGINE, PRINCIPAL, TENANTS
from hutch.core import tenancy
from hutch.core.errors import Forbidden, InvalidInput, NotFound
from hutch.core.tenancy import Access, ApiKeyRecord, OrganizationRecord, ProjectRecord

routes = web.RouteTableDef()


def render_org(org: OrganizationRecord, usage: dict[str, int] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": org.org_id, "name": org.name, "createdAt": org.created_at,
                           "quota": {"sandboxes": org.quota.sandboxes, "memoryBytes": org.quota.memory_bytes,
                                     "cpuMillis": org.quota.cpu_millis, "snapshotBytes": org.quota.snapshot_bytes}}
    if usage is not None:
        # snapshotBytes of the quota bounds storageBytes: snapshots, checkpoints, the uploads
        # of builds not finalized yet, commands' output and what its sandboxes' events take in
        # the event log (service/quotas.py).
        out["usage"] = {"sandboxes": usage["sandboxes"], "memoryBytes": usage["memory_bytes"],
                        "cpuMillis": usage["cpu_millis"], "snapshotBytes": usage["snapshot_bytes"],
                        "checkpointBytes": usage["checkpoint_bytes"], "uploadBytes": usage["upload_bytes"],
                        "outputBytes": usage["output_bytes"], "eventBytes": usage["event_bytes"],
                        "storageBytes": usage["storage_bytes"]}
    return out


def render_project(p: ProjectRecord) -> dict[str, Any]:
    return {"id": p.project_id, "name": p.name, "orgId": p.org_id, "createdAt": p.created_at}


def render_key(k: ApiKeyRecord) -> dict[str, Any]:
    return {"id": k.key_id, "name": k.name, "orgId": k.org_id, "role": k.role.value, "prefix": k.prefix,
            "projects": list(k.projects), "createdAt": k.created_at, "expiresAt": k.expires_at,
            "revokedAt": k.revoked_at, "rate": k.rate, "burst": k.burst}


@routes.get("/orgs")
async def list_orgs(request: web.Request) -> web.Response:
    principal, directory = request[PRINCIPAL], request.app[TENANTS].directory
    orgs = sorted(directory.orgs.values(), key=lambda o: o.created_at)
    if not principal.server_admin:
        orgs = [o for o in orgs if o.org_id == principal.org_id]
    return ok({"orgs": [render_org(o) for o in orgs], "total": len(orgs)})


@routes.post("/orgs")
@needs(Access.SERVER)
async def create_org(request: web.Request) -> web.Response:
    body = await json_body(request)
    org = await request.app[ENGINE].tenancy.create_org(body.get("name"))
    return ok(render_org(org), http_status=201)


@routes.get("/orgs/{org_id}")
async def get_org(request: web.Request) -> web.Response:
    org = _org(request)
    return ok(render_org(org, await request.app[ENGINE].quotas.usage(org.org_id)))


@routes.patch("/orgs/{org_id}/quota")
@needs(Access.SERVER)  # the operator's: a tenant's admin raising its own limits would make them moot
async def set_quota(request: web.Request) -> web.Response:
    org = _org(request)
    body = await json_body(request)
    names = {"sandboxes": "sandboxes", "memoryBytes": "memory_bytes", "cpuMillis": "cpu_millis",
             "snapshotBytes": "snapshot_bytes"}
    unknown = [k for k in body if k not in names and k != "orgId"]
    if unknown:
        raise InvalidInput(f"{unknown[0]}: not a quota; expected {', '.join(names)}", field=unknown[0])
    engine = request.app[ENGINE]
    org = await engine.tenancy.set_quota(org.org_id, {names[k]: v for k, v in body.items() if k in names})
    return ok(render_org(org, await engine.quotas.usage(org.org_id)))


def _org(request: web.Request) -> OrganizationRecord:
    """The path's organization, if the key acts for it (administrators: any); else 404."""
    principal, directory = request[PRINCIPAL], request.app[TENANTS].directory
    org_id = request.match_info["org_id"]
    org = directory.orgs.get(org_id)
    if org is None or not (principal.server_admin or principal.org_id == org_id):
        raise NotFound(f"organization {org_id} not found")
    return org


@routes.get("/projects")
async def list_projects(request: web.Request) -> web.Response:
    principal = request[PRINCIPAL]
    found = request.app[TENANTS].directory.org_projects(principal.org_id)
    if principal.projects:
        found = [p for p in found if p.project_id in principal.projects]
    return ok({"projects": [render_project(p) for p in found], "total": len(found)})


@routes.post("/projects")
@needs(Access.ADMIN)
async def create_project(request: web.Request) -> web.Response:
    body = await json_body(request)
    principal = request[PRINCIPAL]
    if principal.projects:
        raise Forbidden("projects are the organization's: a key limited to projects makes none")
    project = await request.app[ENGINE].tenancy.create_project(principal.org_id, body.get("name"))
    return ok(render_project(project), http_status=201)


@routes.get("/keys")
@needs(Access.ADMIN)
async def list_keys(request: web.Request) -> web.Response:
    principal, directory = request[PRINCIPAL], request.app[TENANTS].directory
    found = sorted((k for k in directory.keys.values()
                    if k.org_id == principal.org_id and tenancy.within(principal.projects, k.projects)),
                   key=lambda k: k.created_at)
    return ok({"keys": [render_key(k) for k in found], "total": len(found)})


@routes.post("/keys")
@needs(Access.ADMIN)
async def create_key(request: web.Request) -> web.Response:
    body = await json_body(request)
    principal = request[PRINCIPAL]
    secret, key = await request.app[ENGINE].tenancy.create_key(
        principal.org_id, role=body.get("role"), name=body.get("name"), projects=_or_none(body, "projects", []),
        expires_at=body.get("expires"), rate=body.get("rate"), burst=body.get("burst"), limit=principal.projects,
        maker=principal.key_id)
    return ok(render_key(key) | {"secret": secret}, http_status=201)


def _or_none(body: dict[str, Any], key: str, default: Any) -> Any:
    """A field's value, ``default`` only when it is left out or null: ``{}`` or ``""`` is a value,
    for the check to refuse, not a silent "none"."""
    value = body.get(key)
    return default if value is None else value


@routes.delete("/keys/{key_id}")
@needs(Access.ADMIN)
async def revoke_key(request: web.Request) -> web.Response:
    principal = request[PRINCIPAL]
    key = await request.app[ENGINE].tenancy.revoke_key(principal.org_id, request.match_info["key_id"],
                                                        principal.projects)
    return ok(render_key(key))
