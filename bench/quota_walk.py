"""What one write of a cpu quota costs with N other cpu cgroups on the host, caches warm or cold.

    sudo python3 bench/quota_walk.py [--n 0,2000,5000,10000] [--k 100] [--evict-mib 64]

cgroup v1, root. A write of ``cpu.cfs_quota_us`` (or ``cpu.cfs_period_us``, v2's ``cpu.max``)
goes ``tg_set_cfs_bandwidth`` -> ``__cfs_schedulable`` -> ``walk_tg_tree``, which calls
``tg_cfs_schedulable_down`` on **every task group of the host** (every cpu cgroup, hutch's
and everyone else's) under ``cfs_constraints_mutex`` and ``cpus_read_lock``: it reads each
group's quota and period and stores its ``hierarchical_quota``. So each write touches a few
cache lines of every task group: a cost that is linear in N while those lines stay in the
cpu's caches, and several times dearer once they do not.

Makes N empty cpu cgroups in a probe directory of its own (``/sys/fs/cgroup/cpu/hutch/
quota-walk-<pid>``), then times ``--k`` writes in one more: back to back (the task groups'
lines warm from the write before) and each after reading through ``--evict-mib`` MiB of
memory (cold: what a write pays when the machine did other work since the last one, as a
sandbox's first command does). Medians and p90, in microseconds. Removes everything it made.
Not a test; on a shared machine the figures are indicative (other work evicts caches too).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

CPU = Path("/sys/fs/cgroup/cpu")


def timed_writes(probe: Path, k: int, evict: bytearray | None) -> list[float]:
    took = []
    quota = probe / "cpu.cfs_quota_us"
    for i in range(k):
        if evict is not None:
            bytes(evict)  # a copy reads (and writes) it all: the caches now hold it, not the walk's lines
        t0 = time.perf_counter()
        quota.write_text(str(50_000 + 1_000 * (i % 2)))  # a different value each time: a real write
        took.append((time.perf_counter() - t0) * 1e6)
    return sorted(took)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", default="0,2000,5000,10000", help="comma-separated counts of empty cpu cgroups")
    ap.add_argument("--k", type=int, default=100, help="writes timed at each N, each way")
    ap.add_argument("--evict-mib", type=int, default=64, help="memory read between cold writes (the L3 is 32 MiB here)")
    args = ap.parse_args()
    if not (CPU / "cpu.cfs_quota_us").exists():
        raise SystemExit(f"needs cgroup v1's cpu hierarchy at {CPU} (and root)")
    base = CPU / "hutch" / f"quota-walk-{os.getpid()}"
    base.mkdir(parents=True)
    probe = base / "probe"
    probe.mkdir()
    made: list[Path] = []
    evict = bytearray(args.evict_mib << 20)
    print(f"cpu cgroups on the host before: {sum(1 for _ in CPU.rglob('cpu.shares'))}")
    print("| other empty cpu cgroups | warm p50 / p90 us | cold p50 / p90 us | cold per group ns |")
    print("|---|---|---|---|")
    try:
        for n in (int(x) for x in args.n.split(",")):
            while len(made) < n:
                d = base / f"g{len(made)}"
                d.mkdir()
                made.append(d)
            while len(made) > n:
                made.pop().rmdir()
            warm = timed_writes(probe, args.k, None)
            cold = timed_writes(probe, args.k, evict)
            p50, p90 = args.k // 2, args.k * 9 // 10
            per = cold[p50] * 1000 / n if n else 0
            print(f"| {n:,} | {warm[p50]:.0f} / {warm[p90]:.0f} | {cold[p50]:.0f} / {cold[p90]:.0f} | {per:.0f} |")
    finally:
        for d in reversed(made):
            d.rmdir()
        probe.rmdir()
        base.rmdir()
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
