"""Inodes a local-driver create makes on the data directory's file system, and a destroy deletes.

    python bench/inodes.py [--n 40] [--runtime python:3.13] [--rate]

A LocalDriver (its own data dir under $TMPDIR, warm pool off) makes ``--n`` idle sandboxes from
scratch, then destroys them, then makes and destroys ``--n`` again (the second round takes
the spare skeletons the first left, spares.py). Counted by walking the data dir and the uid
registry (only the claims naming this data dir) before and after each step, so the other
users of the host's file system do not count: per sandbox, the inodes that appeared (by
name relative to the sandbox dir, and how many are new inode numbers, i.e. an allocation on
ext4) and the ones a destroy left. ``--rate`` also times ``--rate-n`` idle creates (8 at a
time), then their destroys, and prints creates/s with the load average: indicative only on
a shared host.
Not a test: the figures are for a person.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HUTCH_WARM_POOL", "0")  # no background creates mixed into the counts

KIND = {stat.S_IFDIR: "dir", stat.S_IFREG: "file", stat.S_IFSOCK: "socket", stat.S_IFLNK: "link"}


def walk(data: Path, registry: Path) -> dict[str, tuple[int, str]]:
    """Every inode under ``data`` and this data dir's uid claims: path -> (inode, kind)."""
    out: dict[str, tuple[int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(data):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            out[p] = (st.st_ino, KIND.get(stat.S_IFMT(st.st_mode), "other"))
    for entry in os.scandir(registry):
        try:
            with open(entry.path, "rb") as f:
                owner = f.read().decode(errors="replace")
        except OSError:
            continue
        if owner.startswith(str(data)):
            out[entry.path] = (entry.inode(), "file")
    return out


def shape(paths: list[str], data: Path, sids: list[str]) -> collections.Counter[str]:
    """Paths with the sandbox id replaced by <sb> and uid claim names by <uid>."""
    subs = re.compile("|".join(map(re.escape, sorted(sids, key=len, reverse=True))) or "(?!)")
    out: collections.Counter[str] = collections.Counter()
    for p in paths:
        rel = os.path.relpath(p, data) if p.startswith(str(data)) else "<uid registry>/<uid>"
        out[re.sub(r"\.spare/\d+", ".spare/<k>", subs.sub("<sb>", rel))] += 1
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--runtime", default="python:3.13")
    ap.add_argument("--rate", action="store_true")
    ap.add_argument("--rate-n", type=int, default=400)
    args = ap.parse_args()

    from hutch.drivers.base import ProvisionRequest
    from hutch.drivers.local import uids
    from hutch.drivers.local.driver import LocalDriver
    from hutch.drivers.local.rootfs import default_cache

    data = Path(tempfile.mkdtemp(prefix="inodes-"))  # $TMPDIR: put it on the file system to measure
    driver = LocalDriver(data, default_cache())
    await driver.start()
    reg = uids.UID_REGISTRY
    seq = iter(range(10**9))
    try:
        for rnd in ("from scratch", "over spares"):
            n = args.n
            sids = [f"in{os.getpid()}x{next(seq)}" for _ in range(n)]
            before = walk(data, reg)
            for sid in sids:
                await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=args.runtime))
            after = walk(data, reg)
            made = [p for p in after if p not in before]
            old_inos = {ino for ino, _ in before.values()}
            new_inos = [p for p in made if after[p][0] not in old_inos]
            kinds = collections.Counter(after[p][1] for p in made)
            print(f"\n== {n} creates, {rnd}: {len(made) / n:.2f} names a create "
                  f"({len(new_inos) / n:.2f} newly allocated inodes); kinds a create: "
                  + ", ".join(f"{k} {v / n:g}" for k, v in sorted(kinds.items())))
            for rel, c in sorted(shape(made, data, sids).items()):
                print(f"  {c / n:5.2f}  {rel}")
            for sid in sids:
                await driver.destroy(sid)
            await driver._trash.drain()
            left = walk(data, reg)
            gone = [p for p in after if p not in left]
            kept = [p for p in left if p not in before]
            print(f"  destroy: {len(gone) / n:.2f} names a destroy gone; left behind (spares "
                  f"included): {len(kept) / n:.2f} a destroy")
            for rel, c in sorted(shape(kept, data, sids).items()):
                print(f"  {c / n:5.2f}  kept {rel}")
        if args.rate:
            # As bench/idle_memory.py's creates: --rate-n idle sandboxes, 8 at a time, then
            # their destroys; past the first few, no spare is left and every create allocates.
            conc, total, took = 8, args.rate_n, []
            sids = [f"in{os.getpid()}x{next(seq)}" for _ in range(total)]
            todo = iter(sids)

            async def creator() -> None:
                for sid in todo:
                    t0 = time.perf_counter()
                    await driver.provision(ProvisionRequest(sandbox_id=sid, runtime=args.runtime))
                    took.append(time.perf_counter() - t0)

            async def destroyer() -> None:
                for sid in todo:
                    await driver.destroy(sid)

            load0 = os.getloadavg()[0]
            t0 = time.perf_counter()
            await asyncio.gather(*(creator() for _ in range(conc)))
            made = time.perf_counter() - t0
            todo = iter(sids)
            t0 = time.perf_counter()
            await asyncio.gather(*(destroyer() for _ in range(conc)))
            await driver._trash.drain()
            gone = time.perf_counter() - t0
            took.sort()
            print(f"\n== rate: {total} idle creates, {conc} at a time: {total / made:.0f} creates/s, provision "
                  f"p50 {took[len(took) // 2] * 1000:.1f} ms; then {total / gone:.0f} destroys/s; "
                  f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    finally:
        for sid in await driver.alive():
            await driver.destroy(sid)
        await driver.close()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
