"""The nomad driver: a sandbox is a Nomad job whose one task runs in containerd.

- **Job**: ``hutch-<instance>-<sandbox id>``, one group, one task on the
  ``hutch-containerd`` task driver (scripts/services.d/nomad/containerd-driver) from the
  runtime's OCI image (``drivers.nomad.images``): an idle shell as pid 1 that reaps
  orphans, running as the unprivileged sandbox uid with no capabilities, no_new_privs,
  containerd's seccomp profile narrowed to the local driver's floor (socket families,
  io_uring: the plugin's seccomp.go) and a network namespace with only loopback. No restarts,
  no rescheduling: a sandbox that dies is over, and says so (below).
- **Resources**: memory -> the task's MemoryMB (a hard limit), cpu millicores -> a CFS
  quota, pids -> the container's pids limit. Nomad's CPU reservation is kept small so a
  node is not "full" of idle sandboxes.
- **Workspace**: a host directory per allocation (``workspace_root/<alloc id>`` on the
  client) bind-mounted at /home/agentuity, owned by the sandbox uid.
- **Exec**: Nomad's alloc exec websocket. The argv is prefixed with an envelope the
  plugin understands (``hutch-exec:v1`` + JSON env/cwd), because the exec API itself
  carries only argv. Timeout and cancel close the websocket; Nomad then cancels the
  exec and the plugin kills the process and its descendants.
- **Files**: create-time files are a tar stream unpacked by ``tar`` inside the sandbox, as
  the sandbox user; the file primitives and disk checkpoints are ``drivers.nomad.files``.
- **Warm pools** (``pool_sizes``): idle allocations placed ahead of time per runtime,
  with the default resources; a create that asks for nothing else claims one (no
  scheduling on the request path) and a background task refills the pool.
- **Failures**: a watcher follows every allocation with Nomad's blocking queries; an
  allocation of a live sandbox that fails, is lost, is OOM-killed or completes on its
  own is reported through ``Driver.set_listener`` so the engine can end the sandbox with
  a lifecycle event.
- **Restart**: what the driver knows of a sandbox (job, allocation, runtime, env) is a
  small JSON file under ``<data dir>/nomad``; ``alive()`` and recovery read those files
  and ask Nomad which allocations still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import logging
import posixpath
import re
import tarfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from blobs import clear_spool
from blobs.files import FileBlobStore
from core import runtimes
from core.blobs import BlobStore
from core.errors import (
    DriverFailure,
    HutchError,
    IllegalTransition,
    InvalidInput,
    NotSupported,
    RuntimeNotFound,
    SandboxNotFound,
)
from core.runtimes import RuntimeRecipe
from drivers.base import (
    Capabilities,
    Driver,
    ExecRequest,
    ExecResult,
    FileToWrite,
    Metric,
    OutputSink,
    ProvisionRequest,
    Usage,
    check_env,
)
from drivers.builds import Builds
from drivers.egress import AllowLists, flatten
from drivers.local import layers, rootfs
from drivers.nomad import images
from drivers.nomad.client import ExecFailed, NomadClient, NomadNotFound
from drivers.nomad.execs import ENVELOPE, command_envelope, noop, refused, run_tagged
from drivers.nomad.files import NomadFiles
from drivers.nomad.jobs import HOME, PLUGIN, PORT_LABEL, TASK, job_spec
from drivers.nomad.pools import PoolEntry, PoolSizing, WarmPools, fixed_sizes, pool_sizing_from_env
from drivers.nomad.terminal import NomadTerminals

log = logging.getLogger(__name__)

USER = images.USER
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EXIT_TIMEOUT = 124
EXIT_CANCELLED = 137
PLACE_TIMEOUT = 120.0
STOP_TIMEOUT = 20.0
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}$")
_ENDED = ("failed", "lost", "complete")
_NODE_GONE = ("lost", "unknown")  # "unknown": the node missed its heartbeats (jobs.py: Disconnect)
USAGE_TIMEOUT = 2.0  # seconds for one usage read (an alloc exec on the sandbox's client)


@attrs.define
class _Sandbox:
    id: str
    job_id: str
    alloc_id: str
    runtime: str
    env: dict[str, str]
    port_target: tuple[str, int] | None = attrs.field(default=None, eq=False)  # read from Nomad, cached
    allow: dict[str, list[str]] = attrs.field(factory=dict)  # network.allow: each entry's CIDRs (egress.py)


KILL_TRIES = 20  # x 0.1 s: how long a kill waits for a command just starting to be killable


@attrs.define
class _Execution:
    sandbox_id: str
    stop: asyncio.Event
    cancelled: bool = False


class NomadDriver(NomadFiles, NomadTerminals, WarmPools, Driver):
    name = "nomad"

    def __init__(
        self,
        *,
        address: str,
        data_dir: Path,
        registry: str = "127.0.0.1:5000",
        token: str | None = None,
        namespace: str | None = None,
        datacenters: Sequence[str] = ("*",),
        pool_sizes: Mapping[str, int] | None = None,
        pool_sizing: PoolSizing | None = None,
        runtime_cache: Path | None = None,
        blobs: BlobStore | None = None,
    ) -> None:
        self.address = address
        self.registry = registry
        self.runtime_cache = runtime_cache or rootfs.default_cache()  # the trees images are made from
        self._builds = Builds()  # runtimes built and pushed on first use
        self.datacenters = list(datacenters)
        self.state_dir = Path(data_dir) / "nomad"
        # Disk checkpoints (files.py); by default files under the data dir, as they always were.
        self.blobs = blobs or FileBlobStore(Path(data_dir))
        # Two servers (or tests) on one Nomad keep apart: jobs are named per data dir.
        self.instance = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:8]
        self.capabilities = Capabilities(
            memory_limit=True, cpu_limit=True, pids_limit=True, network=True, ports=True, terminals=True,
            pause=True, files=True, checkpoints=True, installs=True, tar_streams=True, kernel_isolation=True,
            egress_allow=True)  # the plugin's allow.go, kept current through its allow verb
        self._allow = AllowLists(self._apply_allow)
        # Warm pools (pools.py): fixed sizes, or adaptive sizing (HUTCH_NOMAD_POOL=auto).
        self._init_pools(pool_sizing or fixed_sizes(pool_sizes))
        self._client = NomadClient(address, token=token, namespace=namespace)
        self._available: set[str] = set()
        self._sandboxes: dict[str, _Sandbox] = {}
        self._executions: dict[str, _Execution] = {}
        self._destroying: set[str] = set()
        self._paused: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._install_lock = asyncio.Lock()  # one layer build and push at a time

    # -- lifecycle -------------------------------------------------------------------

    def _job_prefix(self) -> str:
        return f"hutch-{self.instance}-"

    async def start(self) -> None:
        await self._client.start()
        nodes = await self._client.nodes()
        ready = [n for n in nodes if n.get("Status") == "ready"
                 and (n.get("Drivers") or {}).get(PLUGIN, {}).get("Healthy")]
        if not ready:
            raise DriverFailure(
                f"nomad at {self.address} has no ready client node with the {PLUGIN} task driver; "
                "start it with: ./scripts/services start nomad")
        self._available = await asyncio.to_thread(self._probe_images)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(clear_spool, self.state_dir / "spool")  # checkpoints a kill cut short
        await self._recover()
        self._spawn(self._watch(), "nomad-watch")
        self._start_pools()

    def _probe_images(self) -> set[str]:
        return {r.name for r in runtimes.CATALOG if images.exists(r, self.registry)}

    async def close(self) -> None:
        await self._allow.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._drain_pools()
        await self._client.close()

    def runtimes_available(self) -> set[str]:
        return set(self._available)

    async def build_runtime(self, name: str, progress: Callable[[str], None]) -> None:
        """First use: the runtime's tree (built here as for the local driver), then its image,
        pushed to the registry the Nomad clients pull from."""
        recipe = rootfs.lookup(name)

        def work(log: Callable[[str], None]) -> None:
            rootfs.build(recipe, self.runtime_cache, log=log)
            if not images.exists(recipe, self.registry):
                log(f"{recipe.name}: pushing its image to {self.registry}")
                started = time.monotonic()
                ref = images.push(recipe, self.registry, cache=self.runtime_cache)
                log(f"{recipe.name}: pushed {ref} in {time.monotonic() - started:.1f}s")

        await self._builds.run(recipe.name, progress, work)
        self._available.add(recipe.name)
        self._start_pools()

    def runtimes_building(self) -> set[str]:
        return self._builds.building()

    def runtime_info(self, name: str) -> dict[str, object]:
        return rootfs.build_info(self.runtime_cache, rootfs.lookup(name))

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _lock(self, sid: str) -> asyncio.Lock:
        return self._locks.setdefault(sid, asyncio.Lock())

    # -- state files ---------------------------------------------------------------------

    def _state_path(self, sid: str) -> Path:
        return self.state_dir / f"{sid}.json"

    def _save(self, sb: _Sandbox) -> None:
        tmp = self._state_path(sb.id).with_suffix(".tmp")
        tmp.write_text(json.dumps(attrs.asdict(sb)))
        tmp.rename(self._state_path(sb.id))

    def _load_all(self) -> list[_Sandbox]:
        found = []
        if not self.state_dir.is_dir():
            return found
        for path in self.state_dir.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, TypeError):
                found.append(_Sandbox(**json.loads(path.read_text())))
        return found

    async def _recover(self) -> None:
        """Adopt the sandboxes and pool allocations a previous run of this data dir left."""
        jobs = {j["ID"]: j for j in await self._client.jobs(self._job_prefix())}
        claimed = set()
        for sb in self._load_all():
            claimed.add(sb.job_id)
            if await self._alloc_running(sb.job_id, sb.alloc_id):
                self._sandboxes[sb.id] = sb
                if sb.allow:
                    self._allow.adopt(sb.id, sb.allow)
            else:
                self._state_path(sb.id).unlink(missing_ok=True)
                if sb.job_id in jobs:
                    self._spawn(self._stop_job(sb.job_id, None), f"nomad-reap-{sb.job_id}")
        for job_id, job in jobs.items():
            if job_id in claimed or job.get("Status") == "dead":
                continue
            meta = job.get("Meta") or {}
            runtime = meta.get("hutch.pool")
            allocs = await self._client.job_allocations(job_id)
            running = [a for a in allocs if a.get("ClientStatus") == "running"]
            if runtime and running and self.pool_sizes.get(runtime, 0) > 0:
                self._pool.setdefault(runtime, deque()).append(PoolEntry(job_id, running[0]["ID"], runtime))
            else:  # a sandbox whose state file is gone, or a pool we no longer want
                self._spawn(self._stop_job(job_id, None), f"nomad-reap-{job_id}")

    async def _alloc_running(self, job_id: str, alloc_id: str) -> bool:
        try:
            alloc = await self._client.allocation(alloc_id)
        except NomadNotFound:
            return False
        return alloc.get("JobID") == job_id and alloc.get("ClientStatus") == "running" \
            and alloc.get("DesiredStatus") == "run"

    async def alive(self) -> set[str]:
        return {sid for sid in self._sandboxes if sid not in self._destroying}

    # -- jobs ------------------------------------------------------------------------

    def _image(self, recipe: RuntimeRecipe, layer: str | None = None) -> str:
        return images.image_ref(recipe, self.registry, layer)

    async def prepare(self, req: ProvisionRequest) -> None:
        """Installs: the install layer (built on this host, as the local driver builds it,
        from the same runtime tree) becomes a derived image in the registry, once."""
        await self._layer_image(req)

    async def _layer_image(self, req: ProvisionRequest) -> str | None:
        if not (req.dependencies or req.packages):
            return None
        recipe = runtimes.find(req.runtime)
        if recipe is None:
            raise RuntimeNotFound(f"unknown runtime {req.runtime!r}", field="runtime")
        cache = rootfs.default_cache()
        if not rootfs.is_built(cache, recipe):
            raise RuntimeNotFound(f"installs on the nomad driver build on this host's copy of runtime {recipe.name}, "
                                  f"which is not built; {rootfs.build_hint(recipe.name, cache)}", field="runtime")
        async with self._install_lock:
            key = await asyncio.to_thread(layers.build, recipe, cache, req.dependencies, req.packages, log=log.info)
            if not await asyncio.to_thread(images.exists, recipe, self.registry, key):
                await asyncio.to_thread(images.push, recipe, self.registry, cache=cache, layer=key)
        return key

    async def _place(self, job: dict[str, Any]) -> str:
        """Register ``job`` and wait until its allocation runs. Returns the allocation id."""
        job_id = job["Job"]["ID"]
        await self._client.register(job)
        try:
            return await asyncio.wait_for(self._wait_running(job_id), PLACE_TIMEOUT)
        except TimeoutError as err:
            raise DriverFailure(f"nomad did not start job {job_id} within {PLACE_TIMEOUT:.0f}s") from err

    async def _wait_running(self, job_id: str) -> str:
        index = 0
        while True:
            allocs, index = await self._client.blocking_get(f"/v1/job/{job_id}/allocations", index, "10s")
            for alloc in allocs or []:
                status = alloc.get("ClientStatus")
                if status == "running":
                    state = (alloc.get("TaskStates") or {}).get(TASK) or {}
                    if state.get("State") == "running":
                        return str(alloc["ID"])
                elif status in _ENDED:
                    raise DriverFailure(f"nomad could not start the sandbox: {_alloc_reason(alloc)}")
            if not allocs:
                await self._check_placement(job_id)

    async def _check_placement(self, job_id: str) -> None:
        """A job with no allocation yet may be blocked: say why instead of waiting for ever."""
        with contextlib.suppress(NomadNotFound):
            job = await self._client.job(job_id)
            if job.get("Status") == "dead":
                raise DriverFailure(f"nomad job {job_id} ended before it was placed")
        summary, _ = await self._client.blocking_get(f"/v1/job/{job_id}/evaluations", 0, "1s")
        for ev in summary or []:
            failed = ev.get("FailedTGAllocs") or {}
            for metrics in failed.values():
                reasons = {**(metrics.get("DimensionExhausted") or {}), **(metrics.get("ConstraintFiltered") or {})}
                if reasons or metrics.get("NodesEvaluated") == 0:
                    detail = ", ".join(f"{k} ({v})" for k, v in reasons.items()) or "no eligible client node"
                    raise DriverFailure(f"nomad cannot place the sandbox: {detail}")

    async def _stop_job(self, job_id: str, alloc_id: str | None, *, node_lost: bool = False) -> None:
        """Stop the job, wait (bounded) until its task is gone, then purge it and GC the allocation.

        Purging at once would drop the allocation from the server while the client still
        stops it, so destroy would return with the sandbox's processes alive. The job of an
        allocation lost with its node is stopped and *not* purged: the stopped allocation is
        what tells that node, if it comes back, to kill what it still runs (Nomad's job GC
        removes it later)."""
        if node_lost:
            with contextlib.suppress(NomadNotFound):
                await self._client.deregister(job_id, purge=False)
            return
        if alloc_id is None:
            with contextlib.suppress(NomadNotFound):
                await self._client.deregister(job_id, purge=True)
            return
        with contextlib.suppress(NomadNotFound):
            await self._client.deregister(job_id, purge=False)
        deadline = time.monotonic() + STOP_TIMEOUT
        index = 0
        while time.monotonic() < deadline:
            try:
                alloc, index = await self._client.blocking_get(f"/v1/allocation/{alloc_id}", index, "5s")
            except NomadNotFound:
                break
            if alloc.get("ClientStatus") not in ("running", "pending"):
                break
        with contextlib.suppress(NomadNotFound):
            await self._client.deregister(job_id, purge=True)
        # Frees the workspace and the container's snapshot now rather than at the next GC.
        with contextlib.suppress(HutchError):
            await self._client.gc_allocation(alloc_id)

    # -- provision ----------------------------------------------------------------------

    async def provision(self, req: ProvisionRequest) -> None:
        if not _ID.match(req.sandbox_id):
            raise InvalidInput(f"invalid sandbox id {req.sandbox_id!r}", field="sandbox_id")
        recipe = runtimes.find(req.runtime)
        if recipe is None:
            raise RuntimeNotFound(f"unknown runtime {req.runtime!r}", field="runtime")
        if recipe.name not in self._available:
            raise RuntimeNotFound(
                f"runtime {recipe.name} has no image in the registry {self.registry}; push it with: "
                f"python -m drivers.nomad.images push {recipe.name} --registry {self.registry}", field="runtime")
        check_env(req.env, "env")
        async with self._lock(req.sandbox_id):
            if req.sandbox_id in self._sandboxes:
                raise IllegalTransition(f"sandbox {req.sandbox_id} already exists")
            layer = await self._layer_image(req)
            plain = layer is None and not req.network_enabled and req.port is None
            entry = self._claim(recipe.name, req.resources) if plain else None
            allow = await self._allow.first(req.sandbox_id, req.network_allow) if req.network_allow else None
            if entry is not None:
                sb = _Sandbox(req.sandbox_id, entry.job_id, entry.alloc_id, recipe.name, dict(req.env))
            else:
                job_id = self._job_prefix() + req.sandbox_id
                meta = {"hutch.sandbox": req.sandbox_id, "hutch.runtime": recipe.name}
                job = job_spec(job_id, self._image(recipe, layer), self.datacenters, req.resources, meta,
                               network=req.network_enabled, port=req.port,
                               allow=flatten(allow) if allow is not None else None)
                try:
                    alloc_id = await self._place(job)
                except BaseException:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self._stop_job(job_id, None))
                    raise
                sb = _Sandbox(req.sandbox_id, job_id, alloc_id, recipe.name, dict(req.env))
            if allow is not None:
                sb.allow = allow
            await asyncio.to_thread(self._save, sb)
            self._sandboxes[sb.id] = sb

    def metrics(self) -> list[Metric]:
        return [*self._pool_metric_list(),
                Metric("hutch_nomad_sandboxes", len(self._sandboxes), "gauge", "sandboxes this driver runs")]

    # -- failures ------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Follow allocations; a live sandbox's allocation that ends on its own is reported."""
        index = 0
        while True:
            try:
                allocs, new_index = await self._client.blocking_get(
                    "/v1/allocations", index, "30s", prefix="", task_states="true")
            except HutchError as err:
                log.warning("nomad watch: %s", err.message)
                await asyncio.sleep(1)
                continue
            index = new_index if new_index >= index else 0
            by_alloc = {a["ID"]: a for a in allocs or [] if str(a.get("JobID", "")).startswith(self._job_prefix())}
            for sb in list(self._sandboxes.values()):
                alloc = by_alloc.get(sb.alloc_id)
                if alloc is None or sb.id in self._destroying:
                    continue
                status = alloc.get("ClientStatus")
                if status in _ENDED or status in _NODE_GONE or alloc.get("DesiredStatus") in ("stop", "evict"):
                    await self._lost(sb, _alloc_reason(alloc), failed=status != "complete",
                                     node_lost=status in _NODE_GONE)
            for runtime, pool in self._pool.items():
                dead = [(e, a) for e in pool if (a := by_alloc.get(e.alloc_id)) is not None
                        and a.get("ClientStatus") != "running"]
                for entry, alloc in dead:
                    pool.remove(entry)
                    gone = alloc.get("ClientStatus") in _NODE_GONE  # stopped, not purged (_stop_job)
                    self._spawn(self._stop_job(entry.job_id, entry.alloc_id if gone else None, node_lost=gone),
                                f"nomad-reap-{entry.job_id}")
                if dead:
                    log.warning("warm pool %s: %d idle allocation(s) died; refilling", runtime, len(dead))
                    self._refill_wakeup.set()

    async def _lost(self, sb: _Sandbox, reason: str, *, failed: bool, node_lost: bool = False) -> None:
        self._sandboxes.pop(sb.id, None)
        self._state_path(sb.id).unlink(missing_ok=True)
        for ex in self._executions.values():
            if ex.sandbox_id == sb.id:
                ex.stop.set()
        log.warning("sandbox %s: its allocation %s ended: %s", sb.id, sb.alloc_id, reason)
        self._spawn(self._stop_job(sb.job_id, sb.alloc_id, node_lost=node_lost), f"nomad-reap-{sb.job_id}")
        await self.report_ended(sb.id, f"the sandbox's Nomad allocation ended: {reason}", failed=failed)

    # -- destroy -------------------------------------------------------------------------

    async def destroy(self, sandbox_id: str) -> None:
        if not _ID.match(sandbox_id):
            return
        async with self._lock(sandbox_id):
            sb = self._sandboxes.get(sandbox_id)
            if sb is None:
                self._state_path(sandbox_id).unlink(missing_ok=True)
                return
            self._destroying.add(sandbox_id)
            try:
                for ex in self._executions.values():
                    if ex.sandbox_id == sandbox_id:
                        ex.cancelled = True
                        ex.stop.set()
                # The client kills the task within a second of the stop; its status reaches
                # the server seconds later, so the purge and GC finish in the background.
                with contextlib.suppress(NomadNotFound):
                    await self._client.deregister(sb.job_id, purge=False)
                self._sandboxes.pop(sandbox_id, None)
                self._allow.forget(sandbox_id)
                self._paused.discard(sandbox_id)
                self._state_path(sandbox_id).unlink(missing_ok=True)
                await self._drop_checkpoints(sandbox_id)
                self._spawn(self._stop_job(sb.job_id, sb.alloc_id), f"nomad-reap-{sb.job_id}")
            finally:
                self._destroying.discard(sandbox_id)
        self._locks.pop(sandbox_id, None)

    async def port_target(self, sandbox_id: str) -> tuple[str, int]:
        """Where Nomad mapped the sandbox's port: (client address, host port)."""
        sb = self._running(sandbox_id)
        if sb.port_target is None:
            alloc = await self._client.allocation(sb.alloc_id)
            ports = ((alloc.get("AllocatedResources") or {}).get("Shared") or {}).get("Ports") or []
            found = [p for p in ports if p.get("Label") == PORT_LABEL]
            if not found:
                raise NotSupported(f"sandbox {sandbox_id} has no port", field="network.port")
            sb.port_target = (found[0].get("HostIP") or "127.0.0.1", int(found[0]["Value"]))
        return sb.port_target

    def _running(self, sid: str) -> _Sandbox:
        sb = self._sandboxes.get(sid)
        if sb is None or sid in self._destroying:
            raise SandboxNotFound(f"sandbox {sid} not found")
        return sb

    # -- pause -----------------------------------------------------------------------------

    async def _verb(self, sb: _Sandbox, verb: dict[str, Any]) -> None:
        """A plugin verb (freeze, kill) carried by an alloc exec; no process is started."""
        out = bytearray()
        code = await self._client.exec(
            sb.alloc_id, TASK, [ENVELOPE, json.dumps(verb)], stdin=None,
            on_output=lambda _s, d: out.extend(d), stop=asyncio.Event(), kill=noop)
        if code != 0:
            raise DriverFailure(f"sandbox {sb.id}: {verb} failed (exit {code}): {bytes(out)[:300]!r}")

    async def usage(self, sandbox_id: str) -> Usage:
        """The plugin's usage verb: the container's cgroup accounting, read on the client."""
        sb = self._sandboxes.get(sandbox_id)
        if sb is None:
            return Usage()
        out = bytearray()
        for _ in range(2):  # an alloc exec now and then fails to start on a busy client: once more
            out.clear()
            # Bounded: a client cut off from the network answers nothing (no refusal, no reset),
            # and a status read must not wait for the heartbeat timeout that declares it lost.
            try:
                async with asyncio.timeout(USAGE_TIMEOUT):
                    code = await self._client.exec(
                        sb.alloc_id, TASK, [ENVELOPE, json.dumps({"usage": True})], stdin=None,
                        on_output=lambda _s, d: out.extend(d), stop=asyncio.Event(), kill=noop)
            except TimeoutError:
                return Usage()  # unreachable: asking again would only wait again
            except HutchError:
                continue
            if code == 0:
                break
        else:
            return Usage()
        data = json.loads(bytes(out) or b"{}")
        peak = data.get("memoryPeakBytes")
        return Usage(cpu_seconds=data.get("cpuSeconds"), memory_peak_bytes=int(peak) if peak is not None else None)

    async def pause(self, sandbox_id: str) -> None:
        """Freeze every process of the sandbox (containerd's pause: the cgroup freezer).

        Refused while an execution runs: its timeout could not be enforced on frozen processes."""
        sb = self._running(sandbox_id)
        async with self._lock(sb.id):
            if any(ex.sandbox_id == sb.id for ex in self._executions.values()):
                raise IllegalTransition(f"sandbox {sb.id} has running executions; wait for them or cancel them")
            await self._verb(sb, {"freeze": True})
            self._paused.add(sb.id)

    async def resume(self, sandbox_id: str) -> None:
        sb = self._running(sandbox_id)
        async with self._lock(sb.id):
            await self._verb(sb, {"freeze": False})
            self._paused.discard(sb.id)

    def _check_not_paused(self, sb: _Sandbox) -> None:
        if sb.id in self._paused:
            raise IllegalTransition(f"sandbox {sb.id} is paused; resume it first")

    # -- exec ----------------------------------------------------------------------------

    def _env(self, sb: _Sandbox, extra: Mapping[str, str]) -> list[str]:
        check_env(extra, "env")
        env = {"PATH": DEFAULT_PATH, "HOME": HOME, "USER": USER, "LOGNAME": USER,
               "SHELL": "/bin/bash", "LANG": "C.UTF-8", "HOSTNAME": "sandbox"}
        env.update(sb.env)
        env.update(extra)
        return [f"{k}={v}" for k, v in env.items()]

    async def exec(self, req: ExecRequest, sink: OutputSink) -> ExecResult:
        sb = self._running(req.sandbox_id)
        self._check_not_paused(sb)
        if not req.argv:
            raise InvalidInput("command must not be empty", field="command")
        if req.execution_id in self._executions:
            raise IllegalTransition(f"execution {req.execution_id} is already running")
        envelope = command_envelope(self._env(sb, req.env), req.cwd)
        tag, argv = envelope["tag"], [ENVELOPE, json.dumps({**envelope, "noStdin": not req.stdin}), *req.argv]
        execution = _Execution(sandbox_id=sb.id, stop=asyncio.Event())
        self._executions[req.execution_id] = execution
        timed_out = False

        async def deadline() -> None:
            nonlocal timed_out
            if req.timeout is not None:
                await asyncio.sleep(req.timeout)
                timed_out = True
                execution.stop.set()

        timer = asyncio.create_task(deadline())
        try:
            code = await run_tagged(
                self._client, sb.alloc_id, TASK, argv, tag, stdin=req.stdin,
                on_output=sink.write, stop=execution.stop, kill=lambda: self._kill(sb, tag))  # type: ignore[arg-type]
        except ExecFailed as err:
            refused(err, sb.id, gone=sb.id not in self._sandboxes, cwd=envelope["cwd"])
            raise
        finally:
            timer.cancel()
            self._executions.pop(req.execution_id, None)
        if execution.cancelled:
            return ExecResult(exit_code=EXIT_CANCELLED, cancelled=True)
        if timed_out:
            return ExecResult(exit_code=EXIT_TIMEOUT, timed_out=True)
        if code is None:
            raise DriverFailure(f"sandbox {sb.id} ended while the command ran")
        return ExecResult(exit_code=code)

    async def _apply_allow(self, sid: str, resolved: dict[str, list[str]]) -> None:
        """A refreshed allow-list (AllowLists): the plugin replaces the task's chain."""
        async with self._lock(sid):
            sb = self._running(sid)
            await self._verb(sb, {"allow": flatten(resolved)})
            sb.allow = resolved
            await asyncio.to_thread(self._save, sb)

    async def _kill(self, sb: _Sandbox, tag: str) -> None:
        """Kill everything a running exec started (the plugin's kill verb, itself an alloc exec:
        its tree and every process carrying its tag, scanned until none is left). A command
        cancelled the moment it started may not be the plugin's yet: asked again, briefly."""
        for _ in range(KILL_TRIES):
            if sb.id not in self._sandboxes:
                return
            try:
                await self._verb(sb, {"kill": tag})
                return
            except HutchError:
                await asyncio.sleep(0.1)

    async def cancel(self, execution_id: str) -> None:
        execution = self._executions.get(execution_id)
        if execution is None:
            return
        execution.cancelled = True
        execution.stop.set()

    # -- files ---------------------------------------------------------------------------

    async def write_files(self, sandbox_id: str, files: Sequence[FileToWrite]) -> None:
        sb = self._running(sandbox_id)
        self._check_not_paused(sb)
        if not files:
            return
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for f in files:
                if not f.path or "\0" in f.path or len(f.path) > 4096:
                    raise InvalidInput(f"invalid path {f.path!r}", field="path")
                path = posixpath.normpath(posixpath.join(HOME, f.path))
                info = tarfile.TarInfo(path.lstrip("/"))
                info.size = len(f.content)
                info.mode = f.mode & 0o777
                info.mtime = int(time.time())
                tar.addfile(info, io.BytesIO(f.content))

        class _Errors:
            def __init__(self) -> None:
                self.text = b""

            def write(self, stream: str, data: bytes) -> None:
                self.text += data

        errors = _Errors()
        result = await self.exec(ExecRequest(
            execution_id=f"write-{uuid.uuid4().hex}", sandbox_id=sb.id,
            argv=["tar", "-x", "-p", "-f", "-", "-C", "/", "--no-same-owner", "--overwrite"],
            cwd="/", timeout=120, stdin=buf.getvalue()), errors)
        if result.exit_code != 0:
            message = errors.text.decode(errors="replace").strip()[-500:]
            raise InvalidInput(f"cannot write files: {message or f'tar exited {result.exit_code}'}", field="path")


def _alloc_reason(alloc: Mapping[str, Any]) -> str:
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
    if status in _NODE_GONE:  # the node is the story; the task's last events are stale news
        return f"its node {node} stopped answering (allocation {status}: {desc or 'node down'})"
    where = [f"on node {node}"] if node else []
    parts = [f"allocation {status}"] + where + ([desc] if desc else []) + details
    return "; ".join(parts)


__all__ = ["NomadDriver", "PoolSizing", "pool_sizing_from_env"]
