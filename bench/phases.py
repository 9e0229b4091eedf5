"""Where one execute(), one one-shot and one client run() spend their time, phase by phase, on
the embedded or the production profile (local driver).

    python bench/phases.py [--n 40] [--scenario execute|oneshot|run ...] [--profile embedded[,production]]
                           [--py-spy DIR]

Per scenario, a real server (this tree) with HUTCH_PHASES=1 (core/phases.py: monotonic spans
around the phases of the request path, off otherwise) takes ``--n`` operations after 3 warm-up
ones, one at a time:
  execute  POST /sandbox/{id}/execute `python3 -c pass` + long-poll, raw HTTP (bench/run.py's)
  oneshot  POST /sandbox with a one-shot command, its stdout read, the execution long-polled,
           raw HTTP (bench/run.py's)
  run      SandboxClient.run() of the real @agentuity/core client, `python3 -c pass`
           (bench/oneshot_client.mjs: one-shot create, both streams read, execution long-poll
           raced with a sandbox-status long-poll)
then stops, and the spans it wrote are summed per phase: calls per operation, p50 of one call,
and the mean time per operation (calls x their mean). Spans nest and overlap (a request holds
its appends; a run's streams are read while its command runs): the rows do not add up, each
says how long that phase took. With ``--py-spy DIR``, a second server per scenario takes the
same load under `py-spy record` (on-CPU samples of the server's Python), written as
DIR/<scenario>.svg, a flame graph; its figures are not reported (py-spy slows what it samples).
``--profile production,embedded`` runs every scenario on each profile in turn (production: a
fresh Kafka topic and PostgreSQL database, as bench/run.py's); the profiles differ only in the
log and the store, so the rows that differ are the log path's.
Not a test: docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import (  # noqa: E402
    PY_PASS,
    RUNTIME,
    H,
    bare_once,
    busy_cpus,
    client_runs,
    drop_profile,
    execute_once,
    oneshot_once,
    profile_settings,
    runtime_rootfs,
)
from tests.system.server import Server  # noqa: E402

WARM = 3
SCENARIOS = ("execute", "oneshot", "run")


async def load(scenario: str, url: str, n: int, bare: list[float],
               warmed: Callable[[], Awaitable[None]] | None = None) -> list[float]:
    """``n`` timed operations (after WARM untimed ones, then ``warmed()``); their client-side
    milliseconds. The baseline goes to ``bare``: the runtime's `python3 -c pass` on the host
    (chroot only), before each execute; before and after the batch of client runs (one Node
    process)."""
    rootfs = runtime_rootfs()
    if scenario == "run":
        client_runs(url, WARM)
        if warmed is not None:
            await warmed()
        bare += [bare_once(rootfs) for _ in range((n + 1) // 2)]
        took = client_runs(url, n)
        bare += [bare_once(rootfs) for _ in range(n // 2)]
        return took
    if scenario == "oneshot":
        async with aiohttp.ClientSession() as s:
            for _ in range(WARM):
                bare_once(rootfs)
                await oneshot_once(s, url, PY_PASS)
            if warmed is not None:
                await warmed()
            took = []
            for _ in range(n):
                bare.append(bare_once(rootfs))
                took.append(await oneshot_once(s, url, PY_PASS))
        return took
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/sandbox", json={"runtime": RUNTIME}, headers=H) as r:
            sid = (await r.json())["data"]["sandboxId"]
        for _ in range(WARM):
            bare_once(rootfs)
            await execute_once(s, url, sid, PY_PASS)
        if warmed is not None:
            await warmed()
        took = []
        for _ in range(n):
            bare.append(bare_once(rootfs))
            took.append(await execute_once(s, url, sid, PY_PASS))
        async with s.delete(f"{url}/sandbox/{sid}", headers=H) as r:  # sandboxes outlive the server
            await r.read()
    return took


async def with_server(phases: bool, body: Callable[[Server], Awaitable[list[float]]],
                      profile: str = "embedded") -> tuple[list[float], dict]:
    """A server of this tree for ``body``; its spans (HUTCH_PHASES=1) once it stopped."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = await profile_settings(profile)
        env = {k: v for k, v in settings.items() if k.startswith("HUTCH_")}
        server = Server(Path(tmp) / "data", driver="local", HUTCH_LOG_LEVEL="WARNING",
                        HUTCH_PHASES="1" if phases else "0", **env).start(timeout=300)
        try:
            took = await body(server)
        except BaseException:
            print(server.log.read_text()[-6000:], file=sys.stderr)
            raise
        finally:
            server.stop()
            await drop_profile(settings)
        spans = json.loads((Path(tmp) / "data" / "phases.json").read_text()) if phases else {}
    return took, spans


async def flame_graph(scenario: str, n: int, out: Path, profile: str) -> None:
    """Attached after the warm-up: a fresh server's first requests build cattrs' (un)structure
    functions for every class they meet (milliseconds each), once per process."""
    spies: list[asyncio.subprocess.Process] = []

    async def attach(pid: int) -> None:
        spies.append(await asyncio.create_subprocess_exec(
            "py-spy", "record", "--pid", str(pid), "--rate", "1000", "--format", "flamegraph",
            "--output", str(out), "--nonblocking", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        await asyncio.sleep(1)  # attached before the timed load starts

    async def under_py_spy(server: Server) -> list[float]:
        assert server.proc is not None
        pid = server.proc.pid
        try:
            return await load(scenario, server.url, n, [], warmed=lambda: attach(pid))
        finally:
            for spy in spies:
                spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                _, err = await asyncio.wait_for(spy.communicate(), 60)
                if spy.returncode != 0:
                    raise RuntimeError(f"py-spy failed ({spy.returncode}): {err.decode()[-2000:]}")

    await with_server(False, under_py_spy, profile)


def p90(samples: list[float]) -> float:
    return sorted(samples)[int(len(samples) * 0.9) - 1] if len(samples) >= 10 else max(samples)


def table(spans: dict[str, list[float]], ops: int) -> list[str]:
    rows = ["| phase | calls per op | p50 ms per call | mean ms per op |", "|---|---|---|---|"]
    for name in sorted(spans):
        took = spans[name]
        rows.append(f"| {name} | {len(took) / ops:.2f} | {statistics.median(took):.3f} | {sum(took) / ops:.3f} |")
    return rows


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--scenario", action="append", choices=SCENARIOS, help="repeatable; default: both")
    ap.add_argument("--profile", default="embedded", help="embedded, production, or both: production,embedded")
    ap.add_argument("--py-spy", type=Path, metavar="DIR", help="also write DIR/<profile>-<scenario>.svg")
    args = ap.parse_args()
    if args.n < 1:
        ap.error("--n must be at least 1")
    profiles = args.profile.split(",")
    if not profiles or any(p not in ("embedded", "production") for p in profiles):
        ap.error(f"--profile: embedded and/or production, comma-separated, not {args.profile!r}")
    noise = busy_cpus()
    print(f"hutch phases: {', '.join(profiles)} profile, local driver, runtime {RUNTIME}, {os.cpu_count()} cpus, "
          f"`python3 -c pass`, n={args.n} after {WARM} warm-up; other load before the run: {noise:.2f} cpus busy, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for scenario, profile in ((sc, pr) for sc in args.scenario or SCENARIOS for pr in profiles):
        bare: list[float] = []
        async def timed(server: Server, scenario: str = scenario, bare: list[float] = bare) -> list[float]:
            return await load(scenario, server.url, args.n, bare)

        took, spans = await with_server(True, timed, profile)
        ops = args.n + WARM  # execute: the live sandbox's create is among the spans too (calls < 1)
        label = scenario if len(profiles) == 1 else f"{scenario} ({profile})"
        print(f"\n{label}: client-side p50 {statistics.median(took):.1f} ms, p90 {p90(took):.1f} ms; "
              f"bare p50 {statistics.median(bare):.1f} ms, p90 {p90(bare):.1f} ms "
              f"(calls per op over {ops} operations, warm-ups included)")
        print("\n".join(table(spans, ops)))
        if args.py_spy:
            args.py_spy.mkdir(parents=True, exist_ok=True)
            out = args.py_spy / f"{profile}-{scenario}.svg"
            await flame_graph(scenario, args.n, out, profile)
            print(f"flame graph: {out}")


if __name__ == "__main__":
    asyncio.run(main())
