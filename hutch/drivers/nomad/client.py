"""Nomad's HTTP API for the nomad driver, wrapped once.

python-nomad (synchronous, requests) does the control plane: register and deregister
jobs, read allocations and nodes. Its calls run in a worker thread, never on the event
loop, and its errors become ``DriverFailure`` (or ``NomadNotFound``) here. What
python-nomad cannot do is done with aiohttp on the loop: blocking queries (``?index=``)
that wait for an allocation to change, and the alloc exec websocket
(``/v1/client/allocation/{id}/exec``) that streams a command's stdin, stdout, stderr and
exit code.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.parse
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import nomad
import nomad.api.exceptions as nomad_errors
import requests

from hutch.core.errors import DriverFailure

STDIN_CHUNK = 48 * 1024  # bytes per websocket frame (base64 grows it by a third)
KILL_GRACE = 5.0  # seconds to wait for the exit of a killed command


class NomadNotFound(DriverFailure):
    """Nomad answered 404 (a job or allocation that does not exist)."""


class ExecFailed(DriverFailure):
    """The alloc exec endpoint refused or aborted the command; ``reason`` is Nomad's text."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"nomad exec failed: {reason}")
        self.reason = reason


class StreamLost(ExecFailed):
    """The exec stream ended before the exit frame, and Nomad said nothing of why (no close
    frame: code 1006, or the connection broke). Nomad 1.10's HTTP handler closes the websocket
    that way whenever the client's stream ended with an error it takes for a closed pipe ("EOF",
    "closed": command/agent/alloc_endpoint.go, isClosedError), so this says nothing about
    whether the command ran: the caller asks the plugin (execs.run_tagged)."""


def _describe(err: Exception) -> str:
    resp = getattr(err, "nomad_resp", None)
    if resp is not None:
        text = getattr(resp, "text", "") or ""
        status = getattr(resp, "status_code", "?")
        return f"HTTP {status}: {text.strip()[:500]}"
    return f"{type(err).__name__}: {err}"


class NomadClient:
    def __init__(self, address: str, *, token: str | None = None, namespace: str | None = None) -> None:
        self.address = address.rstrip("/")
        self.token = token
        self.namespace = namespace
        # Our own requests session, so close() releases its pooled connections (Nomad limits
        # connections per client address).
        self._session = requests.Session()
        self._nomad = nomad.Nomad(address=self.address, token=token, namespace=namespace, timeout=30,
                                  session=self._session)
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        headers = {"X-Nomad-Token": self.token} if self.token else {}
        self._http = aiohttp.ClientSession(headers=headers)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        self._session.close()

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise DriverFailure("the nomad client is not started")
        return self._http

    # -- python-nomad, off the loop ---------------------------------------------------

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except nomad_errors.URLNotFoundNomadException as err:
            raise NomadNotFound(f"nomad: {what}: not found ({_describe(err)})") from err
        except nomad_errors.BaseNomadException as err:
            raise DriverFailure(f"nomad: {what} failed: {_describe(err)}") from err
        except requests.RequestException as err:
            raise DriverFailure(f"nomad at {self.address} does not answer ({what}): {err}") from err

    async def register(self, job: dict[str, Any]) -> dict[str, Any]:
        job_id = job["Job"]["ID"]
        return await self._call(f"register job {job_id}", self._nomad.job.register_job, job_id, job)

    async def deregister(self, job_id: str, *, purge: bool = True) -> None:
        await self._call(f"stop job {job_id}", self._nomad.job.deregister_job, job_id, purge=purge)

    async def jobs(self, prefix: str, *, meta: bool = False) -> list[dict[str, Any]]:
        """The job stubs whose ID starts with ``prefix``. A stub carries the job's meta only
        when asked (``meta``: ``?meta=true``, Nomad 1.6 and later; an older Nomad leaves the
        field out, and :meth:`job_meta` reads the job then)."""
        return await self._call("list jobs", self._nomad.jobs.get_jobs, prefix=prefix, meta=meta or None)

    async def job(self, job_id: str) -> dict[str, Any]:
        return await self._call(f"read job {job_id}", self._nomad.job.get_job, job_id)

    async def job_meta(self, stub: dict[str, Any]) -> dict[str, str]:
        """The meta of a job listed with ``jobs(..., meta=True)``: the stub's, or (a Nomad
        older than 1.6 sends none) the job's own, read."""
        if "Meta" in stub:
            return stub["Meta"] or {}
        return (await self.job(str(stub["ID"]))).get("Meta") or {}

    async def job_allocations(self, job_id: str) -> list[dict[str, Any]]:
        return await self._call(f"allocations of {job_id}", self._nomad.job.get_allocations, job_id)

    async def allocation(self, alloc_id: str) -> dict[str, Any]:
        return await self._call(f"read allocation {alloc_id}", self._nomad.allocation.get_allocation, alloc_id)

    async def allocation_stats(self, alloc_id: str) -> dict[str, Any]:
        """The client's reading of the allocation's resources (its task driver's TaskStats),
        forwarded by the servers to the node that runs it."""
        return await self._call(f"stats of allocation {alloc_id}", self._nomad.client.allocation.read_allocation_stats,
                                alloc_id)

    async def nodes(self) -> list[dict[str, Any]]:
        return await self._call("list nodes", self._nomad.nodes.get_nodes)

    async def gc_allocation(self, alloc_id: str) -> None:
        await self._call(f"gc allocation {alloc_id}",
                         self._nomad.client.gc_allocation.garbage_collect, alloc_id)

    # -- aiohttp: blocking queries and exec ------------------------------------------

    async def blocking_get(self, path: str, index: int, wait: str = "30s", **params: str) -> tuple[Any, int]:
        """GET with Nomad's blocking query: returns when the data's index passes ``index``."""
        query = {"index": str(index), "wait": wait, **params}
        if self.namespace:
            query.setdefault("namespace", self.namespace)
        try:
            async with self.http.get(f"{self.address}{path}", params=query,
                                     timeout=aiohttp.ClientTimeout(total=120)) as resp:
                if resp.status == 404:
                    raise NomadNotFound(f"nomad: {path}: not found")
                if resp.status >= 400:
                    raise DriverFailure(f"nomad: GET {path}: HTTP {resp.status}: {(await resp.text())[:300]}")
                body = await resp.json()
                return body, int(resp.headers.get("X-Nomad-Index", "0"))
        except (aiohttp.ClientError, TimeoutError) as err:
            raise DriverFailure(f"nomad at {self.address} does not answer (GET {path}): {err}") from err

    async def exec(
        self,
        alloc_id: str,
        task: str,
        command: Sequence[str],
        *,
        stdin: bytes | AsyncIterable[bytes] | None,
        on_output: Callable[[str, bytes], Awaitable[None] | None],
        stop: asyncio.Event,
        kill: Callable[[], Awaitable[None]],
    ) -> int | None:
        """Run ``command`` through the alloc exec websocket; returns its exit code.

        When ``stop`` is set first, ``kill`` is awaited (it must end the command) and the
        exit is still read, for at most ``KILL_GRACE`` seconds; None if it never came.
        ``stdin`` may be streamed (an async iterable); ``on_output`` may return an awaitable,
        which is awaited before the next frame is read: a slow consumer slows the command
        (through the websocket's flow control) instead of piling its output up in memory.
        ``stdin`` None sends nothing at all, not even the close: for a plugin verb, or a command
        whose envelope says ``noStdin`` (the plugin gives it an empty stdin). A close that reached
        Nomad's client after a fast command had ended made it drop the exit frame (StreamLost):
        2-3 in 1,000 verbs, none in 5,000 without (docs/nomad.md).
        """
        ws = await self.exec_socket(alloc_id, task, command)
        async with ws:
            feeder = asyncio.create_task(self._feed(ws, stdin))
            stopper = asyncio.create_task(stop.wait())
            try:
                return await self._read_exit(ws, on_output, stopper, kill)
            finally:
                stopper.cancel()
                feeder.cancel()
                await asyncio.gather(feeder, stopper, return_exceptions=True)

    @staticmethod
    async def _read_exit(
        ws: aiohttp.ClientWebSocketResponse,
        on_output: Callable[[str, bytes], Awaitable[None] | None],
        stopper: asyncio.Task[Any],
        kill: Callable[[], Awaitable[None]],
    ) -> int | None:
        """Read the exec stream to the command's exit code; once ``stopper`` is done, kill the
        command and wait ``KILL_GRACE`` at most for its exit (None if it never comes)."""
        killed_at: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            receive = asyncio.create_task(ws.receive())
            waiting = {receive} if killed_at is not None else {receive, stopper}
            timeout = None if killed_at is None else max(0.0, killed_at + KILL_GRACE - loop.time())
            done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done:  # killed, and no exit came in time
                receive.cancel()
                return None
            if receive not in done:
                killed_at = loop.time()
                await kill()
                done, _ = await asyncio.wait({receive}, timeout=KILL_GRACE)
                if not done:
                    receive.cancel()
                    return None
            exited, code = await _exec_message(ws, receive.result(), on_output, killed=killed_at is not None)
            if exited:
                return code

    async def exec_socket(self, alloc_id: str, task: str, command: Sequence[str], *,
                          tty: bool = False) -> aiohttp.ClientWebSocketResponse:
        """The alloc exec websocket of ``command`` (a terminal's with ``tty``), connected."""
        query = urllib.parse.urlencode({"task": task, "tty": "true" if tty else "false",
                                        "command": json.dumps(list(command))})
        url = f"{self.address}/v1/client/allocation/{alloc_id}/exec?{query}"
        if self.namespace:
            url += "&" + urllib.parse.urlencode({"namespace": self.namespace})
        try:
            return await self.http.ws_connect(url, max_msg_size=0, autoping=True, heartbeat=None)
        except aiohttp.WSServerHandshakeError as err:
            raise ExecFailed(f"HTTP {err.status}: {err.message}") from err
        except aiohttp.ClientError as err:
            raise DriverFailure(f"nomad at {self.address} does not answer (exec): {err}") from err

    @staticmethod
    async def _feed(ws: aiohttp.ClientWebSocketResponse, stdin: bytes | AsyncIterable[bytes] | None) -> None:
        if stdin is None:  # see exec: nothing in flight when the command ends
            return

        async def pieces() -> AsyncIterator[bytes]:
            if isinstance(stdin, bytes):
                data = stdin
                for start in range(0, len(data), STDIN_CHUNK):
                    yield data[start:start + STDIN_CHUNK]
                return
            async for block in stdin:
                for start in range(0, len(block), STDIN_CHUNK):
                    yield block[start:start + STDIN_CHUNK]

        async for piece in pieces():
            await ws.send_str(json.dumps({"stdin": {"data": base64.b64encode(piece).decode()}}))
        await ws.send_str(json.dumps({"stdin": {"close": True}}))

async def _exec_message(
    ws: aiohttp.ClientWebSocketResponse,
    msg: aiohttp.WSMessage,
    on_output: Callable[[str, bytes], Awaitable[None] | None],
    *,
    killed: bool,
) -> tuple[bool, int | None]:
    """One message of the exec stream: output is passed on; (True, exit code) once the command
    has exited (None if the stream closed after a kill), (False, None) while it runs."""
    if msg.type == aiohttp.WSMsgType.TEXT:
        frame = json.loads(msg.data)
        for stream in ("stdout", "stderr"):
            part = frame.get(stream)
            if part and part.get("data"):
                pending = on_output(stream, base64.b64decode(part["data"]))
                if pending is not None:
                    await pending
        if frame.get("exited"):
            return True, int((frame.get("result") or {}).get("exit_code", 0))
    elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
        if killed:
            return True, None
        reason = (msg.extra or "") if msg.type == aiohttp.WSMsgType.CLOSE else ""
        if reason:  # Nomad's words: the exec was refused or failed (a close code 1011 and why)
            raise ExecFailed(reason)
        raise StreamLost(f"Nomad closed the exec stream before the command's exit came, without saying why "
                         f"(code {ws.close_code})")
    elif msg.type == aiohttp.WSMsgType.ERROR:
        raise StreamLost(f"the exec stream broke before the command's exit came: {ws.exception()}")
    return False, None
