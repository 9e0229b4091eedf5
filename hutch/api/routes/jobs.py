"""/sandbox/sandboxes/{id}/jobs…: background commands beside executions."""

from __future__ import annotations

from aiohttp import web

from hutch.api.http import base_url, json_body, ok, q_bool, q_int
from hutch.api.keys import ENGINE
from hutch.api.parse import parse_job
from hutch.api.render import job_info
from hutch.core.models import ExecutionState

routes = web.RouteTableDef()


def render_job(request: web.Request, job: ExecutionState) -> dict:
    engine = request.app[ENGINE]
    base = base_url(request)
    return job_info(
        job,
        f"{base}/streams/{engine.streams.derive(job.execution_id, 'stdout')}",
        f"{base}/streams/{engine.streams.derive(job.execution_id, 'stderr')}",
    )


@routes.post("/sandbox/sandboxes/{sandbox_id}/jobs")
async def create_job(request: web.Request) -> web.Response:
    command = parse_job(await json_body(request))
    job = await request.app[ENGINE].executions.start_job(request.match_info["sandbox_id"], command)
    return ok(render_job(request, job), http_status=201)


@routes.get("/sandbox/sandboxes/{sandbox_id}/jobs")
async def list_jobs(request: web.Request) -> web.Response:
    limit = q_int(request, "limit", 50, lo=1, hi=1000)
    jobs = await request.app[ENGINE].reads.list_jobs(request.match_info["sandbox_id"], limit)
    return ok({"jobs": [render_job(request, j) for j in jobs]})


@routes.get("/sandbox/sandboxes/{sandbox_id}/jobs/{job_id}")
async def get_job(request: web.Request) -> web.Response:
    job = await request.app[ENGINE].reads.get_job(request.match_info["sandbox_id"], request.match_info["job_id"])
    return ok(render_job(request, job))


@routes.delete("/sandbox/sandboxes/{sandbox_id}/jobs/{job_id}")
async def stop_job(request: web.Request) -> web.Response:
    job = await request.app[ENGINE].executions.stop_job(
        request.match_info["sandbox_id"], request.match_info["job_id"], force=bool(q_bool(request, "force"))
    )
    return ok(render_job(request, job))
