"""bench/oneshot_cpu.py's window on two source trees, in turns: did a change cost or save CPU?

    python bench/oneshot_turns.py BASE_DIR [--rounds 3] [--seconds 15] [--settle 10] [--concurrency 16]

BASE_DIR is a checkout of the commit to compare against (``git archive BASE | tar -x -C DIR``).
Each round measures the base tree's server on the production profile, this tree's on the
production profile and this tree's on the embedded profile, starting one later each round, so
the machine's drift and other engineers' load hit every side alike. Per window: the API
server's own CPU per one-shot `true`, its PostgreSQL backends' (those opened within the
window too), the Kafka broker's (shared with whatever else uses it), the statements and log
writes per run, and the load beside it. Not a test: docs/node.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import bench.oneshot_cpu as oneshot_cpu  # noqa: E402


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path, help="a checkout of the commit to compare against")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--settle", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=16)
    a = ap.parse_args()
    if not (a.base / "hutch" / "api" / "__main__.py").is_file():
        ap.error(f"{a.base}: not a hutch source tree")
    args = argparse.Namespace(driver="local", cluster=False, concurrency=a.concurrency, seconds=a.seconds,
                              settle=a.settle, py_spy=None)
    sides = [("base production", a.base, "production"), ("this production", ROOT, "production"),
             ("this embedded", ROOT, "embedded")]
    started = oneshot_cpu.bench_server
    rows: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in sides}
    for n in range(a.rounds):
        for label, root, profile in sides[n % 3:] + sides[:n % 3]:
            oneshot_cpu.bench_server = lambda d, p, cluster=False, _r=root: started(d, p, _r, cluster=cluster)  # type: ignore[misc]
            load = _loadavg()
            res = await oneshot_cpu.measure(args, profile)
            row = {"api": res.per_run(res.groups["hutch API server"]),
                   "pg": res.per_run(res.groups["postgresql: this server's backends"]),
                   "kafka": res.per_run(res.groups["kafka (java)"]),
                   "statements": sum(v for k, v in res.counts.items()
                                     if k.startswith("hutch_store_statements_total")) / res.runs,
                   "writes": res.counts["hutch_eventlog_writes_total"] / res.runs}
            rows[label].append(row)
            print(f"round {n + 1} | {label} | API {row['api']:.1f} ms | PG backends {row['pg']:.1f} | "
                  f"broker {row['kafka']:.1f} | statements {row['statements']:.2f} | log writes {row['writes']:.2f} | "
                  f"{res.rate:.1f} runs/s | idle load before {res.idle_load:.2f} cpus | loadavg {load}", flush=True)
    print()
    for label, got in rows.items():
        def median(key: str, got: list[dict[str, float]] = got) -> float:
            return statistics.median(r[key] for r in got)
        print(f"{label}: API {median('api'):.1f} ms ({', '.join(format(r['api'], '.1f') for r in got)}), "
              f"API + PG backends {statistics.median(r['api'] + r['pg'] for r in got):.1f}, "
              f"broker {median('kafka'):.1f}, statements {median('statements'):.2f}")


if __name__ == "__main__":
    asyncio.run(main())
