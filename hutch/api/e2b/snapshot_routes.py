"""E2B's snapshots and fork (e2b-dev/E2B spec/openapi.yml) on hutch's own: a snapshot is a
hutch snapshot of the sandbox (its home's files and its env, service/snapshots.py), a fork is
hutch's fork (service/fork.py). Neither keeps the memory: a sandbox made from one starts with
no process of its source running (E2B's snapshots keep the memory unless asked not to; the
explicit ask for it, ``memory: true``, is refused naming it).

What a key sees is its organization's, as everywhere: another organization's snapshot or
sandbox answers as one that does not exist."""

from __future__ import annotations

from typing import Any

import attrs
from aiohttp import web

from hutch.api.e2b import ports
from hutch.api.e2b.access import PRINCIPAL_KEY, control, hutch_id
from hutch.api.e2b.control_routes import (
    TEMPLATES,
    live_sandbox,
    page_of,
    read_body,
    render,
    timeout_of,
)
from hutch.api.keys import ENGINE
from hutch.core import runtimes
from hutch.core.errors import InvalidInput, NotFound, NotSupported
from hutch.core.models import SandboxStatus, SnapshotState
from hutch.core.snapshots import check_name
from hutch.core.tenancy import Access
from hutch.projections.base import SnapshotQuery

routes = web.RouteTableDef()
FORK_TIMEOUT = 15  # seconds: E2B's default for forks (SandboxForkRequest.timeout)


def _only(body: dict[str, Any], known: set[str], what: str) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise InvalidInput(f"{unknown[0]}: not a field of {what}", field=unknown[0])


def _info(snap: SnapshotState) -> dict[str, Any]:
    """E2B's SnapshotInfo: its id (what Sandbox.create takes) and its name:tag."""
    return {"snapshotID": snap.snapshot_id, "names": [f"{snap.name}:{snap.tag}" if snap.tag else snap.name]}


@routes.post("/sandboxes/{sandbox_id}/snapshots")
@control(Access.WRITE)
async def create_snapshot(request: web.Request) -> web.Response:
    body = await read_body(request)
    _only(body, {"name", "memory"}, "a snapshot request")
    memory = body.get("memory")
    if memory is not None and not isinstance(memory, bool):
        raise InvalidInput(f"memory: expected true or false, got {memory!r}", field="memory")
    if memory:
        raise NotSupported("memory: hutch's snapshots keep the files and env, not the memory (a sandbox made from "
                           "one starts afresh); ask for mode \"filesystem\" or leave it out", field="memory")
    name = body.get("name")
    if name is not None:
        check_name(name, "name")
    sb = await live_sandbox(request, request.match_info["sandbox_id"])
    snap = await request.app[ENGINE].snapshots.take(sb.sandbox_id, name=name, description=None, tag=None,
                                                    public=False, api_key_id=request[PRINCIPAL_KEY].key_id)
    return web.json_response(_info(snap), status=201)


@routes.get("/snapshots")
@control(Access.READ)
async def list_snapshots(request: web.Request) -> web.Response:
    """The organization's snapshots, newest first, less the instants hutch keeps of its forks;
    ``sandboxID`` the sandbox one was taken from, ``name`` its id or name[:tag]."""
    limit, offset = page_of(request)
    query = SnapshotQuery(source_sandbox_id=hutch_id(request.query.get("sandboxID", "")) or None, forks=False,
                          limit=limit, offset=offset)
    wanted = request.query.get("name") or None
    if wanted is not None and wanted.startswith("snp_"):
        found = [s for s in await _own(request, wanted) if query.source_sandbox_id in (None, s.source_sandbox_id)]
        total = len(found)
        found = found[offset:offset + limit]
    else:
        if wanted is not None:
            name, _, tag = wanted.partition(":")
            query = attrs.evolve(query, name=name, tag=tag or None)
        found, total = await request.app[ENGINE].snapshots.list(query)
    response = web.json_response([_info(s) for s in found])
    if offset + limit < total:
        response.headers["x-next-token"] = str(offset + limit)
    return response


async def _own(request: web.Request, snapshot_id: str) -> list[SnapshotState]:
    try:
        return [await request.app[ENGINE].snapshots.get(snapshot_id, own=True)]
    except NotFound:
        return []


@routes.delete("/templates/{template_id}")
@control(Access.WRITE)
async def delete_template(request: web.Request) -> web.Response:
    """E2B deletes a snapshot as a template: here a snapshot (a 404 for one the organization
    does not have); hutch's runtimes cannot be deleted."""
    template = request.match_info["template_id"]
    if runtimes.find(TEMPLATES.get(template, template)) is not None:
        raise InvalidInput(f"templateID: {template} is one of hutch's runtimes, not a snapshot; only snapshots "
                           "(snp_...) can be deleted", field="templateID")
    await request.app[ENGINE].snapshots.delete(template)
    return web.Response(status=204)


@routes.post("/sandboxes/{sandbox_id}/fork")
@control(Access.WRITE)
async def fork(request: web.Request) -> web.Response:
    """``count`` copies of the sandbox's files and env (hutch's fork), each ended after
    a ``timeout`` of that many seconds, counted as the parent's is (E2B's default 15); one result each, as E2B's."""
    engine = request.app[ENGINE]
    body = await read_body(request)
    _only(body, {"timeout", "count"}, "a fork request")
    seconds = timeout_of({"timeout": body.get("timeout", FORK_TIMEOUT)}, lowest=0)
    sb = await live_sandbox(request, request.match_info["sandbox_id"])
    _snap, made = await engine.forks.fork(sb.sandbox_id, body.get("count", 1),
                                          api_key_id=request[PRINCIPAL_KEY].key_id,
                                          idle_timeout=f"{max(1, seconds)}s")
    results = [await _started(request, created.sandbox.sandbox_id) for created in made]
    return web.json_response(results, status=201)


async def _started(request: web.Request, sandbox_id: str) -> dict[str, Any]:
    """One fork's result: the sandbox, or the error that kept it from starting (E2B's shape)."""
    engine = request.app[ENGINE]
    sb = await engine.reads.wait_not_creating(sandbox_id)
    if sb.status not in (SandboxStatus.IDLE, SandboxStatus.RUNNING):
        return {"error": {"code": 500, "message": f"fork {sandbox_id} did not start: {sb.reason or sb.status.value}"}}
    if sb.spec.runtime == ports.RUNTIME:  # a code interpreter's copy: its server started as at create
        try:
            await ports.start_interpreter(request.app, sb.sandbox_id)
        except Exception as err:  # reported as that fork's error, as E2B reports one
            ports.forget(request.app, sb.sandbox_id)
            await engine.control.destroy(sb.sandbox_id)
            return {"error": {"code": 500, "message": f"fork {sandbox_id}: its interpreter did not start ({err})"}}
    return {"sandbox": render(request, sb, detail=False)}

