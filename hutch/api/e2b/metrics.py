"""E2B's sandbox metrics (``GET /sandboxes/{id}/metrics``, ``GET /sandboxes/metrics``) from
what the driver reads now: its memory and disk, their totals, its CPUs. No sampler runs in
the background, so a sandbox has one sample, taken when asked, stamped with that second; a
time range that does not hold that second has none.

CPU use is a rate, and the driver gives CPU seconds: the percentage is over the time since
the previous reading of the same sandbox (kept here, a bounded number of sandboxes), or, at
the first, since the sandbox started."""

from __future__ import annotations

import collections
import math
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from hutch.api.e2b.access import control
from hutch.api.e2b.control_routes import live_sandbox
from hutch.api.e2b.query_params import END, SANDBOX_IDS, START, integer, items
from hutch.api.keys import ENGINE
from hutch.api.route_schemas import Param
from hutch.core.driver_types import Usage
from hutch.core.errors import InvalidInput, NotFound, NotSupported
from hutch.core.models import SandboxState
from hutch.core.tenancy import Access

routes = web.RouteTableDef()
# The fields E2B's SandboxMetric requires, by where the driver's Usage has them.
_FIELDS = {"cpuCount": "cpu_count", "memUsed": "memory_bytes", "memTotal": "memory_total_bytes",
           "memCache": "memory_cache_bytes", "diskUsed": "disk_used_bytes", "diskTotal": "disk_total_bytes"}


class CpuReadings:
    """The last (wall time, CPU seconds) read of each sandbox, the oldest forgotten past ``size``."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._last: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()

    def percent(self, sandbox_id: str, started: float, cpu_seconds: float, cpus: int, now: float) -> float:
        """CPU use since the previous reading (since ``started``, Unix seconds, at the first),
        in percent of all the ``cpus`` it may use."""
        since, before = self._last.pop(sandbox_id, (started, 0.0))
        self._last[sandbox_id] = (now, cpu_seconds)
        while len(self._last) > self._size:
            self._last.popitem(last=False)
        if now - since < 0.05 or cpu_seconds < before:  # too short a window to tell: since the start
            since, before = started, 0.0
        # Two clocks (the host's CPU accounting, this process's wall time) read a moment apart
        # can make a busy sandbox look a little over its CPUs.
        return round(min(100.0, max(0.0, (cpu_seconds - before) / max(now - since, 1e-3) / cpus * 100)), 2)


CPU_READINGS: web.AppKey[CpuReadings] = web.AppKey("e2b_cpu_readings", CpuReadings)


def _unix(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _seconds(request: web.Request, param: Param) -> int | None:
    raw = request.query.get(param.name)
    return integer(param, raw) if raw else None


async def _sample(request: web.Request, sb: SandboxState) -> dict[str, Any]:
    """One sample of ``sb`` now, in E2B's SandboxMetric shape; refused, naming what is
    missing, where the driver cannot tell a field."""
    engine = request.app[ENGINE]
    used: Usage = await engine.usage.now(sb.sandbox_id)
    missing = [wire for wire, field in _FIELDS.items() if getattr(used, field) is None]
    if used.cpu_seconds is None:
        missing.insert(0, "cpuUsedPct")
    if missing:
        raise NotSupported(f"metrics: driver {engine.usage.driver_name} does not report "
                           f"{', '.join(missing)} of sandbox {sb.sandbox_id}", field="metrics")
    now = time.time()
    assert used.cpu_seconds is not None and used.cpu_count is not None
    pct = request.app[CPU_READINGS].percent(sb.sandbox_id, _unix(sb.created_at), used.cpu_seconds, used.cpu_count,
                                            now)
    second = math.floor(now)
    return {"timestamp": datetime.fromtimestamp(second, UTC).isoformat().replace("+00:00", "Z"),
            "timestampUnix": second, "cpuUsedPct": pct,
            **{wire: getattr(used, field) for wire, field in _FIELDS.items()}}


@routes.get("/sandboxes/{sandbox_id}/metrics")
@control(Access.READ)
async def sandbox_metrics(request: web.Request) -> web.Response:
    """The sandbox's samples from ``start`` to ``end`` (Unix seconds; its start and now unless
    given): the one taken now, if that second is in the range."""
    start, end = _seconds(request, START), _seconds(request, END)
    if start is not None and end is not None and start > end:
        raise InvalidInput(f"start: {start} is after end {end}", field="start")
    sb = await live_sandbox(request, request.match_info["sandbox_id"])
    second = math.floor(time.time())
    if (start is not None and second < start) or (end is not None and second > end):
        return web.json_response([])
    return web.json_response([await _sample(request, sb)])


@routes.get("/sandboxes/metrics")
@control(Access.READ)
async def many_metrics(request: web.Request) -> web.Response:
    """The latest sample of each sandbox of ``sandbox_ids`` (comma-separated) the key's
    organization has live; the others are left out, as E2B's are."""
    ids = items(SANDBOX_IDS, request.query.get(SANDBOX_IDS.name, ""))
    if not ids:
        raise InvalidInput("sandbox_ids: required, sandbox ids separated by commas", field="sandbox_ids")
    found: dict[str, Any] = {}
    for sandbox_id in dict.fromkeys(ids):
        try:
            sb = await live_sandbox(request, sandbox_id)
        except NotFound:
            continue
        found[sandbox_id] = await _sample(request, sb)
    return web.json_response({"sandboxes": found})
