"""Lifecycle, runtimes, pause, usage, checkpoints and the node's capacity."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
from typing import Any

from aiohttp import web

from hutch.core import phases
from hutch.core.capacity import MEMORY_OVERCOMMIT, Room, shortfall
from hutch.core.driver_types import ProvisionRequest, ResourceLimits
from hutch.core.errors import HutchError, InvalidInput, NodeFull
from hutch.core.serde import converter
from hutch.drivers.local.admission import host_memory
from hutch.drivers.node import placement
from hutch.node.census import Census
from hutch.node.config import NodeSettings
from hutch.node.drain import DRAIN, Drain
from hutch.node.keys import DRIVER, INSTANCE, SETTINGS

log = logging.getLogger(__name__)


class Ends:
    """Sandboxes whose init ended without a destroy (LocalDriver.report_ended), numbered for
    the node driver to fetch what it has not seen (``GET /v1/ended?after=N``). Bounded: a
    driver away for more than ``KEEP`` ends reconciles through its list of sandboxes."""

    KEEP = 1000

    def __init__(self) -> None:
        self.seq = 0
        self.items: collections.deque[tuple[int, dict[str, object]]] = collections.deque(maxlen=self.KEEP)

    async def record(self, sandbox_id: str, reason: str, failed: bool) -> None:
        self.seq += 1
        self.items.append((self.seq, {"seq": self.seq, "sandbox": sandbox_id, "reason": reason, "failed": failed}))


ENDS = web.AppKey("ends", Ends)
CENSUS = web.AppKey("census", Census)


async def snapshot(app: web.Application) -> dict[str, Any]:
    driver = app[DRIVER]
    live = await app[CENSUS].current(driver)
    memory = sum(m for m, _ in live.values())
    cpu = sum(c for _, c in live.values())
    total, available = host_memory()
    return {
        "name": app[SETTINGS].name, "instance": app[INSTANCE],
        "cpus": os.cpu_count() or 1, "memory_total": total, "memory_available": available,
        "memory_committed": memory, "cpu_committed_millis": cpu, "sandboxes": len(live),
        "max_sandboxes": app[SETTINGS].max_sandboxes, "memory_limit": app[SETTINGS].memory_limit,
        "runtimes": sorted(driver.runtimes_available()), "building": sorted(driver.runtimes_building()),
        "capabilities": converter.unstructure(driver.capabilities), "ended_seq": app[ENDS].seq,
        "draining": app[DRAIN].draining,
        "destroy_measures": True,  # DELETE ?usage=1 answers the usage: the driver's end is one call
    }


async def capacity(request: web.Request) -> web.Response:
    return web.json_response(await snapshot(request.app))


class Admission:
    """The agent's own check at provision, the last word when API replicas place at once: what
    is starting counts as taken until it runs (and shows in the snapshot).

    The warm pool's idle sandboxes (drivers/local/pool.py) count too, as the local driver's
    host admission counts them (its admission.py), through the pool's ``SpareRoom``: a refill
    starts one only where the node has room for it beside every sandbox, create under way and
    other spare, so a node at its bound grows none. They are claimable capacity: a create is
    not refused for them, nor are they in the snapshot the API's node driver places by (a node
    of one sandbox and one spare at a bound of 2 takes a second); a create that claims one is
    counted once (the spare leaves the count as it is claimed, ``starting`` has the create);
    one made from scratch beside them may take the node past its bound, and ``surplus`` names
    the spares the pool then destroys. Before, a full node went on starting two per runtime."""

    def __init__(self, settings: NodeSettings, census: Census, drain: Drain) -> None:
        self.lock = asyncio.Lock()
        self.starting: dict[str, tuple[int, int]] = {}
        # sandbox -> set once its provision here ended (made or not): a destroy waits for it.
        self.making: dict[str, asyncio.Event] = {}
        self._settings, self._census, self._drain = settings, census, drain
        self._spares: dict[str, int] = {}  # the pool's idle sandboxes and those starting: name -> memory

    def _committed(self) -> tuple[dict[str, tuple[int, int]], int, int] | None:
        """The sandboxes as last counted, and the memory and count of them, the creates under
        way and the spares; None before the first count (a spare waits for one: the pool fills
        only after a create, whose admission counts)."""
        live = self._census.known()
        if live is None:
            return None
        memory = (sum(m for m, _ in live.values()) + sum(m for m, _ in self.starting.values())
                  + sum(self._spares.values()))
        return live, memory, len(live) + len(self.starting) + len(self._spares)

    def spare(self, name: str, memory: int | None) -> bool:
        if name in self._spares:
            return True
        counted = self._committed()
        if counted is None or self._drain.draining:
            return False
        _, committed, count = counted
        need = placement.need(ResourceLimits(memory_bytes=memory))[0]
        total, available = host_memory()
        room = Room(name=self._settings.name, memory_total=total, memory_available=available,
                    memory_committed=committed, sandboxes=count, max_sandboxes=self._settings.max_sandboxes,
                    memory_limit=self._settings.memory_limit)
        if shortfall(room, need, 0):
            return False
        self._spares[name] = need
        return True

    def spare_gone(self, name: str) -> None:
        self._spares.pop(name, None)

    def surplus(self) -> list[str]:
        """The spares past the node's bounds (its sandbox count, its commit limit), newest first.
        MemAvailable is not asked: what a spare uses shows in it already."""
        counted = self._committed()
        if counted is None:
            return []
        _, committed, count = counted
        total, _ = host_memory()
        limit = self._settings.memory_limit
        over_count = count - self._settings.max_sandboxes
        over_memory = committed - (total * MEMORY_OVERCOMMIT if limit is None else limit)
        out: list[str] = []
        for name, need in reversed(self._spares.items()):
            if over_count <= 0 and over_memory <= 0:
                break
            out.append(name)
            over_count, over_memory = over_count - 1, over_memory - need
        return out

    async def admit(self, app: web.Application, req: ProvisionRequest) -> None:
        async with self.lock:
            if app[DRAIN].draining:
                raise NodeFull(f"{app[SETTINGS].name} is draining")
            s = await snapshot(app)
            state = placement.NodeState(
                name=str(s["name"]), cpus=int(s["cpus"]), memory_total=int(s["memory_total"]),
                memory_available=int(s["memory_available"]), memory_committed=int(s["memory_committed"]),
                cpu_committed_millis=int(s["cpu_committed_millis"]), sandboxes=int(s["sandboxes"]),
                max_sandboxes=int(s["max_sandboxes"]), memory_limit=app[SETTINGS].memory_limit)
            held = (sum(m for m, _ in self.starting.values()), sum(c for _, c in self.starting.values()),
                    len(self.starting))
            why = placement.refusal(state, req.resources, held)
            if why:
                raise NodeFull(why)
            self.starting[req.sandbox_id] = placement.need(req.resources)


ADMISSION = web.AppKey("admission", Admission)

async def ended(request: web.Request) -> web.Response:
    after = int(request.query.get("after", "0"))
    return web.json_response({"ended": [e for seq, e in request.app[ENDS].items if seq > after]})


async def list_sandboxes(request: web.Request) -> web.Response:
    return web.json_response({"sandboxes": sorted(await request.app[DRIVER].alive())})


async def get_sandbox(request: web.Request) -> web.Response:
    return web.json_response({"alive": request.app[DRIVER].is_alive(request.match_info["id"])})


def _request(body: object, sid: str) -> ProvisionRequest:
    req = converter.structure(body, ProvisionRequest)
    if req.sandbox_id != sid:
        raise ValueError(f"the body names sandbox {req.sandbox_id}, the path {sid}")
    return req


async def provision(request: web.Request) -> web.Response:
    driver, sid = request.app[DRIVER], request.match_info["id"]
    req = _request(await request.json(), sid)
    admission = request.app[ADMISSION]
    while (earlier := admission.making.get(sid)) is not None:
        await earlier.wait()  # a retried create waits for the first one's end
    # Idempotent by id: a retried create (its answer lost) must not make a second sandbox.
    # One sandbox's init read, not the node's every one (admission lists them once).
    if driver.is_alive(sid):
        return web.json_response({"ok": True})
    made = admission.making[sid] = asyncio.Event()
    try:
        with phases.span("agent: provision, admission"):
            await admission.admit(request.app, req)
        try:
            with phases.span("agent: provision, the local driver's whole"):
                await driver.provision(req)
            request.app[CENSUS].made(driver, sid)
        finally:
            admission.starting.pop(sid, None)
    finally:
        del admission.making[sid]
        made.set()
    return web.json_response({"ok": True})


async def prepare(request: web.Request) -> web.Response:
    await request.app[DRIVER].prepare(_request(await request.json(), request.match_info["id"]))
    return web.json_response({"ok": True})


async def destroy(request: web.Request) -> web.Response:
    """``?usage=1``: answered with what the sandbox used, read just before it ends (best
    effort: null when it cannot be read), so the API's end is one call, not a read and a call."""
    driver, sid = request.app[DRIVER], request.match_info["id"]
    if (making := request.app[ADMISSION].making.get(sid)) is not None:
        # A create of it still under way here (its API replica may have died waiting, and a
        # survivor ends what it left: takeover.py): ended once made, not missed and made after.
        await making.wait()
    answer: dict[str, object] = {"ok": True}
    if request.query.get("usage") == "1":
        try:
            answer["usage"] = converter.unstructure(await driver.usage(sid))
        except Exception:  # a sandbox half gone still ends; its usage is unknown
            log.warning("reading the usage of %s before its end failed", sid, exc_info=True)
            answer["usage"] = None
    await driver.destroy(sid)
    request.app[CENSUS].ended(sid)
    return web.json_response(answer)


async def runtime_info(request: web.Request) -> web.Response:
    return web.json_response(request.app[DRIVER].runtime_info(request.match_info["name"]))


async def runtimes_built(request: web.Request) -> web.Response:
    """Size and build time of every runtime built here (read when the set changes)."""
    driver = request.app[DRIVER]
    return web.json_response({name: driver.runtime_info(name) for name in sorted(driver.runtimes_available())})


async def build_runtime(request: web.Request) -> web.StreamResponse:
    """NDJSON: ``{"progress": line}`` as the build goes, then ``{"ok": true}`` or ``{"error": …}``."""
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    lines: asyncio.Queue[str] = asyncio.Queue()
    build = asyncio.ensure_future(request.app[DRIVER].build_runtime(request.match_info["name"], lines.put_nowait))
    while not build.done() or not lines.empty():
        getter = asyncio.ensure_future(lines.get())
        await asyncio.wait({getter, build}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            await resp.write(json.dumps({"progress": getter.result()}).encode() + b"\n")
        else:
            getter.cancel()
    try:
        build.result()
        last: dict[str, object] = {"ok": True}
    except HutchError as err:
        last = {"error": err.to_wire(), "status": err.status or 500}
    await resp.write(json.dumps(last).encode() + b"\n")
    await resp.write_eof()
    return resp


async def pause(request: web.Request) -> web.Response:
    memory = request.query.get("memory", "1")
    if memory not in ("0", "1"):
        raise InvalidInput(f"memory: expected 0 or 1, got {memory!r}", field="memory")
    await request.app[DRIVER].pause(request.match_info["id"], memory=memory == "1")
    return web.json_response({"ok": True})


async def resume(request: web.Request) -> web.Response:
    await request.app[DRIVER].resume(request.match_info["id"])
    return web.json_response({"ok": True})


async def update_network(request: web.Request) -> web.Response:
    """A live sandbox's egress rules replaced (NetworkRules): the server checked them."""
    body = await request.json()
    if not isinstance(body, dict):
        body = {}
    enabled, allow, deny = body.get("enabled"), body.get("allow"), body.get("deny")
    if not (isinstance(enabled, bool) and isinstance(allow, list) and isinstance(deny, list)
            and all(isinstance(e, str) for e in [*allow, *deny])):
        raise InvalidInput("network: expected {enabled: bool, allow: [str], deny: [str]}", field="network")
    await request.app[DRIVER].update_network(request.match_info["id"], enabled=enabled, allow=tuple(allow),
                                             deny=tuple(deny))
    return web.json_response({"ok": True})


async def usage(request: web.Request) -> web.Response:
    disk = request.query.get("disk") == "1"
    return web.json_response(converter.unstructure(await request.app[DRIVER].usage(request.match_info["id"],
                                                                                   disk=disk)))


async def checkpoint(request: web.Request) -> web.Response:
    await request.app[DRIVER].checkpoint(request.match_info["id"], request.match_info["cid"])
    return web.json_response({"ok": True})


async def restore(request: web.Request) -> web.Response:
    await request.app[DRIVER].restore(request.match_info["id"], request.match_info["cid"])
    return web.json_response({"ok": True})


async def delete_checkpoint(request: web.Request) -> web.Response:
    await request.app[DRIVER].delete_checkpoint(request.match_info["id"], request.match_info["cid"])
    return web.json_response({"ok": True})


async def checkpoint_sizes(request: web.Request) -> web.Response:
    return web.json_response(await request.app[DRIVER].checkpoint_sizes(request.match_info["id"]))


def add_routes(app: web.Application) -> None:
    app[ENDS] = ends = Ends()
    app[CENSUS] = census = Census()
    app[ADMISSION] = Admission(app[SETTINGS], census, app[DRAIN])

    async def on_end(sandbox_id: str, reason: str, failed: bool) -> None:
        census.ended(sandbox_id)
        await ends.record(sandbox_id, reason, failed)

    app[DRIVER].set_listener(on_end)
    r = app.router
    r.add_get("/v1/node", capacity)
    r.add_get("/v1/ended", ended)
    r.add_get("/v1/sandboxes", list_sandboxes)
    r.add_get("/v1/sandboxes/{id}", get_sandbox)
    r.add_put("/v1/sandboxes/{id}", provision)
    r.add_delete("/v1/sandboxes/{id}", destroy)
    r.add_post("/v1/sandboxes/{id}/prepare", prepare)
    r.add_get("/v1/runtimes", runtimes_built)
    r.add_get("/v1/runtimes/{name}", runtime_info)
    r.add_post("/v1/runtimes/{name}/build", build_runtime)
    r.add_post("/v1/sandboxes/{id}/pause", pause)
    r.add_post("/v1/sandboxes/{id}/resume", resume)
    r.add_put("/v1/sandboxes/{id}/network", update_network)
    r.add_get("/v1/sandboxes/{id}/usage", usage)
    r.add_get("/v1/sandboxes/{id}/checkpoints", checkpoint_sizes)
    r.add_post("/v1/sandboxes/{id}/checkpoints/{cid}", checkpoint)
    r.add_post("/v1/sandboxes/{id}/checkpoints/{cid}/restore", restore)
    r.add_delete("/v1/sandboxes/{id}/checkpoints/{cid}", delete_checkpoint)
