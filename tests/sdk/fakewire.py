"""A small in-test fake of the sandbox wire (docs/wire.md), for unit-testing the client layer.

It is not the server: it only does what the client's parsing, error mapping, streaming and
long-poll loop need. Commands are scripted: ``wire.script = lambda argv: Script(...)``.
Every request is recorded in ``wire.requests`` for assertions on what the client sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import itertools
import posixpath
import tarfile
import threading
import zipfile
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from aiohttp import web

KEY = "k"


@attrs.define
class Step:
    stream: str  # "stdout" | "stderr"
    data: bytes
    delay: float = 0.0
    # Awaited before the step is played: orders a step after something the client did (e.g. it
    # has received the previous chunk), which a delay only makes likely on a loaded machine.
    after: Callable[[], Awaitable[object]] | None = None


@attrs.define
class Script:
    steps: list[Step] = attrs.field(factory=list)
    exit_code: int | None = 0
    status: str = "completed"
    delay: float = 0.0  # after the last step, before the execution ends


def default_script(argv: list[str]) -> Script:
    if argv[:1] == ["echo"]:
        return Script([Step("stdout", (" ".join(argv[1:]) + "\n").encode())])
    if argv[:1] == ["sleep"]:
        return Script([], delay=float(argv[1]))
    if argv[:1] == ["fail"]:
        return Script([Step("stderr", b"boom\n")], exit_code=int(argv[1]) if len(argv) > 1 else 1)
    return Script([Step("stdout", b"ran " + " ".join(argv).encode() + b"\n")])


@attrs.define(eq=False)
class FakeExecution:
    execution_id: str
    sandbox_id: str
    command: list[str]
    status: str = "running"
    exit_code: int | None = None
    out: bytearray = attrs.field(factory=bytearray)
    err: bytearray = attrs.field(factory=bytearray)
    changed: asyncio.Condition | None = None
    task: asyncio.Task[None] | None = None

    def wire(self, base: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "executionId": self.execution_id,
            "sandboxId": self.sandbox_id,
            "status": self.status,
            "command": self.command,
            "type": "exec",
            "stdoutStreamUrl": f"{base}/streams/{self.execution_id}/stdout?token=t",
            "stderrStreamUrl": f"{base}/streams/{self.execution_id}/stderr?token=t",
        }
        if self.exit_code is not None:
            body["exitCode"] = self.exit_code
            body["durationMs"] = 5
        return body

    @property
    def done(self) -> bool:
        return self.status in ("completed", "failed", "timeout", "cancelled")


class FakeWire:
    def __init__(self) -> None:
        self.script: Callable[[list[str]], Script] = default_script
        self.requests: list[dict[str, Any]] = []
        self.sandboxes: dict[str, dict[str, Any]] = {}
        self.executions: dict[str, FakeExecution] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.ids = itertools.count(1)
        self.omit_exit_code = False  # execution never reports exitCode; status endpoint does
        self.omit_execution_id = False  # oneshot create without executionId
        self.ignore_wait = False  # answer long-polls at once
        self.busy = False  # execute answers 409
        self.fail_next: tuple[int, Any] | None = None  # (status, body) for the next API call
        self.files: dict[str, dict[str, bytes]] = {}  # sandbox -> absolute path -> content
        self.dirs: dict[str, set[str]] = {}  # sandbox -> absolute directories
        self.env: dict[str, dict[str, str]] = {}
        self.jobs: dict[str, FakeExecution] = {}
        self.app = self._make_app()

    # ------------------------------------------------------------------ helpers

    def base(self, request: web.Request) -> str:
        return f"{request.scheme}://{request.host}"

    def calls(self, method: str, prefix: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == method and r["path"].startswith(prefix)]

    def _event(self, sandbox_id: str, type_: str, **payload: Any) -> None:
        events = self.events.setdefault(sandbox_id, [])
        events.append(
            {
                "eventId": f"evt_{len(events) + 1}",
                "sandboxId": sandbox_id,
                "type": type_,
                "event": payload,
                "createdAt": f"2025-01-01T00:00:{len(events):02d}.000Z",
            }
        )

    def _start(self, sandbox_id: str, argv: list[str], *, job: bool = False) -> FakeExecution:
        prefix = "job" if job else "exe"
        ex = FakeExecution(f"{prefix}_{next(self.ids)}", sandbox_id, argv, changed=asyncio.Condition())
        (self.jobs if job else self.executions)[ex.execution_id] = ex
        script = self.script(argv)

        async def play() -> None:
            for step in script.steps:
                if step.delay:
                    await asyncio.sleep(step.delay)
                if step.after is not None:
                    await step.after()
                async with ex.changed:  # type: ignore[union-attr]
                    (ex.out if step.stream == "stdout" else ex.err).extend(step.data)
                    ex.changed.notify_all()  # type: ignore[union-attr]
            if script.delay:
                await asyncio.sleep(script.delay)
            async with ex.changed:  # type: ignore[union-attr]
                ex.status = script.status
                ex.exit_code = script.exit_code
                ex.changed.notify_all()  # type: ignore[union-attr]
            if job:
                return
            sandbox = self.sandboxes[sandbox_id]
            sandbox["executions"] += 1
            if sandbox.get("mode") == "oneshot":
                sandbox["status"] = "terminated"
                if script.exit_code is not None:
                    sandbox["exitCode"] = script.exit_code
                self._event(sandbox_id, "lifecycle:terminated")
            else:
                sandbox["status"] = "idle"

        ex.task = asyncio.get_running_loop().create_task(play())
        return ex

    # ------------------------------------------------------------------ app

    def _make_app(self) -> web.Application:
        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            body = None
            raw: bytes | None = None
            if request.can_read_body:
                if request.content_type == "application/json":
                    body = await request.json()
                else:
                    raw = await request.read()  # aiohttp keeps it for the handler
            self.requests.append(
                {
                    "method": request.method,
                    "path": request.path,
                    "query": dict(request.query),
                    "json": body,
                    "raw_size": len(raw) if raw is not None else None,
                    "headers": dict(request.headers),
                }
            )
            if request.path.startswith("/streams/"):
                return await handler(request)
            if request.headers.get("Authorization") != f"Bearer {KEY}":
                return web.json_response(
                    {"success": False, "message": "invalid API key", "code": "UNAUTHORIZED"},
                    status=401,
                )
            if self.fail_next is not None:
                status, payload = self.fail_next
                self.fail_next = None
                if isinstance(payload, str):
                    return web.Response(status=status, text=payload, content_type="text/html")
                return web.json_response(payload, status=status)
            return await handler(request)

        app = web.Application(middlewares=[record])
        r = app.router
        r.add_post("/sandbox", self.create)
        r.add_get("/sandbox", self.list)
        r.add_get("/sandbox/runtimes", self.runtimes)
        r.add_get("/sandbox/status/{id}", self.status)
        r.add_get("/sandbox/execution/{eid}", self.get_execution)
        r.add_get("/sandbox/sandboxes/{id}/executions", self.list_executions)
        r.add_get("/sandbox/sandboxes/{id}/events", self.list_events)
        r.add_get("/sandbox/{id}", self.get)
        r.add_delete("/sandbox/{id}", self.destroy)
        r.add_post("/sandbox/{id}/execute", self.execute)
        r.add_post("/sandbox/{id}/pause", self.pause)
        r.add_post("/sandbox/{id}/resume", self.resume)
        r.add_patch("/sandbox/env/{id}", self.set_env)
        r.add_post("/sandbox/sandboxes/{id}/jobs", self.create_job)
        r.add_get("/sandbox/sandboxes/{id}/jobs", self.list_jobs)
        r.add_get("/sandbox/sandboxes/{id}/jobs/{jid}", self.get_job)
        r.add_delete("/sandbox/sandboxes/{id}/jobs/{jid}", self.stop_job)
        r.add_get("/fs/list/{id}", self.list_files)
        r.add_post("/fs/mkdir/{id}", self.mkdir)
        r.add_post("/fs/rm/{id}", self.rm)
        r.add_post("/fs/rmdir/{id}", self.rmdir)
        r.add_get("/fs/download/{id}", self.download)
        r.add_post("/fs/upload/{id}", self.upload)
        r.add_post("/fs/{id}", self.write_files)
        r.add_get("/fs/{id}", self.read_file)
        r.add_get("/streams/{eid}/{name}", self.stream)
        return app

    def _not_found(self, what: str, code: str) -> web.Response:
        return web.json_response(
            {"success": False, "message": f"{what} not found", "code": code}, status=404
        )

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        sid = f"sbx_{next(self.ids)}"
        command = body.get("command")
        mode = (command or {}).get("mode") or "interactive"
        self.sandboxes[sid] = {
            "sandboxId": sid,
            "status": "running" if command else "idle",
            "mode": mode,
            "createdAt": "2025-01-01T00:00:00.000Z",
            "executions": 0,
            "runtime": {"id": "srt_base", "name": body.get("runtime", "base:latest")},
            "org": {"id": "org_local", "name": "local"},
            **({"name": body["name"]} if "name" in body else {}),
            **({"resources": body["resources"]} if "resources" in body else {}),
        }
        self._event(sid, "create")
        data: dict[str, Any] = {"sandboxId": sid, "status": self.sandboxes[sid]["status"]}
        if command:
            ex = self._start(sid, command["exec"])
            wire = ex.wire(self.base(request))
            if not self.omit_execution_id:
                data["executionId"] = ex.execution_id
            data["stdoutStreamUrl"] = wire["stdoutStreamUrl"]
            data["stderrStreamUrl"] = wire["stderrStreamUrl"]
        return web.json_response({"success": True, "data": data}, status=201)

    async def list(self, request: web.Request) -> web.Response:
        items = list(self.sandboxes.values())
        if "status" in request.query:
            items = [s for s in items if s["status"] == request.query["status"]]
        total = len(items)
        offset = int(request.query.get("offset", 0))
        limit = int(request.query.get("limit", 50))
        return web.json_response(
            {"success": True, "data": {"sandboxes": items[offset : offset + limit], "total": total}}
        )

    async def runtimes(self, request: web.Request) -> web.Response:
        runtimes = [
            {
                "id": "srt_base",
                "name": "base:latest",
                "description": "Minimal base",
                "requirements": {"memory": "256Mi", "networkEnabled": False},
                "tags": ["base"],
            },
            {"id": "srt_py", "name": "python:3.13"},
        ]
        return web.json_response({"success": True, "data": {"runtimes": runtimes, "total": 2}})

    async def _wait_sandbox(self, sid: str, statuses: list[str], wait_ms: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while loop.time() < deadline:
            if self.sandboxes[sid]["status"] in statuses:
                return
            await asyncio.sleep(0.01)

    async def status(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        if sid not in self.sandboxes:
            return self._not_found("sandbox", "SANDBOX_NOT_FOUND")
        if "waitForStatus" in request.query and not self.ignore_wait:
            await self._wait_sandbox(
                sid,
                request.query["waitForStatus"].split(","),
                int(request.query.get("waitMs", "0")),
            )
        s = self.sandboxes[sid]
        data = {
            "sandboxId": sid,
            "status": s["status"],
            **({"exitCode": s["exitCode"]} if "exitCode" in s else {}),
        }
        return web.json_response({"success": True, "data": data})

    async def get_execution(self, request: web.Request) -> web.Response:
        ex = self.executions.get(request.match_info["eid"])
        if ex is None:
            return self._not_found("execution", "EXECUTION_NOT_FOUND")
        wait = request.query.get("wait")
        if wait and not self.ignore_wait and not ex.done:
            seconds = (
                float(wait[:-2]) / 1000
                if wait.endswith("ms")
                else float(wait[:-1]) * (60 if wait.endswith("m") else 1)
            )
            async with ex.changed:  # type: ignore[union-attr]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ex.changed.wait_for(lambda: ex.done), seconds)  # type: ignore[union-attr]
        data = ex.wire(self.base(request))
        if self.omit_exit_code:
            data.pop("exitCode", None)
        return web.json_response({"success": True, "data": data})

    async def list_executions(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        if sid not in self.sandboxes:
            return self._not_found("sandbox", "SANDBOX_NOT_FOUND")
        items = [
            ex.wire(self.base(request)) for ex in self.executions.values() if ex.sandbox_id == sid
        ]
        return web.json_response({"success": True, "data": {"executions": items}})

    async def list_events(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        if sid not in self.sandboxes:
            return self._not_found("sandbox", "SANDBOX_NOT_FOUND")
        events = list(self.events.get(sid, []))
        if request.query.get("direction") == "desc":
            events.reverse()
        events = events[: int(request.query.get("limit", 50))]
        return web.json_response({"success": True, "data": {"events": events}})

    async def get(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        if sid not in self.sandboxes:
            return self._not_found("sandbox", "SANDBOX_NOT_FOUND")
        return web.json_response({"success": True, "data": self.sandboxes[sid]})

    async def destroy(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        if sid not in self.sandboxes:
            return self._not_found("sandbox", "SANDBOX_NOT_FOUND")
        self.sandboxes[sid]["status"] = "terminated"
        self._event(sid, "destroy")
        return web.json_response({"success": True})

    async def pause(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        self.sandboxes[sid]["status"] = "suspended"
        return web.json_response(
            {
                "success": True,
                "sandboxId": sid,
                "status": "suspended",
                "terminatesAt": "2025-01-02T00:00:00Z",
            }
        )

    async def execute(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        if sid not in self.sandboxes or self.sandboxes[sid]["status"] == "terminated":
            return self._not_found("sandbox", "SANDBOX_NOT_FOUND")
        if self.busy:
            return web.json_response(
                {"success": False, "message": "sandbox is busy", "code": "SANDBOX_BUSY"}, status=409
            )
        body = await request.json()
        resumed = self.sandboxes[sid]["status"] in ("paused", "suspended")
        self.sandboxes[sid]["status"] = "running"
        ex = self._start(sid, body["command"])
        data = ex.wire(self.base(request))
        return web.json_response({"success": True, "data": data, "autoResumed": resumed})

    # ------------------------------------------------------------------ sandbox extras

    async def resume(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        if sid not in self.sandboxes:
            return self._not_found("sandbox", "SANDBOX_NOT_FOUND")
        self.sandboxes[sid]["status"] = "idle"
        self._event(sid, "resume")
        return web.json_response({"success": True})

    async def set_env(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        if sid not in self.sandboxes:
            return self._not_found("sandbox", "SANDBOX_NOT_FOUND")
        env = self.env.setdefault(sid, {})
        for key, value in (await request.json())["env"].items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return web.json_response({"success": True, "data": {"env": dict(env)}})

    # ------------------------------------------------------------------ jobs

    def _job_wire(self, job: FakeExecution, base: str) -> dict[str, Any]:
        status = job.status
        if job.done and status not in ("cancelled",):
            status = "completed" if job.exit_code == 0 else "failed"
        return {
            "jobId": job.execution_id,
            "sandboxId": job.sandbox_id,
            "command": job.command,
            "status": status,
            "exitCode": job.exit_code,
            "startedAt": "2025-01-01T00:00:00.000Z",
            "completedAt": "2025-01-01T00:00:01.000Z" if job.done else None,
            "stdoutStreamUrl": f"{base}/streams/{job.execution_id}/stdout",
            "stderrStreamUrl": f"{base}/streams/{job.execution_id}/stderr",
        }

    async def create_job(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        if sid not in self.sandboxes:
            return self._not_found("sandbox", "SANDBOX_NOT_FOUND")
        body = await request.json()
        ex = self._start(sid, body["command"], job=True)
        return web.json_response(
            {"success": True, "data": self._job_wire(ex, self.base(request))}, status=201
        )

    async def list_jobs(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        limit = int(request.query.get("limit", 50))
        items = [
            self._job_wire(j, self.base(request)) for j in self.jobs.values() if j.sandbox_id == sid
        ]
        return web.json_response({"success": True, "data": {"jobs": items[:limit]}})

    def _find_job(self, request: web.Request) -> FakeExecution | None:
        job = self.jobs.get(request.match_info["jid"])
        return job if job is not None and job.sandbox_id == request.match_info["id"] else None

    async def get_job(self, request: web.Request) -> web.Response:
        job = self._find_job(request)
        if job is None:
            return self._not_found("job", "EXECUTION_NOT_FOUND")
        return web.json_response({"success": True, "data": self._job_wire(job, self.base(request))})

    async def stop_job(self, request: web.Request) -> web.Response:
        job = self._find_job(request)
        if job is None:
            return self._not_found("job", "EXECUTION_NOT_FOUND")
        if not job.done:
            assert job.task is not None
            job.task.cancel()
            async with job.changed:  # type: ignore[union-attr]
                job.status = "cancelled"
                job.exit_code = 137 if request.query.get("force") == "true" else 143
                job.changed.notify_all()  # type: ignore[union-attr]
        return web.json_response({"success": True, "data": self._job_wire(job, self.base(request))})

    # ------------------------------------------------------------------ files

    def _fs(self, sid: str) -> tuple[dict[str, bytes], set[str]]:
        return self.files.setdefault(sid, {}), self.dirs.setdefault(sid, {"/", "/workspace"})

    @staticmethod
    def _abs(path: str | None) -> str:
        return posixpath.normpath(posixpath.join("/workspace", path or "."))

    def _missing(self, path: str) -> web.Response:
        return web.json_response(
            {"success": False, "message": f"path: {path} does not exist", "code": "FILE_NOT_FOUND", "field": "path"},
            status=404,
        )

    def _mkdirs(self, sid: str, path: str) -> None:
        _, dirs = self._fs(sid)
        while path not in dirs:
            dirs.add(path)
            path = posixpath.dirname(path)

    def _put(self, sid: str, path: str, data: bytes) -> None:
        files, _ = self._fs(sid)
        self._mkdirs(sid, posixpath.dirname(path))
        files[path] = data

    async def write_files(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        body = await request.json()
        for f in body["files"]:
            self._put(sid, self._abs(f["path"]), base64.b64decode(f["content"]))
        n = len(body["files"])
        return web.json_response({"success": True, "data": {"filesWritten": n}})

    async def read_file(self, request: web.Request) -> web.StreamResponse:
        sid = request.match_info["id"]
        files, _ = self._fs(sid)
        path = self._abs(request.query.get("path"))
        if path not in files:
            return self._missing(request.query.get("path", ""))
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        data = files[path]
        for i in range(0, len(data), 65536):
            await resp.write(data[i : i + 65536])
        await resp.write_eof()
        return resp

    async def list_files(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        files, dirs = self._fs(sid)
        path = self._abs(request.query.get("path"))

        def info(name: str, size: int, is_dir: bool) -> dict[str, Any]:
            return {
                "path": name,
                "size": size,
                "isDir": is_dir,
                "mode": "0755" if is_dir else "0644",
                "modTime": "2025-01-01T00:00:00Z",
            }

        if path in files:
            items = [info(posixpath.basename(path), len(files[path]), False)]
        elif path in dirs:
            items = [info(posixpath.basename(d), 0, True) for d in sorted(dirs) if d != path and posixpath.dirname(d) == path]
            items += [info(posixpath.basename(f), len(c), False) for f, c in sorted(files.items()) if posixpath.dirname(f) == path]
        else:
            return self._missing(request.query.get("path", ""))
        return web.json_response({"success": True, "data": {"files": items}})

    async def mkdir(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        body = await request.json()
        path = self._abs(body["path"])
        _, dirs = self._fs(sid)
        if not body.get("recursive") and posixpath.dirname(path) not in dirs:
            return self._missing(posixpath.dirname(body["path"]))
        self._mkdirs(sid, path)
        return web.json_response({"success": True})

    async def rm(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        files, _ = self._fs(sid)
        found = files.pop(self._abs((await request.json())["path"]), None) is not None
        return web.json_response({"success": True, "found": found})

    async def rmdir(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        body = await request.json()
        files, dirs = self._fs(sid)
        path = self._abs(body["path"])
        if path not in dirs:
            return web.json_response({"success": True, "found": False})
        inside = [p for p in [*files, *dirs] if p.startswith(path + "/")]
        if inside and not body.get("recursive"):
            return web.json_response(
                {"success": False, "message": f"path: directory {body['path']} is not empty", "code": "INVALID_INPUT"},
                status=400,
            )
        for p in inside:
            files.pop(p, None)
            dirs.discard(p)
        dirs.discard(path)
        return web.json_response({"success": True, "found": True})

    async def download(self, request: web.Request) -> web.StreamResponse:
        sid = request.match_info["id"]
        files, dirs = self._fs(sid)
        root = self._abs(request.query.get("path"))
        if root not in dirs and root not in files:
            return self._missing(request.query.get("path", ""))
        fmt = request.query.get("format", "tar.gz")
        buf = io.BytesIO()
        prefix = root.rstrip("/") + "/"
        members = sorted((p[len(prefix):], c) for p, c in files.items() if p.startswith(prefix))
        subdirs = sorted(d[len(prefix):] for d in dirs if d.startswith(prefix))
        if fmt == "zip":
            with zipfile.ZipFile(buf, "w") as zf:
                for d in subdirs:
                    zf.writestr(d + "/", b"")
                for name, content in members:
                    zf.writestr(name, content)
        else:
            with tarfile.open(fileobj=buf, mode="w:gz" if fmt == "tar.gz" else "w") as tf:
                for d in subdirs:
                    ti = tarfile.TarInfo(d)
                    ti.type = tarfile.DIRTYPE
                    ti.mode = 0o755
                    tf.addfile(ti)
                for name, content in members:
                    ti = tarfile.TarInfo(name)
                    ti.size = len(content)
                    tf.addfile(ti, io.BytesIO(content))
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        await resp.write(buf.getvalue())
        await resp.write_eof()
        return resp

    async def upload(self, request: web.Request) -> web.Response:
        sid = request.match_info["id"]
        raw = await request.read()
        dest = self._abs(request.query.get("path"))
        fmt = request.query.get("format")
        counts = {"files": 0, "directories": 0, "symlinks": 0, "bytes": 0}
        self._mkdirs(sid, dest)
        if fmt == "zip" or raw.startswith(b"PK"):
            with zipfile.ZipFile(io.BytesIO(raw)) as zf:
                for zi in zf.infolist():
                    target = posixpath.normpath(posixpath.join(dest, zi.filename))
                    if zi.is_dir():
                        self._mkdirs(sid, target)
                        counts["directories"] += 1
                    else:
                        content = zf.read(zi)
                        self._put(sid, target, content)
                        counts["files"] += 1
                        counts["bytes"] += len(content)
        else:
            with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tf:
                for ti in tf:
                    target = posixpath.normpath(posixpath.join(dest, ti.name))
                    if ti.isdir():
                        self._mkdirs(sid, target)
                        counts["directories"] += 1
                    elif ti.isreg():
                        content = tf.extractfile(ti).read()  # type: ignore[union-attr]
                        self._put(sid, target, content)
                        counts["files"] += 1
                        counts["bytes"] += len(content)
        return web.json_response({"success": True, "data": counts})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        ex = self.executions.get(request.match_info["eid"]) or self.jobs.get(
            request.match_info["eid"]
        )
        if ex is None:
            return web.Response(status=404)
        name = request.match_info["name"]
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        buf = ex.out if name == "stdout" else ex.err
        sent = 0

        def ready() -> bool:
            return len(buf) > sent or ex.done

        while True:
            async with ex.changed:  # type: ignore[union-attr]
                await ex.changed.wait_for(ready)  # type: ignore[union-attr]
                chunk = bytes(buf[sent:])
                finished = ex.done
            if chunk:
                await resp.write(chunk)
                sent += len(chunk)
            if finished and sent == len(buf):
                break
        await resp.write_eof()
        return resp


class ThreadedServer:
    """The fake on its own loop and thread, for the blocking client and the CLI."""

    def __init__(self, wire_factory: Callable[[], FakeWire] = FakeWire) -> None:
        self._factory = wire_factory
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.wire: FakeWire
        self.url = ""
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> ThreadedServer:
        self._thread.start()

        async def start() -> str:
            self.wire = self._factory()
            self._runner = web.AppRunner(self.wire.app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            return f"http://127.0.0.1:{port}"

        self.url = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            for ex in [*self.wire.executions.values(), *self.wire.jobs.values()]:
                if ex.task is not None:
                    ex.task.cancel()
            assert self._runner is not None
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
