"""Blob store throughput (core/blobs.py): write and read of one value, per backend.

    set -a; eval "$(./scripts/services start postgres)"; set +a
    python bench/blobs.py                     # files and PostgreSQL ($HUTCH_STORE), 64 MiB, 5 runs
    python bench/blobs.py --backend files --mib 256 --runs 3

Each run puts ``--mib`` MiB of random bytes (fed in 1 MiB chunks from memory, as callers
feed a spooled file), then reads them back whole; MiB/s from the call to the last byte,
the median of ``--runs``. PostgreSQL uses a fresh database (created on the settings'
server, dropped after). Files go to a temporary directory on the same disk as /var/lib
unless ``--dir`` says otherwise. Not a test: no pass/fail; docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hutch.blobs.files import FileBlobStore  # noqa: E402
from hutch.blobs.postgres import PostgresBlobStore  # noqa: E402
from hutch.core.blobs import CHUNK, BlobStore  # noqa: E402


async def chunks(data: bytes) -> AsyncIterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), CHUNK):
        yield bytes(view[start:start + CHUNK])


async def one_backend(store: BlobStore, data: bytes, runs: int) -> tuple[list[float], list[float]]:
    mib = len(data) / 2**20
    writes, reads = [], []
    for i in range(runs):
        key = f"bench/{i}"
        start = time.perf_counter()
        await store.put(key, chunks(data))
        writes.append(mib / (time.perf_counter() - start))
        start, size = time.perf_counter(), 0
        async for chunk in store.get(key):
            size += len(chunk)
        reads.append(mib / (time.perf_counter() - start))
        assert size == len(data)
        await store.delete(key)
    return writes, reads


async def fresh_database(admin: str) -> tuple[str, str]:
    import asyncpg

    name = f"hutch_bench_blobs_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(admin)._replace(path="/" + name)), name


async def drop_database(admin: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(admin)
    try:
        for _ in range(240):  # an autovacuum worker on it cannot be ended by a plain role: wait
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                return
            except (asyncpg.InsufficientPrivilegeError, asyncpg.ObjectInUseError):
                await asyncio.sleep(0.25)
        print(f"bench/blobs.py: could not drop database {name}; drop it by hand", file=sys.stderr)
    finally:
        await conn.close()


async def run(backend: str, data: bytes, runs: int, directory: str | None) -> tuple[list[float], list[float]]:
    if backend == "files":
        with tempfile.TemporaryDirectory(prefix="hutch-bench-blobs-", dir=directory) as root:
            return await one_backend(FileBlobStore(Path(root)), data, runs)
    admin = os.environ.get("HUTCH_STORE") or os.environ.get("HUTCH_TEST_STORE") or ""
    if not admin.startswith(("postgresql://", "postgres://")):
        sys.exit("bench/blobs.py: set HUTCH_STORE to a postgresql:// URL (./scripts/services start postgres)")
    url, name = await fresh_database(admin)
    store = PostgresBlobStore(url)
    await store.start()
    try:
        return await one_backend(store, data, runs)
    finally:
        await store.close()
        await drop_database(admin, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["files", "postgres", "both"], default="both")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the files backend writes (default: the temp dir)")
    args = parser.parse_args()
    data = os.urandom(args.mib * 2**20)
    print(f"{args.mib} MiB, median of {args.runs} runs, load average {os.getloadavg()[0]:.1f}")
    for backend in (["files", "postgres"] if args.backend == "both" else [args.backend]):
        writes, reads = asyncio.run(run(backend, data, args.runs, args.dir))
        print(f"{backend:9} write {statistics.median(writes):7.1f} MiB/s (min {min(writes):.1f}, max {max(writes):.1f})"
              f"   read {statistics.median(reads):7.1f} MiB/s (min {min(reads):.1f}, max {max(reads):.1f})")


if __name__ == "__main__":
    main()
