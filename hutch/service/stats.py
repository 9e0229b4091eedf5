"""``GET /sandbox/stats``: usage of the sandboxes created in a time window, folded from the
projections (counts, executions and jobs, wall time) and, for sandboxes still running,
the driver's live cgroup accounting (cpu seconds, peak memory)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from typing import Any

import attrs

from hutch.drivers.roles import UsageReporting
from hutch.projections.base import ProjectionStore, SandboxQuery


def _unix(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def usage(store: ProjectionStore, driver: UsageReporting, start: str | None, end: str | None,
                scope: SandboxQuery | None = None) -> dict[str, Any]:
    """Usage of sandboxes created in [start, end) (of ``scope``'s organization and projects):
    counts by status, executions and jobs by status, and the wall time they ran."""
    everything, _ = await store.list_sandboxes(attrs.evolve(scope or SandboxQuery(), include_deleted=True,
                                                            limit=10**9, direction="asc"))
    lo, hi = _unix(start) if start else float("-inf"), _unix(end) if end else float("inf")
    chosen = [sb for sb in everything if lo <= _unix(sb.created_at) < hi]
    by_status: dict[str, int] = {}
    by_runtime: dict[str, int] = {}
    runs: dict[str, dict[str, int]] = {"exec": {}, "job": {}}
    run_ms = {"exec": 0, "job": 0}
    cpu: dict[str, float] = {}
    memory: dict[str, float] = {}
    now = time.time()
    for sb in chosen:
        used_cpu, used_memory = sb.cpu_seconds, sb.memory_peak_bytes
        if not sb.status.is_final:  # still running: ask the driver now
            with contextlib.suppress(Exception):
                live = await driver.usage(sb.sandbox_id)
                used_cpu, used_memory = live.cpu_seconds, live.memory_peak_bytes
            # A loop turn each: the local driver reads a sandbox's usage on the loop (~0.1 ms),
            # and 10,000 live sandboxes read in a row would hold every other request for a second.
            await asyncio.sleep(0)
        key = sb.status.value
        cpu[key] = cpu.get(key, 0.0) + (used_cpu or 0.0)
        if used_memory:
            # Peak x lifetime: an upper bound of the memory it held over time.
            ended = now if not sb.status.is_final else _unix(sb.updated_at)
            memory[key] = memory.get(key, 0.0) + used_memory / 2**30 * max(0.0, ended - _unix(sb.created_at))
        by_status[sb.status.value] = by_status.get(sb.status.value, 0) + 1
        by_runtime[sb.spec.runtime] = by_runtime.get(sb.spec.runtime, 0) + 1
        for ex in await store.list_executions(sb.sandbox_id):
            kind = "job" if ex.type == "job" else "exec"
            runs[kind][ex.status.value] = runs[kind].get(ex.status.value, 0) + 1
            run_ms[kind] += ex.duration_ms or 0
    return {
        "start": start,
        "end": end,
        "sandboxes": {"created": len(chosen), "byStatus": by_status, "byRuntime": by_runtime},
        "cpu": {"seconds": round(sum(cpu.values()), 3), "byStatus": {k: round(v, 3) for k, v in cpu.items()}},
        "memory": {"gibSeconds": round(sum(memory.values()), 3),  # peak x lifetime, per sandbox
                   "byStatus": {k: round(v, 3) for k, v in memory.items()}},
        "executions": {"total": sum(runs["exec"].values()), "byStatus": runs["exec"], "wallTimeMs": run_ms["exec"]},
        "jobs": {"total": sum(runs["job"].values()), "byStatus": runs["job"], "wallTimeMs": run_ms["job"]},
    }
