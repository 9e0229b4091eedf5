"""hutch-nsexec on its own: `exec true` in one live sandbox, two helper binaries in turns.

    python bench/helper.py [--n 300] [HELPER ...]

Starts a LocalDriver (the tests' runtime cache, python:3.13), provisions one sandbox and
runs ``HELPER exec ... -- true`` in it the way the driver does (nsexec.command: a cgroup
leaf per run, the environment in a memfd), timing each from spawn to exit with
posix_spawn + waitpid: the helper's set-up (exec, setns, fork, cgroup joins, privileges,
seccomp, the PATH search) and `true`, without HTTP, the event log or Popen. With several
helpers (e.g. one built from main's source, by ``python -m hutch.drivers.local.native
--out DIR`` in its checkout) they run in turns, one sample each per round; prints each
one's p50/p90 and the median of the per-round ratios to the first. Default: this tree's.
Not a test: the figures are for a person to read. Needs root.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hutch.drivers.base import ProvisionRequest, ResourceLimits  # noqa: E402
from hutch.drivers.local.driver import LocalDriver  # noqa: E402
from hutch.drivers.local.executions import LocalExecutions  # noqa: E402

CACHE = Path(os.environ.get("HUTCH_RUNTIME_CACHE", "/var/cache/hutch/runtimes"))


def once(driver: LocalDriver, helper: Path, sid: str, n: int, argv: list[str]) -> float:
    nsexec = driver._nsexec
    sb = driver._registry.running(sid)
    leaf = f"x-bench-{n}"
    status_r, status_w = os.pipe()
    fds: list[int] = []
    env = LocalExecutions._env(sb, {})
    cmd = nsexec.command("exec", sb, leaf, cwd="/home/agentuity", env=env, status_w=status_w, pass_fds=fds)
    cmd[0] = str(helper)
    for fd in (status_w, *fds):
        os.set_inheritable(fd, True)
    null = os.open(os.devnull, os.O_RDWR)
    t0 = time.perf_counter()
    pid = os.posix_spawn(cmd[0], [*cmd, "--", *argv], {},
                         file_actions=[(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, null, 1),
                                       (os.POSIX_SPAWN_DUP2, null, 2)])
    _, status = os.waitpid(pid, 0)
    took = time.perf_counter() - t0
    for fd in (status_w, *fds, null):
        os.close(fd)
    message = os.read(status_r, 4096) if os.waitstatus_to_exitcode(status) == 125 else b""
    os.close(status_r)
    nsexec.drop_leaf(sid, leaf)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{helper}: exit {os.waitstatus_to_exitcode(status)} {message!r}")
    return took


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("helpers", nargs="*", type=Path)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--argv", default="true", help="the command (split on spaces)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hutch-helper-bench-") as data:
        driver = LocalDriver(Path(data), CACHE)
        await driver.start()
        try:
            sid = "sb-helperbench"
            await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13", env={},
                                                    resources=ResourceLimits()))
            helpers = args.helpers or [driver._nsexec.path]
            argv = args.argv.split()
            samples: list[list[float]] = [[] for _ in helpers]
            for i in range(args.n + 5):
                order = range(len(helpers)) if i % 2 else reversed(range(len(helpers)))
                for k in order:
                    took = once(driver, helpers[k], sid, i, argv)
                    if i >= 5:  # warm-up
                        samples[k].append(took)
            print(f"hutch-nsexec exec {args.argv!r}, n={args.n} each, in turns; load average "
                  f"{os.getloadavg()[0]:.2f}")
            for k, helper in enumerate(helpers):
                s = sorted(samples[k])
                ratio = statistics.median(b / a for a, b in zip(samples[0], samples[k], strict=True))
                print(f"{helper.name}: p50 {statistics.median(s) * 1e3:.3f} ms, p90 "
                      f"{s[int(len(s) * 0.9)] * 1e3:.3f} ms, min {s[0] * 1e3:.3f} ms, paired ratio to the first "
                      f"{ratio:.3f}")
            await driver.destroy(sid)
        finally:
            await driver.close()


if __name__ == "__main__":
    asyncio.run(main())
