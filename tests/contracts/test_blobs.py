"""The BlobStore contract (core/blobs.py), run against every adapter: files and PostgreSQL
(a fresh database on the test server; no server is a failure, not a skip)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from hutch.blobs.files import FileBlobStore
from hutch.blobs.postgres import PostgresBlobStore
from hutch.core.blobs import CHUNK, BlobNotFound, BlobStore
from hutch.core.errors import InvalidInput
from hutch.storage import spool
from tests.services import drop_database, fresh_database


@pytest.fixture(params=["files", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BlobStore]:
    if request.param == "files":
        made: BlobStore = FileBlobStore(tmp_path / "blobs")
        await made.start()
        yield made
        await made.close()
        return
    url, name = await fresh_database("blobs")
    made = PostgresBlobStore(url)
    await made.start()
    made.url = url  # type: ignore[attr-defined]  # for the tests that look underneath
    try:
        yield made
    finally:
        await made.close()
        await drop_database(name)


async def stream(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        await asyncio.sleep(0)
        yield part


async def read(store: BlobStore, key: str) -> bytes:
    return b"".join([chunk async for chunk in store.get(key)])


class Boom(Exception):
    pass


async def failing(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
    raise Boom("the producer died part-way")


async def leftovers(store: BlobStore) -> list[str]:
    """What a store holds besides its keys' values: temporary files, orphaned objects."""
    if isinstance(store, FileBlobStore):
        return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*") if p.is_file())
    conn = await asyncpg.connect(store.url)  # type: ignore[attr-defined]
    try:
        rows = await conn.fetch("SELECT m.oid FROM pg_largeobject_metadata m"
                                " WHERE m.oid NOT IN (SELECT oid FROM hutch_blobs)")
        keys = await conn.fetch("SELECT key FROM hutch_blobs ORDER BY key")
    finally:
        await conn.close()
    return [f"orphan {r['oid']}" for r in rows] + [r["key"] for r in keys]


async def test_round_trip(store: BlobStore) -> None:
    info = await store.put("snapshots/snp_1.tar.gz", stream(b"hello ", b"world"))
    assert info.size == 11 and info.sha256 == hashlib.sha256(b"hello world").hexdigest()
    assert await read(store, "snapshots/snp_1.tar.gz") == b"hello world"
    assert await store.exists("snapshots/snp_1.tar.gz")
    stat = await store.stat("snapshots/snp_1.tar.gz")
    assert stat.size == 11 and stat.sha256 in (None, info.sha256) and stat.created > 0


async def test_empty_value(store: BlobStore) -> None:
    await store.put("a/empty", stream())
    assert await read(store, "a/empty") == b""
    assert (await store.stat("a/empty")).size == 0


async def test_large_values_stream_in_bounded_chunks(store: BlobStore) -> None:
    block = os.urandom(CHUNK // 3 + 7)  # not aligned to the store's chunks
    parts = [block] * 20  # ~6.7 MiB
    await store.put("big/one", stream(*parts))
    digest, size, biggest = hashlib.sha256(), 0, 0
    async for chunk in store.get("big/one"):
        digest.update(chunk)
        size += len(chunk)
        biggest = max(biggest, len(chunk))
    assert size == len(block) * 20 and biggest <= CHUNK
    assert digest.hexdigest() == hashlib.sha256(b"".join(parts)).hexdigest()


async def test_overwrite_replaces_whole_and_leaves_nothing_behind(store: BlobStore) -> None:
    await store.put("k/v", stream(b"first, and longer"))
    await store.put("k/v", stream(b"second"))
    assert await read(store, "k/v") == b"second"
    assert await leftovers(store) == ["k/v"]


async def test_a_put_that_fails_part_way_leaves_nothing(store: BlobStore) -> None:
    with pytest.raises(Boom):
        await store.put("k/new", failing(b"x" * (CHUNK + 5), b"y"))
    assert not await store.exists("k/new")
    with pytest.raises(BlobNotFound):
        await read(store, "k/new")
    await store.put("k/old", stream(b"old"))
    with pytest.raises(Boom):
        await store.put("k/old", failing(b"new" * CHUNK))
    assert await read(store, "k/old") == b"old"  # the previous value is intact
    assert await leftovers(store) == ["k/old"]


async def test_a_cancelled_put_leaves_nothing(store: BlobStore) -> None:
    started = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        while True:
            started.set()
            yield b"z" * 65536
            await asyncio.sleep(0.001)

    task = asyncio.create_task(store.put("k/cancelled", endless()))
    await started.wait()
    await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert not await store.exists("k/cancelled")
    assert await leftovers(store) == []


async def test_concurrent_puts_of_one_key_never_mix(store: BlobStore) -> None:
    values = [bytes([i]) * (CHUNK + i * 1000) for i in range(6)]
    await asyncio.gather(*(store.put("race/k", stream(v[:CHUNK], v[CHUNK:])) for v in values))
    assert await read(store, "race/k") in values
    assert await leftovers(store) == ["race/k"]


async def test_concurrent_puts_of_many_keys(store: BlobStore) -> None:
    await asyncio.gather(*(store.put(f"many/{i}", stream(str(i).encode() * 1000)) for i in range(8)))
    for i in range(8):
        assert await read(store, f"many/{i}") == str(i).encode() * 1000


async def test_a_reader_keeps_the_version_it_started_with(store: BlobStore) -> None:
    await store.put("r/k", stream(b"a" * (3 * CHUNK)))
    reader = store.get("r/k")
    first = await anext(reader)
    await store.put("r/k", stream(b"b" * 10))
    rest = b"".join([chunk async for chunk in reader])
    assert first + rest == b"a" * (3 * CHUNK)
    assert await read(store, "r/k") == b"b" * 10


BAD_KEYS = ["", "/abs", "a/../b", "..", "a/./b", ".hidden", "a/.part", "a\0b", "a//b", "a/", "a\\b", "x" * 2000]


async def test_bad_keys_are_refused_by_name(store: BlobStore) -> None:
    for key in BAD_KEYS:
        for call in (lambda: store.put(key, stream(b"x")), lambda: read(store, key),  # noqa: B023
                     lambda: store.stat(key), lambda: store.exists(key), lambda: store.delete(key)):  # noqa: B023
            with pytest.raises(InvalidInput) as err:
                await call()
            assert repr(key) in err.value.message, key
    assert await leftovers(store) == []


async def test_delete(store: BlobStore) -> None:
    await store.put("d/k", stream(b"x"))
    assert await store.delete("d/k") is True
    assert await store.delete("d/k") is False
    assert not await store.exists("d/k")
    assert await leftovers(store) == []


async def test_delete_prefix(store: BlobStore) -> None:
    for key in ("nomad/checkpoints/sbx_1/a.tar", "nomad/checkpoints/sbx_1/b.tar", "nomad/checkpoints/sbx_10/a.tar",
                "nomad/checkpoints/sbx_2/a.tar", "snapshots/snp_1.tar.gz"):
        await store.put(key, stream(key.encode()))
    assert await store.delete_prefix("nomad/checkpoints/sbx_1/") == 2
    assert await store.delete_prefix("nomad/checkpoints/sbx_1/") == 0
    assert not await store.exists("nomad/checkpoints/sbx_1/a.tar")
    assert await read(store, "nomad/checkpoints/sbx_10/a.tar") == b"nomad/checkpoints/sbx_10/a.tar"
    assert await store.delete_prefix("nomad/checkpoints/sbx_") == 2  # a partial last segment
    assert await read(store, "snapshots/snp_1.tar.gz") == b"snapshots/snp_1.tar.gz"
    for prefix in ("", "/", "../", "a/../"):
        with pytest.raises(InvalidInput):
            await store.delete_prefix(prefix)
    assert await leftovers(store) == ["snapshots/snp_1.tar.gz"]


async def test_get_of_a_missing_key_raises_before_any_bytes(store: BlobStore) -> None:
    with pytest.raises(BlobNotFound) as err:
        await anext(store.get("nope/never"))
    assert "nope/never" in err.value.message and err.value.status == 404
    with pytest.raises(BlobNotFound):
        await store.stat("nope/never")
    assert await store.exists("nope/never") is False


async def test_a_spooled_file_is_put_whole(store: BlobStore, tmp_path: Path) -> None:
    """``spool.spool`` then ``spool.put_file``, as the callers do (the files store links)."""
    data = os.urandom(CHUNK + 123)
    (tmp_path / "spool").mkdir()
    with await spool.spool(stream(data[:100], data[100:]), tmp_path / "spool") as spooled:
        await spool.put_file(store, "spooled/k", spooled)
        await spool.put_file(store, "spooled/k", spooled)  # again: replaces, from the start
    assert await read(store, "spooled/k") == data
    assert list((tmp_path / "spool").iterdir()) == []
    assert await leftovers(store) == ["spooled/k"]


def test_clear_spool_removes_only_what_a_killed_process_left(tmp_path: Path) -> None:
    (tmp_path / "spool-old").write_bytes(b"x")
    os.utime(tmp_path / "spool-old", (0, 0))
    (tmp_path / "spool-live").write_bytes(b"y")  # a put in progress right now
    (tmp_path / "other").write_bytes(b"z")
    os.utime(tmp_path / "other", (0, 0))
    assert spool.clear_spool(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "spool-live"]
    assert spool.clear_spool(tmp_path / "absent") == 0


async def test_fetch_gives_a_named_local_file(store: BlobStore, tmp_path: Path) -> None:
    await store.put("f/k", stream(b"abc" * 1000))
    with await spool.fetch(store, "f/k", tmp_path) as local:
        assert local.read() == b"abc" * 1000
        assert await asyncio.to_thread(Path(local.name).read_bytes) == b"abc" * 1000  # tar checks reopen it by name
    with pytest.raises(BlobNotFound):
        await spool.fetch(store, "f/missing", tmp_path)
    assert await asyncio.to_thread(lambda: list(tmp_path.glob("spool-*"))) == []


async def test_the_files_store_links_a_spooled_file_and_is_read_in_place(tmp_path: Path) -> None:
    """Its hooks (``link_file``, ``open_local``): the embedded profile writes an archive once
    and reads it without a copy; the other stores copy through ``put``/``get`` (above)."""
    store = FileBlobStore(tmp_path / "blobs")
    (tmp_path / "spool").mkdir()
    with await spool.spool(stream(b"abc" * 100), tmp_path / "spool") as spooled:
        await spool.put_file(store, "linked/k", spooled)
        assert os.stat(spooled.name).st_ino == store.path("linked/k").stat().st_ino
    with await spool.fetch(store, "linked/k", tmp_path / "spool") as local:
        assert local.name == str(store.path("linked/k")) and local.read() == b"abc" * 100
    assert list((tmp_path / "spool").iterdir()) == []
