"""The zygote against the helper: one driver, one live sandbox, the two paths in turns.

    python bench/zygote.py [--n 300] [--argv true]

Starts a LocalDriver (the tests' runtime cache, python:3.13), provisions one sandbox and
times ``driver.exec`` of the command from the call to its result, alternately through pid 1
(the zygote: drivers/local/zygote.py) and through hutch-nsexec (``HUTCH_ZYGOTE=0``, read at
each call), in turns A B, B A, ...: the leaf cgroup, the pipes and the exit as the server
pays them, without HTTP or the event log. Prints each path's min/p50/p90 and the median of
the per-round ratios. Not a test: the figures are for a person to read. Needs root.
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

from hutch.drivers.base import ExecRequest, ProvisionRequest, ResourceLimits  # noqa: E402
from hutch.drivers.local.driver import LocalDriver  # noqa: E402

CACHE = Path(os.environ.get("HUTCH_RUNTIME_CACHE", "/var/cache/hutch/runtimes"))


class _Null:
    def write(self, stream: str, data: bytes) -> None:
        pass


async def once(driver: LocalDriver, sid: str, n: int, argv: list[str], zygote: bool) -> float:
    os.environ["HUTCH_ZYGOTE"] = "1" if zygote else "0"
    runs = driver._nsexec.zygote_runs
    t0 = time.perf_counter()
    result = await driver.exec(ExecRequest(f"ex-bench-{n}-{int(zygote)}", sid, argv), _Null())
    took = time.perf_counter() - t0
    if result.exit_code != 0:
        raise SystemExit(f"exit {result.exit_code}")
    if (driver._nsexec.zygote_runs - runs) != int(zygote):
        raise SystemExit("the command did not take the path asked for")
    return took


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--argv", default="true", help="the command (split on spaces)")
    args = ap.parse_args()
    argv = args.argv.split()
    with tempfile.TemporaryDirectory(prefix="hutch-zygote-bench-") as data:
        os.environ["HUTCH_ZYGOTE"] = "1"  # the sandbox's pid 1 listens
        driver = LocalDriver(Path(data), CACHE)
        await driver.start()
        try:
            sid = "sb-zygotebench"
            await driver.provision(ProvisionRequest(sandbox_id=sid, runtime="python:3.13", env={},
                                                    resources=ResourceLimits()))
            samples: dict[bool, list[float]] = {False: [], True: []}
            load = os.getloadavg()[0]
            for i in range(args.n + 5):
                for zygote in ((False, True) if i % 2 else (True, False)):
                    took = await once(driver, sid, i, argv, zygote)
                    if i >= 5:  # warm-up
                        samples[zygote].append(took)
            print(f"driver.exec {args.argv!r}, n={args.n} each, in turns; load average {load:.2f} -> "
                  f"{os.getloadavg()[0]:.2f}")
            for zygote, name in ((False, "helper (hutch-nsexec)"), (True, "zygote (pid 1 forks)")):
                s = sorted(samples[zygote])
                print(f"{name}: min {s[0] * 1e3:.3f} ms, p50 {statistics.median(s) * 1e3:.3f} ms, "
                      f"p90 {s[int(len(s) * 0.9)] * 1e3:.3f} ms")
            ratio = statistics.median(b / a for a, b in zip(samples[False], samples[True], strict=True))
            print(f"zygote / helper, median of the paired ratios: {ratio:.3f}")
            await driver.destroy(sid)
        finally:
            await driver.close()


if __name__ == "__main__":
    asyncio.run(main())
