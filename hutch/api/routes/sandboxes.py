"""/sandbox…: create, list, get, status, destroy, execute, executions, events, runtimes."""

from __future__ import annotations

import contextlib

from aiohttp import web

from hutch.api.http import (
    json_body,
    ok,
    q_bool,
    q_choice,
    q_duration,
    q_instant,
    q_int,
    q_offset,
)
from hutch.api.keys import API_KEY_ID, ENGINE, PRINCIPAL
from hutch.api.parse import parse_create, parse_execute, parse_network_update
from hutch.api.render import (
    operator,
    port_url,
    redact_event,
    render_execution,
    render_sandbox,
    runtime_info,
    stream_urls,
)
from hutch.api.routes import history as history_routes
from hutch.api.routes.audit import audit_stream_id, audit_stream_url
from hutch.api.watchers import hold, while_client_stays
from hutch.core import runtimes
from hutch.core.errors import InvalidInput
from hutch.core.events import PAUSE_FILESYSTEM
from hutch.core.models import Mode, SandboxState, SandboxStatus
from hutch.core.tenancy import Access
from hutch.projections.base import SandboxQuery

routes = web.RouteTableDef()

_STATUSES = tuple(s.value for s in SandboxStatus)
_SORTS = {"name": "name", "created": "createdAt", "createdAt": "createdAt", "updated": "updatedAt",
          "updatedAt": "updatedAt", "status": "status", "mode": "mode",
          "execution_count": "executions"}


@routes.get("/sandbox/runtimes")
async def list_runtimes(request: web.Request) -> web.Response:
    limit = q_int(request, "limit", 100, lo=1, hi=1000)
    offset = q_offset(request)
    sort = q_choice(request, "sort", ("name", "created"), "name")
    direction = q_choice(request, "direction", ("asc", "desc"), "asc")
    catalog_here = request.app[ENGINE].runtimes
    available = catalog_here.available()
    catalog = [(r, r.name in available) for r in runtimes.CATALOG]
    if sort == "name":
        catalog.sort(key=lambda item: item[0].name, reverse=direction == "desc")
    elif direction == "desc":
        catalog.reverse()
    page = catalog[offset : offset + limit]
    building = catalog_here.building()
    return ok({"runtimes": [runtime_info(r, avail, catalog_here.info(r.name), r.name in building)
                            for r, avail in page], "total": len(catalog)})


@routes.get("/sandbox/stats")
async def stats(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    scope = engine.reads.resolved(SandboxQuery(project_id=request.query.get("projectId") or None))  # hutch: per project
    return ok(await engine.usage.report(q_instant(request, "start"), q_instant(request, "end"), scope=scope))


@routes.post("/sandbox")
async def create(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    body = await json_body(request)
    snapshot = await engine.snapshots.resolve(body["snapshot"]) if body.get("snapshot") is not None else None
    req = parse_create(body, snapshot)
    created = await engine.provisioning.create(req, api_key_id=request.get(API_KEY_ID))
    sb = created.sandbox
    data = {"sandboxId": sb.sandbox_id, "status": sb.status.value,
            "auditStreamId": audit_stream_id(engine, sb.sandbox_id),
            "auditStreamUrl": audit_stream_url(request, engine, sb.sandbox_id)}
    if (url := port_url(request, sb)) is not None:
        data["url"] = url
    # A command's streams, or (interactive, no command) the sandbox's own: every execution's
    # output, which @agentuity/runtime's ctx.sandbox reads as the sandbox's stdout/stderr.
    owner = created.execution_id or sb.sandbox_id
    out, err = stream_urls(request, engine, owner)
    if created.execution_id:
        data["executionId"] = created.execution_id
    data.update(
        stdoutStreamId=engine.streams.derive(owner, "stdout"),
        stdoutStreamUrl=out,
        stderrStreamId=engine.streams.derive(owner, "stderr"),
        stderrStreamUrl=err,
    )
    return ok(data, http_status=201)


@routes.get("/sandbox")
async def list_sandboxes(request: web.Request) -> web.Response:
    sort = q_choice(request, "sort", tuple(_SORTS), "created")
    mode = q_choice(request, "mode", tuple(m.value for m in Mode))
    query = SandboxQuery(
        name=request.query.get("name") or None,
        mode=mode,
        project_id=request.query.get("projectId") or None,
        snapshot_id=request.query.get("snapshotId") or None,
        status=q_choice(request, "status", _STATUSES),
        live=q_bool(request, "live"),
        deleted_only=bool(q_bool(request, "deletedOnly")),
        limit=q_int(request, "limit", 50, lo=1, hi=100),
        offset=q_offset(request),
        sort=_SORTS[sort or "created"],
        direction=q_choice(request, "direction", ("asc", "desc"), "desc") or "desc",
    )
    found, total = await request.app[ENGINE].reads.list(query)
    return ok({"sandboxes": [render_sandbox(request, sb) for sb in found], "total": total})


def _wanted_statuses(request: web.Request) -> set[SandboxStatus] | None:
    raw = request.query.get("waitForStatus")
    if not raw:
        return None
    out = set()
    for part in raw.split(","):
        try:
            out.add(SandboxStatus(part.strip()))
        except ValueError as err:
            raise InvalidInput(
                f"waitForStatus: unknown status {part!r}; expected some of {', '.join(_STATUSES)}",
                field="waitForStatus",
            ) from err
    return out


async def _maybe_wait(request: web.Request, sandbox_id: str) -> SandboxState | None:
    """The sandbox, once in a wanted status if the request waits for one; None when the
    client left while waiting."""
    engine = request.app[ENGINE]
    wanted = _wanted_statuses(request)
    wait_ms = q_int(request, "waitMs", 0)
    include_deleted = bool(q_bool(request, "includeDeleted"))
    if wanted and wait_ms:
        # Ended when its client leaves: a wait nobody reads would hold its organization's share
        # of requests at once (api/at_once.py) and the server's memory for up to waitMs.
        waited, gone = await while_client_stays(request, engine.reads.wait_status(sandbox_id, wanted, wait_ms / 1000))
        if gone or waited is None:
            return None
        sb = waited
        if sb.status is SandboxStatus.DELETED and not include_deleted and SandboxStatus.DELETED not in wanted:
            return await engine.reads.require(sandbox_id, include_deleted=False)
        return sb
    return await engine.reads.require(sandbox_id, include_deleted=include_deleted or bool(wanted and SandboxStatus.DELETED in wanted))


@routes.get("/sandbox/status/{sandbox_id}")
async def status(request: web.Request) -> web.Response:
    if (sb := await _maybe_wait(request, request.match_info["sandbox_id"])) is None:
        return web.Response(status=499)  # nobody reads it: the client went away
    data: dict[str, str | int] = {"sandboxId": sb.sandbox_id, "status": sb.status.value}
    # A one-shot's exit code once its command has ended (docs/wire.md 2.5), not only once the
    # sandbox is torn down: the real client's run() polls this every 25 ms until it sees one,
    # and an "idle" without it cost a request more per run, in the middle of the next one.
    if sb.exit_code is not None and (sb.status.is_final or sb.spec.mode is Mode.ONESHOT):
        data["exitCode"] = sb.exit_code
    return ok(data)


@routes.get("/sandbox/execution/{execution_id}")
async def get_execution(request: web.Request) -> web.Response:
    engine, execution_id, wait = request.app[ENGINE], request.match_info["execution_id"], q_duration(request, "wait")
    if not wait:
        return ok(render_execution(request, await engine.reads.get_execution(execution_id)))
    # A long-poll by a key that may act on the sandbox is a waiter: its client leaving for good
    # cancels the command (api/watchers.py). A read-only key's is a reader: it cannot.
    ex, gone = await hold(engine.watchers, request, execution_id, engine.reads.get_execution(execution_id, wait=wait),
                                          counts=request[PRINCIPAL].may(Access.WRITE))
    if gone or ex is None:
        return web.Response(status=499)  # nobody reads it: the client went away
    return ok(render_execution(request, ex))


@routes.post("/sandbox/execution/{execution_id}/cancel")
async def cancel_execution(request: web.Request) -> web.Response:
    ex = await request.app[ENGINE].executions.cancel(request.match_info["execution_id"])
    return ok(render_execution(request, ex))


@routes.get("/sandbox/sandboxes/{sandbox_id}/executions")
async def list_executions(request: web.Request) -> web.Response:
    limit = q_int(request, "limit", 50, lo=1, hi=1000)
    found = await request.app[ENGINE].reads.list_executions(request.match_info["sandbox_id"], limit)
    return ok({"executions": [render_execution(request, ex) for ex in found]})


@routes.get("/sandbox/sandboxes/{sandbox_id}/events")
async def list_events(request: web.Request) -> web.Response:
    limit = q_int(request, "limit", 50, lo=1, hi=100)
    direction = q_choice(request, "direction", ("asc", "desc"), "asc")
    found = await request.app[ENGINE].reads.events(request.match_info["sandbox_id"], limit=limit, reverse=direction == "desc")
    nodes = operator(request)
    return ok(
        {
            "events": [
                {
                    "eventId": ev.event_id,
                    "sandboxId": ev.sandbox_id,
                    "type": ev.type,
                    "event": redact_event(ev, operator=nodes),
                    "createdAt": ev.created_at,
                    "position": ev.position,  # hutch extra: the log position
                }
                for ev in found
            ]
        }
    )


@routes.get("/sandbox/{sandbox_id}")
async def get_sandbox(request: web.Request) -> web.Response:
    if ref := request.query.get("asOf"):  # time travel: as of an event or a time (service/history.py)
        return ok(await history_routes.render_as_of(request, request.match_info["sandbox_id"], ref))
    if (sb := await _maybe_wait(request, request.match_info["sandbox_id"])) is None:
        return web.Response(status=499)  # nobody reads it: the client went away
    usage = None
    if not sb.status.is_final:  # what it has used so far, from the driver (an ended one's is in its events)
        with contextlib.suppress(Exception):
            usage = await request.app[ENGINE].usage.so_far(sb.sandbox_id)
    return ok(render_sandbox(request, sb, usage))


@routes.delete("/sandbox/{sandbox_id}")
async def destroy(request: web.Request) -> web.Response:
    await request.app[ENGINE].control.destroy(request.match_info["sandbox_id"])
    return ok()


@routes.post("/sandbox/{sandbox_id}/execute")
async def execute(request: web.Request) -> web.Response:
    req = parse_execute(await json_body(request))
    ex, auto_resumed = await request.app[ENGINE].executions.execute(request.match_info["sandbox_id"], req)
    info = render_execution(request, ex)
    data = {k: info[k] for k in ("executionId", "status", "stdoutStreamUrl", "stderrStreamUrl") if k in info}
    return ok(data, top={"autoResumed": auto_resumed})


@routes.post("/sandbox/{sandbox_id}/pause")
async def pause(request: web.Request) -> web.Response:
    # No body (Agentuity's client sends none): frozen, memory kept. {"memory": false}: filesystem
    # only, every process ended and the files kept; the resume boots it again.
    memory = (await json_body(request, required=False)).get("memory")
    memory = True if memory is None else memory  # null: as left out
    if not isinstance(memory, bool):
        raise InvalidInput(f"memory: expected true or false, got {memory!r}", field="memory")
    sb = await request.app[ENGINE].control.pause(request.match_info["sandbox_id"], memory=memory)
    # The client reads these at the top level, not under "data".
    top: dict[str, object] = {"sandboxId": sb.sandbox_id, "status": sb.status.value}
    if sb.terminates_at:
        top["terminatesAt"] = sb.terminates_at
    if sb.paused_mode == PAUSE_FILESYSTEM:
        top["memory"] = False
    return ok(top=top)


@routes.post("/sandbox/{sandbox_id}/resume")
async def resume(request: web.Request) -> web.Response:
    await request.app[ENGINE].control.resume(request.match_info["sandbox_id"])
    return ok()


@routes.put("/sandbox/{sandbox_id}/network")
async def update_network(request: web.Request) -> web.Response:
    """The sandbox's egress rules replaced whole (its port stays): the sandbox as it is then."""
    enabled, allow, deny = parse_network_update(await json_body(request))
    sb = await request.app[ENGINE].egress.update(request.match_info["sandbox_id"], enabled=enabled, allow=allow,
                                                 deny=deny)
    return ok(render_sandbox(request, sb))
