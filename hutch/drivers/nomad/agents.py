"""The exec agents of the nomad driver's sandboxes (``agent.ExecAgent``): one per sandbox,
started in the background, restarted when one ends, held off a pause.

``HUTCH_NOMAD_EXEC=agent`` (the default) runs commands through them; ``alloc`` runs every
command as its own alloc exec, as before. A command that finds its sandbox's agent starting
waits for it (``at_hand``, COMMAND_WAIT at most: the start is about as long as the alloc exec
it would take instead, ~130-160 ms on one host); one that finds none (ended and held off, not
built, failed recently) runs the old way. A command of the agent's is frozen with a paused
sandbox; one run as its own alloc exec would not be (the driver's pause refuses it).

An idle allocation of a warm pool gets its agent when it is placed (``warm``, keyed by its
job id) and the sandbox that claims it takes the agent over (``hand_over``): a pooled create
is ready in a few ms, and without this its first commands ran as alloc execs (150-250 ms
each on the cluster) while the agent started behind them. The agent carries no sandbox's
settings (each command brings its own environment), so any claim can have it.

The binary is built once from scripts/services.d/nomad/exec-agent with the Go toolchain
(static, CGO_ENABLED=0) and cached by its sources' hash under the nomad cache
(``HUTCH_NOMAD_CACHE``, /var/cache/hutch/nomad), like the containerd plugin:
``services start nomad`` and ``./scripts/install --dev`` build it
(``python -m hutch.drivers.nomad.agents build``), and a driver that finds none builds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from hutch.core.errors import DriverFailure
from hutch.drivers.base import DEFAULT_PIDS
from hutch.drivers.nomad.agent import ExecAgent
from hutch.drivers.nomad.client import NomadClient
from hutch.drivers.nomad.exec_modes import check_mode
from hutch.drivers.nomad.jobs import HOME, TASK
from hutch.drivers.nomad.state import NomadSandbox
from hutch.drivers.runclock import RunClock

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parents[3] / "scripts" / "services.d" / "nomad" / "exec-agent"
PAUSE_WAIT = 30.0  # seconds a pause waits for an agent start in progress
START_WAIT = 30.0  # seconds a helper waits for its sandbox's agent to start (agent.READY_TIMEOUT)
COMMAND_WAIT = 5.0  # seconds a command waits for its sandbox's agent starting, before the alloc exec
RETRY_MAX = 60.0  # seconds between restarts of an agent that keeps failing, at most
AGENT_PATH = "/usr/local/bin:/usr/bin:/bin"
# The idle threads an agent makes as it starts (exec-agent/main.go, spareThreads): one the Go
# runtime needs and cannot make at the sandbox's pids limit aborts the agent. A pids limit too
# small to spare them all (the agent would take pids its commands need) spares one per 8 pids
# past 16, and 3 at least: a sandbox of 12 pids, which had none, lost its agent to a command
# filling the limit (1 in 4 with four filled at once). Those 3 cost it no pid: the agent no
# longer holds a thread in its stdin's read (main.go, pollable) nor os/signal's (a command's
# exit comes through its pidfd: watchExit), and has 6 threads idle as before.
SPARE_THREADS = 6
SPARE_THREADS_LEAST = 3


def spare_threads(pids_limit: int) -> int:
    """The idle threads the agent of a sandbox with ``pids_limit`` makes as it starts."""
    return min(SPARE_THREADS, max(SPARE_THREADS_LEAST, (pids_limit - 16) // 8))


def binary_path(source: Path = SOURCE) -> Path:
    """Where the build of ``source`` is cached: keyed by its files, so a change rebuilds."""
    digest = hashlib.sha256()
    for name in ["go.mod", *sorted(p.name for p in source.glob("*.go"))]:
        digest.update((source / name).read_bytes())
    cache = Path(os.environ.get("HUTCH_NOMAD_CACHE") or "/var/cache/hutch/nomad")
    return cache / f"exec-agent-{digest.hexdigest()[:12]}" / "hutch-exec-agent"


def build(source: Path = SOURCE) -> Path:
    """The agent's binary, built if it is not cached (a few seconds); DriverFailure if it cannot be."""
    if not (source / "go.mod").is_file():
        raise DriverFailure(f"the exec agent's sources are not at {source}")
    out = binary_path(source)
    if out.is_file():
        return out
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).is_file():
        raise DriverFailure("Go is not installed: cannot build the nomad exec agent")
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-trimpath -buildvcs=false"}
    if "HOME" not in env and "GOCACHE" not in env:
        env["GOCACHE"] = str(out.parent.parent / ".gocache")
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    done = subprocess.run([go, "build", "-ldflags=-s -w", "-o", str(tmp), "."], cwd=source, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise DriverFailure(f"building the nomad exec agent failed: {done.stderr.strip()[-1000:]}")
    tmp.replace(out)
    return out


class ExecAgents:
    """The agents of one driver's sandboxes, by sandbox id."""

    def __init__(self, client: NomadClient, mode: str) -> None:
        check_mode("HUTCH_NOMAD_EXEC", mode)
        self.client = client
        self.mode = mode
        self._binary: bytes | None = None
        self._agents: dict[str, ExecAgent] = {}
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._failures: dict[str, tuple[int, float]] = {}  # sandbox -> (failed starts in a row, retry after)
        self._held: set[str] = set()
        self._clocks: dict[str, RunClock] = {}  # each sandbox's run clock (drivers/runclock.py)

    def clock(self, sandbox_id: str) -> RunClock:
        """The seconds the sandbox has not been paused: its commands' time limits count on
        it, and its agent's silence and command starts (agent.py)."""
        clock = self._clocks.get(sandbox_id)
        if clock is None:
            clock = self._clocks[sandbox_id] = RunClock()
        return clock

    async def load(self) -> None:
        """Find (or build) the binary; without one, every command runs as its own alloc exec."""
        if self.mode != "agent":
            return
        try:
            path = await asyncio.to_thread(build)
            self._binary = await asyncio.to_thread(path.read_bytes)
        except (DriverFailure, OSError) as err:
            log.warning("nomad exec agent unavailable, commands run as alloc execs: %s", err)

    def get(self, sb: NomadSandbox) -> ExecAgent | None:
        """The sandbox's running agent; None if there is none yet (one is then started)."""
        agent = self._agents.get(sb.id)
        if agent is not None and agent.alive:
            return agent
        self.ensure(sb)
        return None

    async def at_hand(self, sb: NomadSandbox, timeout: float = COMMAND_WAIT) -> ExecAgent | None:
        """The sandbox's running agent for a command, one starting waited for (``timeout``
        seconds at most); None when there is none (the command then runs as an alloc exec)."""
        agent = self.get(sb)
        task = self._starting.get(sb.id)
        if agent is not None or task is None:
            return agent
        await asyncio.wait({task}, timeout=timeout)  # however it ends; a cancel of the command's own goes on
        return self.live(sb.id)

    async def ready(self, sb: NomadSandbox, timeout: float = START_WAIT) -> ExecAgent | None:
        """The sandbox's running agent, its start waited for (``timeout`` seconds at most): what
        only the agent can do (its helpers: drivers/nomad/helpers.py) has no other way to run.
        None without a binary (``HUTCH_NOMAD_EXEC=alloc``) or when it did not start."""
        if self._binary is None:
            return None
        self.ensure(sb)
        task = self._starting.get(sb.id)
        if task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), timeout)
        return self.live(sb.id)

    @property
    def available(self) -> bool:
        """Whether agents run here (agent mode, a binary built)."""
        return self._binary is not None

    def live(self, sandbox_id: str) -> ExecAgent | None:
        agent = self._agents.get(sandbox_id)
        return agent if agent is not None and agent.alive else None

    def ensure(self, sb: NomadSandbox) -> None:
        """Start the sandbox's agent in the background unless it runs, is starting, is held
        (a pause) or failed too recently."""
        if self._binary is None or sb.id in self._held or sb.id in self._starting or self.live(sb.id):
            return
        _, retry_after = self._failures.get(sb.id, (0, 0.0))
        if asyncio.get_running_loop().time() < retry_after:
            return
        task = asyncio.create_task(self._start(sb), name=f"exec-agent-start-{sb.id}")
        self._starting[sb.id] = task
        task.add_done_callback(lambda _t: self._starting.pop(sb.id, None))

    async def warm(self, job_id: str, alloc_id: str, runtime: str) -> None:
        """Start an agent in an idle pool allocation, keyed by its job id; without one (no
        binary, a failed start) its claimer starts one as any sandbox does."""
        if self._binary is not None:
            await self._start(NomadSandbox(job_id, job_id, alloc_id, runtime, {}))

    def hand_over(self, job_id: str, sb: NomadSandbox) -> None:
        """The agent of the pool allocation ``job_id`` becomes the agent of ``sb``, its claimer."""
        self._failures.pop(job_id, None)
        agent = self._agents.pop(job_id, None)
        self._clocks.pop(job_id, None)
        if agent is not None and agent.alive:  # sb was made from the entry: the same allocation
            agent.sandbox_id, agent.clock = sb.id, self.clock(sb.id)
            self._agents[sb.id] = agent

    async def _start(self, sb: NomadSandbox) -> None:
        assert self._binary is not None
        old = self._agents.pop(sb.id, None)
        if old is not None:
            await old.close()
        agent = ExecAgent(self.client, sb.alloc_id, TASK, sb.id, self.clock(sb.id))
        try:
            # The plugin's envelope (drivers/nomad/execs.py): the agent gets a tag of its own; the
            # commands it forks get theirs (and their own environment) from each request.
            # GOMAXPROCS=1: fewer threads, each of which counts against the sandbox's pids limit.
            spare = spare_threads(await self.pids_limit(sb.job_id))
            envelope = json.dumps({"env": [f"PATH={AGENT_PATH}", f"HOME={HOME}", "GOMAXPROCS=1",
                                           f"HUTCH_EXEC_SPARE_THREADS={spare}"],
                                   "cwd": HOME, "tag": f"agent-{uuid.uuid4().hex}"})
            await agent.start(self._binary, envelope)
        except Exception as err:  # any failure to start leaves the old path; the next try is later
            count = self._failures.get(sb.id, (0, 0.0))[0] + 1
            delay = min(RETRY_MAX, 0.5 * 2 ** count)
            self._failures[sb.id] = (count, asyncio.get_running_loop().time() + delay)
            log.warning("sandbox %s: exec agent did not start (%s); commands run as alloc execs, "
                        "next try in %.0f s", sb.id, err, delay)
            return
        self._failures.pop(sb.id, None)
        self._agents[sb.id] = agent
        log.debug("sandbox %s: exec agent runs (pid %s)", sb.id, agent.pid)

    async def pids_limit(self, job_id: str) -> int:
        """The sandbox's pids limit, from its job (jobs.job_spec): the sandbox cannot see it."""
        job = await self.client.job(job_id)
        limit = job["TaskGroups"][0]["Tasks"][0]["Config"].get("pids_limit")
        return int(limit) if limit else DEFAULT_PIDS

    def held(self, sandbox_id: str) -> None:
        """A sandbox found paused (adopted): no agent start (a runc exec) until it resumes, and
        its run clock stopped."""
        self._held.add(sandbox_id)
        self.clock(sandbox_id).freeze()

    async def hold(self, sandbox_id: str) -> None:
        """Before a pause: no new agent start, and one in progress finished (PAUSE_WAIT at most).
        A start frozen half-way would hold runc's exec, and the resume waits behind it."""
        self._held.add(sandbox_id)
        task = self._starting.get(sandbox_id)
        if task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), PAUSE_WAIT)

    def release(self, sandbox_id: str) -> None:
        self._held.discard(sandbox_id)

    async def drop(self, sandbox_id: str) -> None:
        """The sandbox is going: its agent's session ends (and a start in progress with it)."""
        task = self._starting.pop(sandbox_id, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        agent = self._agents.pop(sandbox_id, None)
        self._failures.pop(sandbox_id, None)
        self._held.discard(sandbox_id)
        self._clocks.pop(sandbox_id, None)
        if agent is not None:
            await agent.close()

    async def close(self) -> None:
        for sid in list({*self._agents, *self._starting}):
            await self.drop(sid)


if __name__ == "__main__":
    if sys.argv[1:] != ["build"]:
        sys.exit("usage: python -m hutch.drivers.nomad.agents build")
    print(build())
