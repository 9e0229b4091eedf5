"""Placing a sandbox's Nomad job and taking it down again: register it and wait (bounded)
until its task runs, saying why when Nomad cannot place it; stop it, wait for its task to go,
then purge it. Nomad's own scheduler picks the node (jobs.py's spec carries no constraints).

Why placing asks the client and not only the server: a Nomad client reports a new
allocation's first states to the servers as a "typical" update, which it batches for up to a
second (nomad 1.10 client/client.go: ``allocSync`` sends those every 5th tick of 200 ms; only
a status change after the first acknowledged one, or a failure, is sent at once). The task
runs 200-400 ms after the job is registered, the server hears so 200-1000 ms later. So once
the server has an allocation for the job, the driver also knocks on the task through an
alloc exec of a plugin verb (which starts nothing in the sandbox): the client answers it
from its own state, "not started yet" until the task runs. The first of the two to say
"running" wins; a failure still comes from the server's side (sent at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from hutch.core.errors import DriverFailure, HutchError
from hutch.drivers.nomad.client import NomadClient, NomadNotFound
from hutch.drivers.nomad.execs import plugin_verb
from hutch.drivers.nomad.jobs import LIVE, TASK

PLACE_TIMEOUT = 120.0
STOP_TIMEOUT = 20.0
ENDED = ("failed", "lost", "complete")
NODE_GONE = ("lost", "unknown")  # "unknown": the node missed its heartbeats (jobs.py: Disconnect)
KNOCK_EVERY = 0.04  # seconds before the second knock on a task not started yet; then x1.5 ...
KNOCK_MAX = 0.5  # ... up to this (an image pulled for a minute is not knocked on 1,500 times)


async def place(client: NomadClient, job: dict[str, Any]) -> str:
    """Register ``job`` and wait until its allocation runs. Returns the allocation id."""
    job_id = job["Job"]["ID"]
    await client.register(job)
    try:
        return await asyncio.wait_for(_wait_running(client, job_id), PLACE_TIMEOUT)
    except TimeoutError as err:
        raise DriverFailure(f"nomad did not start job {job_id} within {PLACE_TIMEOUT:.0f}s") from err


async def _wait_running(client: NomadClient, job_id: str) -> str:
    index = 0
    knock: asyncio.Task[str] | None = None
    query: asyncio.Future[tuple[Any, int]] | None = None
    try:
        while True:
            query = asyncio.ensure_future(client.blocking_get(f"/v1/job/{job_id}/allocations", index, "10s"))
            waiting: set[asyncio.Future[Any]] = {query} if knock is None else {query, knock}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if knock is not None and knock.done():
                return knock.result()
            allocs, index = query.result()
            for alloc in allocs or []:
                status = alloc.get("ClientStatus")
                if status == "running":
                    state = (alloc.get("TaskStates") or {}).get(TASK) or {}
                    if state.get("State") == "running":
                        return str(alloc["ID"])
                elif status in ENDED:
                    raise DriverFailure(f"nomad could not start the sandbox: {alloc_reason(alloc)}")
                if knock is None and status in LIVE:
                    knock = asyncio.create_task(_knock(client, str(alloc["ID"])))
            if not allocs:
                await _check_placement(client, job_id)
    finally:
        for pending in (knock, query):
            if pending is None:
                continue
            if pending.done():
                if not pending.cancelled():
                    pending.exception()  # retrieved: the other one decided
            else:
                pending.cancel()


async def _knock(client: NomadClient, alloc_id: str) -> str:
    """Returns ``alloc_id`` once its client runs the task (the module's docstring says why).
    Any refusal (the client has not got the allocation yet, the task is not started or not
    running) is tried again; a task that fails is the server's news, not this loop's."""
    delay = KNOCK_EVERY
    while True:
        try:
            await plugin_verb(client, alloc_id, TASK, {"exit": "-"})
            return alloc_id
        except HutchError:
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, KNOCK_MAX)


async def _check_placement(client: NomadClient, job_id: str) -> None:
    """A job with no allocation yet may be blocked: say why instead of waiting for ever."""
    with contextlib.suppress(NomadNotFound):
        job = await client.job(job_id)
        if job.get("Status") == "dead":
            raise DriverFailure(f"nomad job {job_id} ended before it was placed")
    summary, _ = await client.blocking_get(f"/v1/job/{job_id}/evaluations", 0, "1s")
    for ev in summary or []:
        failed = ev.get("FailedTGAllocs") or {}
        for metrics in failed.values():
            reasons = {**(metrics.get("DimensionExhausted") or {}), **(metrics.get("ConstraintFiltered") or {})}
            if reasons or metrics.get("NodesEvaluated") == 0:
                detail = ", ".join(f"{k} ({v})" for k, v in reasons.items()) or "no eligible client node"
                raise DriverFailure(f"nomad cannot place the sandbox: {detail}")


async def stop_job(client: NomadClient, job_id: str, alloc_id: str | None, *, node_lost: bool = False) -> None:
    """Stop the job, wait (bounded) until its task is gone, then purge it and GC the allocation.

    Purging at once would drop the allocation from the server while the client still
    stops it, so destroy would return with the sandbox's processes alive. The job of an
    allocation lost with its node is stopped and *not* purged: the stopped allocation is
    what tells that node, if it comes back, to kill what it still runs (Nomad's job GC
    removes it later)."""
    if node_lost:
        with contextlib.suppress(NomadNotFound):
            await client.deregister(job_id, purge=False)
        return
    if alloc_id is None:
        with contextlib.suppress(NomadNotFound):
            await client.deregister(job_id, purge=True)
        return
    with contextlib.suppress(NomadNotFound):
        await client.deregister(job_id, purge=False)
    deadline = time.monotonic() + STOP_TIMEOUT
    index = 0
    while time.monotonic() < deadline:
        try:
            alloc, index = await client.blocking_get(f"/v1/allocation/{alloc_id}", index, "5s")
        except NomadNotFound:
            break
        if alloc.get("ClientStatus") not in ("running", "pending"):
            break
    with contextlib.suppress(NomadNotFound):
        await client.deregister(job_id, purge=True)
    # Frees the workspace and the container's snapshot now rather than at the next GC.
    with contextlib.suppress(HutchError):
        await client.gc_allocation(alloc_id)


def alloc_reason(alloc: Mapping[str, Any]) -> str:
    """Nomad's own words for why an allocation ended (the task's last events)."""
    status = alloc.get("ClientStatus", "?")
    state = (alloc.get("TaskStates") or {}).get(TASK) or {}
    events = state.get("Events") or []
    details = []
    for ev in events[-4:]:
        text = ev.get("DisplayMessage") or ev.get("Type") or ""
        if (ev.get("Details") or {}).get("oom_killed") == "true":
            text = "OOM killed"
        if text and text not in details:
            details.append(text)
    desc = alloc.get("ClientDescription") or ""
    node = alloc.get("NodeName") or str(alloc.get("NodeID") or "")[:8]
    if status in NODE_GONE:  # the node is the story; the task's last events are stale news
        return f"its node {node} stopped answering (allocation {status}: {desc or 'node down'})"
    where = [f"on node {node}"] if node else []
    desired = alloc.get("DesiredStatus")
    if desired in ("stop", "evict") and status in LIVE:
        # Nomad stops it while its task still runs (a job stopped outside hutch, a drain): the
        # task's words ("Task started by client") and "running" read as if nothing were wrong.
        why = alloc.get("DesiredDescription") or ""
        doing = "evicted" if desired == "evict" else "stopped"
        return "; ".join([f"allocation being {doing} by Nomad" + (f" ({why})" if why else ""), *where])
    parts = [f"allocation {status}"] + where + ([desc] if desc else []) + details
    return "; ".join(parts)
