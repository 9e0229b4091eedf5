"""GET /metrics: Prometheus text format, behind the API key like everything but streams.

The engine's view (sandboxes by status, snapshots, the log and projection positions, the
events the projections stepped over as poison)
plus whatever the driver reports about itself (the nomad driver's warm pools) and the process's
counts of its log-path work: appends, log writes, projector batches, PostgreSQL statements."""

from __future__ import annotations

from aiohttp import web

from hutch.api.keys import ENGINE, PRINCIPAL
from hutch.core import counters
from hutch.drivers.base import Metric
from hutch.projections.base import SnapshotQuery

routes = web.RouteTableDef()


def _line(m: Metric) -> str:
    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(m.labels.items()))
    value = int(m.value) if float(m.value).is_integer() else m.value
    return f"{m.name}{{{labels}}} {value}" if labels else f"{m.name} {value}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(metrics: list[Metric]) -> str:
    """Prometheus exposition: one HELP/TYPE per name, its samples after it."""
    out: list[str] = []
    seen: set[str] = set()
    for m in sorted(metrics, key=lambda m: m.name):
        if m.name not in seen:
            seen.add(m.name)
            if m.help:
                out.append(f"# HELP {m.name} {m.help}")
            out.append(f"# TYPE {m.name} {m.kind}")
        out.append(_line(m))
    return "\n".join(out) + "\n"


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    found: list[Metric] = []
    # An organization's key sees its own organization's counts; the server's administrator
    # sees the whole server's, and the driver's own metrics (warm pools: not any one tenant's).
    admin = request[PRINCIPAL].server_admin and "orgId" not in request.query
    found.extend(await engine.usage.counts(whole_server=admin))
    _, snapshots = await engine.snapshots.list(SnapshotQuery(limit=1))
    found.append(Metric("hutch_snapshots", snapshots, "gauge", "ready snapshots"))
    if admin:
        found.extend(engine.usage.driver_metrics())
        # The process's own work on the log path (hutch.core.counters): the server's, not a tenant's.
        found.extend(Metric(name, value, "counter", counters.HELP.get(name, ""), labels)
                     for name, labels, value in counters.counts())
    return web.Response(text=render(found), content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})
