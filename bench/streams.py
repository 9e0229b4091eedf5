"""Output stream cost (core/output.py), per adapter: files (embedded) and PostgreSQL
(production).

    set -a; eval "$(./scripts/services start postgres)"; set +a
    python bench/streams.py --micro           # what a short command pays for its streams
    python bench/streams.py --mib 64          # one big stream: write and read throughput

``--micro``: what ``service/executions.py`` does around a short command (``echo hello``): open
stdout and stderr, write one line to stdout, close both (the close returns once the bytes
are saved), then read stdout whole as a client does. The time of the writer's part and of
the read, p50/p99 over ``--runs`` commands, after 20 warm-up ones.

``--mib N``: one stream gets N MiB written in 64 KiB pieces, then is closed; then it is
read whole; MiB/s of each, the median of ``--runs``.

PostgreSQL uses a fresh database (created on the settings' server, dropped after). Not a
test: no pass/fail; docs/benchmarks.md records the figures.
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

from bench.blobs import drop_database, fresh_database  # noqa: E402
from hutch.blobs.output_files import FileOutputStreams  # noqa: E402
from hutch.blobs.output_postgres import PostgresOutputStreams  # noqa: E402
from hutch.core.output import CHUNK, OutputStreams  # noqa: E402

CAP = 1 << 34


async def read_all(outputs: OutputStreams, stream_id: str) -> int:
    size = 0
    async for chunk in outputs.read(stream_id):
        size += len(chunk)
    return size


async def micro(outputs: OutputStreams, runs: int) -> tuple[list[float], list[float]]:
    writes, reads = [], []
    for i in range(runs + 20):
        out, err = f"stm_bench{i}o", f"stm_bench{i}e"
        start = time.perf_counter()
        stdout = await outputs.open(out)
        await outputs.open(err)
        stdout.write(b"hello\n")
        await outputs.close(out)
        await outputs.close(err)
        wrote = time.perf_counter()
        assert await read_all(outputs, out) == 6
        done = time.perf_counter()
        if i >= 20:
            writes.append((wrote - start) * 1000)
            reads.append((done - wrote) * 1000)
    return writes, reads


async def throughput(outputs: OutputStreams, mib: int, runs: int) -> tuple[list[float], list[float]]:
    piece = os.urandom(CHUNK)
    writes, reads = [], []
    for i in range(runs):
        stream_id = f"stm_big{i}"
        start = time.perf_counter()
        writer = await outputs.open(stream_id)
        for _ in range(mib * 2**20 // CHUNK):
            writer.write(piece)
            await asyncio.sleep(0)  # a command's output arrives between other work
        await outputs.close(stream_id)
        writes.append(mib / (time.perf_counter() - start))
        start = time.perf_counter()
        assert await read_all(outputs, stream_id) == mib * 2**20
        reads.append(mib / (time.perf_counter() - start))
    return writes, reads


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(backend: str, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    async def measure(outputs: OutputStreams) -> tuple[list[float], list[float]]:
        await outputs.start()
        try:
            return await (micro(outputs, args.runs) if args.micro else throughput(outputs, args.mib, args.runs))
        finally:
            await outputs.close_store()

    if backend == "files":
        with tempfile.TemporaryDirectory(prefix="hutch-bench-streams-") as root:
            return await measure(FileOutputStreams(Path(root), CAP))
    admin = os.environ.get("HUTCH_STORE") or os.environ.get("HUTCH_TEST_STORE") or ""
    if not admin.startswith(("postgresql://", "postgres://")):
        sys.exit("bench/streams.py: set HUTCH_STORE to a postgresql:// URL (./scripts/services start postgres)")
    url, name = await fresh_database(admin)
    try:
        return await measure(PostgresOutputStreams(url, CAP))
    finally:
        await drop_database(admin, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["files", "postgres", "both"], default="both")
    parser.add_argument("--micro", action="store_true", help="per short command (default: throughput)")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=None, help="default: 500 with --micro, else 3")
    args = parser.parse_args()
    args.runs = args.runs or (500 if args.micro else 3)
    what = f"{args.runs} short commands" if args.micro else f"{args.mib} MiB, median of {args.runs} runs"
    print(f"{what}, load average {os.getloadavg()[0]:.1f}")
    for backend in (["files", "postgres"] if args.backend == "both" else [args.backend]):
        writes, reads = asyncio.run(run(backend, args))
        if args.micro:
            print(f"{backend:9} open+write+close p50 {pct(writes, .5):6.2f} ms p99 {pct(writes, .99):6.2f} ms"
                  f"   read p50 {pct(reads, .5):6.2f} ms p99 {pct(reads, .99):6.2f} ms")
        else:
            print(f"{backend:9} write {statistics.median(writes):7.1f} MiB/s   read {statistics.median(reads):7.1f} MiB/s")


if __name__ == "__main__":
    main()
