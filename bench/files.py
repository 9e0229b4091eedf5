"""File throughput through the API, side by side with the host's own copy, in one run.

    python bench/files.py [--mib 100] [--n 5] [--driver local]

Starts a real server on loopback, creates a sandbox, then for a file of --mib MiB, --n
times each, interleaved:
  bare      copying the same bytes to a file on the host and reading them back (the
            ceiling on this disk: the sandbox's layer lives on it too)
  write     POST /fs/upload/{id} (an uncompressed tar streamed from the client)
  read      GET /fs/{id}?path= (raw bytes, streamed)
Prints medians in MB/s (10^6 bytes per second) and the server's peak resident memory
(VmHWM) before and after, to show memory stays flat. Not a test: docs/benchmarks.md records it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.system.server import KEY, Server  # noqa: E402

H = {"Authorization": f"Bearer {KEY}"}
CHUNK = 1 << 20


def hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT)


async def body(size: int) -> object:
    """A tar of one file of ``size`` bytes, generated as it is sent (never held whole)."""
    yield tar_header("big.bin", size)
    block = os.urandom(CHUNK)
    left = size
    while left:
        n = min(left, CHUNK)
        yield block[:n]
        left -= n
    yield b"\0" * ((512 - size % 512) % 512) + b"\0" * 1024


def bare_once(size: int, directory: Path) -> tuple[float, float]:
    block = os.urandom(CHUNK)
    path = directory / "bare.bin"
    start = time.perf_counter()
    with open(path, "wb") as fh:
        for _ in range(size // CHUNK):
            fh.write(block)
    write = time.perf_counter() - start
    os.posix_fadvise(os.open(path, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
    start = time.perf_counter()
    with open(path, "rb") as fh:
        while fh.read(CHUNK):
            pass
    read = time.perf_counter() - start
    path.unlink()
    return write, read


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--driver", default="local")
    args = ap.parse_args()
    size = args.mib * 2**20
    rows: dict[str, list[float]] = {"bare write": [], "bare read": [], "API write": [], "API read": []}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        server = Server(Path(tmp) / "data", driver=args.driver, HUTCH_LOG_LEVEL="WARNING").start()
        try:
            assert server.proc is not None
            timeout = aiohttp.ClientTimeout(total=None)
            async with aiohttp.ClientSession(headers=H, timeout=timeout) as s:
                async with s.post(f"{server.url}/sandbox", json={"runtime": "base:latest"}) as r:
                    sid = (await r.json())["data"]["sandboxId"]
                before = hwm_kib(server.proc.pid)
                for _ in range(args.n):
                    w, rd = await asyncio.to_thread(bare_once, size, Path(tmp))
                    rows["bare write"].append(size / w / 1e6)
                    rows["bare read"].append(size / rd / 1e6)
                    start = time.perf_counter()
                    async with s.post(f"{server.url}/fs/upload/{sid}?format=tar", data=body(size)) as r:
                        assert r.status == 200, await r.text()
                    rows["API write"].append(size / (time.perf_counter() - start) / 1e6)
                    start = time.perf_counter()
                    got = 0
                    async with s.get(f"{server.url}/fs/{sid}", params={"path": "big.bin"}) as r:
                        assert r.status == 200, await r.text()
                        async for chunk in r.content.iter_chunked(CHUNK):
                            got += len(chunk)
                    assert got == size, got
                    rows["API read"].append(size / (time.perf_counter() - start) / 1e6)
                after = hwm_kib(server.proc.pid)
                async with s.delete(f"{server.url}/sandbox/{sid}") as r:
                    await r.read()
        finally:
            server.stop()
    print(f"hutch file bench: {args.mib} MiB file, n={args.n}, driver {args.driver}, {os.cpu_count()} cpus")
    print("| what | median MB/s | min | max |")
    print("|---|---|---|---|")
    for name, values in rows.items():
        print(f"| {name} | {statistics.median(values):.0f} | {min(values):.0f} | {max(values):.0f} |")
    print(f"server peak RSS: {before / 1024:.0f} MiB before, {after / 1024:.0f} MiB after the transfers")


if __name__ == "__main__":
    asyncio.run(main())
