"""The OutputStreams contract (core/output.py), run against every adapter: files and
PostgreSQL (a fresh database on the test server; no server is a failure, not a skip)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from hutch.blobs.output_files import FileOutputStreams
from hutch.blobs.output_postgres import PostgresOutputStreams
from hutch.core.errors import InvalidInput
from hutch.core.output import CHUNK, OutputStreams, StreamOwner, UnknownStream
from tests.services import drop_database, fresh_database

CAP = 4 * 2**20
S1 = "stm_one1"
S2 = "stm_two2"


class Follower:
    """Reads a stream to its end in the background; ``first`` is set once bytes came."""

    def __init__(self, outputs: OutputStreams, stream_id: str) -> None:
        self.got: list[bytes] = []
        self.first = asyncio.Event()
        self.task = asyncio.create_task(self._follow(outputs, stream_id))

    async def _follow(self, outputs: OutputStreams, stream_id: str) -> None:
        async for chunk in outputs.read(stream_id):
            self.got.append(chunk)
            self.first.set()


@pytest.fixture(params=["files", "postgres"])
async def outputs(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OutputStreams]:
    if request.param == "files":
        made: OutputStreams = FileOutputStreams(tmp_path / "data", CAP)
        await made.start()
        yield made
        await made.close_store()
        return
    url, name = await fresh_database("output")
    made = PostgresOutputStreams(url, CAP)
    await made.start()
    try:
        yield made
    finally:
        await made.close_store()
        await drop_database(name)


async def read_all(outputs: OutputStreams, stream_id: str, offset: int = 0) -> bytes:
    return b"".join([chunk async for chunk in outputs.read(stream_id, offset)])


async def test_written_bytes_read_back_after_close(outputs: OutputStreams) -> None:
    writer = await outputs.open(S1)
    writer.write(b"hello ")
    writer.write(b"world\n")
    await outputs.close(S1)
    assert await read_all(outputs, S1) == b"hello world\n"
    assert await outputs.size(S1) == 12


async def test_a_stream_is_open_between_open_and_close(outputs: OutputStreams) -> None:
    assert not await outputs.is_open(S1)
    await outputs.open(S1)
    assert await outputs.is_open(S1)
    assert not await outputs.is_open(S2)
    await outputs.close(S1)
    assert not await outputs.is_open(S1)


async def test_open_twice_gives_the_same_writer(outputs: OutputStreams) -> None:
    first = await outputs.open(S1)
    assert await outputs.open(S1) is first
    first.write(b"x")
    await outputs.close(S1)
    assert await read_all(outputs, S1) == b"x"


async def test_open_all_and_close_all_open_and_close_each_stream(outputs: OutputStreams) -> None:
    owner = StreamOwner("org_a", "sbx_a")
    one, two = await outputs.open_all((S1, S2), owner)
    assert (one.stream_id, two.stream_id) == (S1, S2) and one.owner == owner
    assert await outputs.open(S1) is one  # the writer open_all made
    one.write(b"1")
    two.write(b"22")
    await outputs.close_all((S1, S2))
    assert not await outputs.is_open(S1) and not await outputs.is_open(S2)
    assert (await read_all(outputs, S1), await read_all(outputs, S2)) == (b"1", b"22")


async def test_file_streams_open_and_close_an_executions_pair_without_a_loop_turn(tmp_path: Path) -> None:
    # A one-shot's way to its launch opens both streams: a loop turn there lets whatever else
    # is ready (the previous one-shot's teardown) run first (bench/phases.py: 9 ms p50 under load).
    outputs = FileOutputStreams(tmp_path / "data", CAP)
    await outputs.start()
    turns: list[str] = []
    asyncio.get_running_loop().call_soon(turns.append, "open")
    await outputs.open_all((S1, S2), StreamOwner("org_a", "sbx_a"))
    asyncio.get_running_loop().call_soon(turns.append, "close")
    await outputs.close_all((S1, S2))
    assert turns == []
    await outputs.close_store()


async def test_a_stream_without_bytes_reads_empty(outputs: OutputStreams) -> None:
    await outputs.open(S1)
    await outputs.close(S1)
    assert await read_all(outputs, S1) == b""
    assert await outputs.size(S1) == 0
    assert await read_all(outputs, "stm_neveropened") == b""


async def test_read_from_an_offset(outputs: OutputStreams) -> None:
    writer = await outputs.open(S1)
    writer.write(b"0123456789")
    writer.write(b"abcdef")
    await outputs.close(S1)
    assert await read_all(outputs, S1, 4) == b"456789abcdef"
    assert await read_all(outputs, S1, 10) == b"abcdef"
    assert await read_all(outputs, S1, 16) == b""
    assert await read_all(outputs, S1, 100) == b""


async def test_a_negative_offset_is_refused_naming_it(outputs: OutputStreams) -> None:
    with pytest.raises(InvalidInput, match="offset -1"):
        await read_all(outputs, S1, -1)


@pytest.mark.parametrize("bad", ["", "stm_", "stream_1", "stm_../x", "stm_a/b", "stm_é"])
async def test_a_malformed_id_is_an_unknown_stream(outputs: OutputStreams, bad: str) -> None:
    with pytest.raises(UnknownStream, match="not a stream id"):
        await outputs.open(bad)
    with pytest.raises(UnknownStream):
        await read_all(outputs, bad)
    with pytest.raises(UnknownStream):
        await outputs.is_open(bad)
    assert not await outputs.exists(bad)


async def test_exists_is_the_id_check_or_saved_bytes(outputs: OutputStreams) -> None:
    assert not await outputs.exists(S1)
    outputs.verify = lambda stream_id: stream_id == S2
    assert await outputs.exists(S2)
    writer = await outputs.open(S1)
    writer.write(b"data")
    await outputs.close(S1)
    assert await outputs.exists(S1)


async def test_a_follower_gets_bytes_as_they_come_and_ends_at_close(outputs: OutputStreams) -> None:
    writer = await outputs.open(S1)
    follower = Follower(outputs, S1)
    writer.write(b"early ")
    await asyncio.wait_for(follower.first.wait(), 10)  # delivered while the stream is still open
    assert not follower.task.done()
    writer.write(b"late")
    await outputs.close(S1)
    await asyncio.wait_for(follower.task, 10)
    assert b"".join(follower.got) == b"early late"


async def test_a_follower_from_an_offset_of_a_live_stream(outputs: OutputStreams) -> None:
    writer = await outputs.open(S1)
    writer.write(b"abcdef")
    task = asyncio.create_task(read_all(outputs, S1, 3))
    await asyncio.sleep(0.05)
    writer.write(b"ghi")
    await outputs.close(S1)
    assert await asyncio.wait_for(task, 10) == b"defghi"


async def test_a_follower_of_a_stream_without_bytes_ends_at_close(outputs: OutputStreams) -> None:
    await outputs.open(S1)
    task = asyncio.create_task(read_all(outputs, S1))
    await asyncio.sleep(0.05)
    assert not task.done()
    await outputs.close(S1)
    assert await asyncio.wait_for(task, 10) == b""


async def test_concurrent_readers_see_the_same_bytes(outputs: OutputStreams) -> None:
    writer = await outputs.open(S1)
    readers = [asyncio.create_task(read_all(outputs, S1)) for _ in range(5)]
    expected = b""
    for i in range(20):
        piece = f"line {i}\n".encode()
        writer.write(piece)
        expected += piece
        await asyncio.sleep(0.005)
    await outputs.close(S1)
    assert await asyncio.wait_for(asyncio.gather(*readers), 10) == [expected] * 5


async def test_streams_are_independent(outputs: OutputStreams) -> None:
    one, two = await outputs.open(S1), await outputs.open(S2)
    one.write(b"one")
    two.write(b"two")
    await outputs.close(S1)
    assert await outputs.is_open(S2)
    assert await read_all(outputs, S1) == b"one"
    await outputs.close(S2)
    assert await read_all(outputs, S2) == b"two"


async def test_big_writes_read_back_whole_in_bounded_chunks(outputs: OutputStreams) -> None:
    blob = os.urandom(3 * 2**20 + 123)
    writer = await outputs.open(S1)
    writer.write(blob[:100])
    writer.write(blob[100:])
    await outputs.close(S1)
    chunks = [chunk async for chunk in outputs.read(S1)]
    assert b"".join(chunks) == blob
    assert max(len(c) for c in chunks) <= CHUNK
    assert await read_all(outputs, S1, 2**20 + 7) == blob[2**20 + 7:]


async def test_bytes_past_the_cap_are_dropped_and_marked(outputs: OutputStreams) -> None:
    outputs.cap = 10
    writer = await outputs.open(S1)
    writer.write(b"12345678")
    writer.write(b"90abc")
    writer.write(b"more")
    assert writer.truncated and writer.size == 10
    await outputs.close(S1)
    assert await read_all(outputs, S1) == b"1234567890"


async def test_writes_after_close_are_ignored(outputs: OutputStreams) -> None:
    writer = await outputs.open(S1)
    writer.write(b"kept")
    await outputs.close(S1)
    writer.write(b"lost")
    await outputs.close(S1)  # a second close is a no-op
    assert await read_all(outputs, S1) == b"kept"
    assert writer.closed


async def test_a_reader_that_leaves_early_frees_the_stream(outputs: OutputStreams) -> None:
    """Readers leaving after their first chunk give back what they held (a file, a pooled
    connection): 40 of them, more than the PostgreSQL pool's 10 connections, leave no fd
    behind and the next reader is not kept waiting."""
    writer = await outputs.open(S1)
    writer.write(b"a" * (3 * CHUNK))
    await outputs.close(S1)
    await read_all(outputs, S1)  # the pool's connections opened once, before counting fds
    fds = len(os.listdir("/proc/self/fd"))
    async with asyncio.timeout(20):
        for _ in range(40):
            async with contextlib.aclosing(outputs.read(S1)) as chunks:
                async for _chunk in chunks:
                    break
        assert await read_all(outputs, S1) == b"a" * (3 * CHUNK)
    assert len(os.listdir("/proc/self/fd")) <= fds + 2


async def test_close_of_a_stream_not_open_is_a_no_op(outputs: OutputStreams) -> None:
    await outputs.close(S1)
    assert not await outputs.is_open(S1)


async def test_the_secret_is_stable(outputs: OutputStreams) -> None:
    first = await outputs.secret()
    assert len(first) >= 32
    assert await outputs.secret() == first


async def test_closing_the_store_saves_and_closes_its_streams(outputs: OutputStreams) -> None:
    writer = await outputs.open(S1)
    writer.write(b"saved at shutdown")
    await outputs.close_store()
    # What the next server (or another replica) on the same store reads.
    if isinstance(outputs, PostgresOutputStreams):
        again: OutputStreams = PostgresOutputStreams(outputs.dsn, CAP)
    else:
        assert isinstance(outputs, FileOutputStreams)
        again = FileOutputStreams(outputs.data_dir, CAP)
    await again.start()
    try:
        assert not await again.is_open(S1)
        assert await read_all(again, S1) == b"saved at shutdown"
    finally:
        await again.close_store()


def again_on(outputs: OutputStreams) -> OutputStreams:
    """Another server's view of the same store (a restart, or another replica)."""
    if isinstance(outputs, PostgresOutputStreams):
        return PostgresOutputStreams(outputs.dsn, CAP)
    assert isinstance(outputs, FileOutputStreams)
    return FileOutputStreams(outputs.data_dir, CAP)


async def test_an_owned_stream_counts_for_its_organization_from_its_first_byte(outputs: OutputStreams) -> None:
    a1, a2, b1 = StreamOwner("org_a", "sbx_a1"), StreamOwner("org_a", "sbx_a2"), StreamOwner("org_b", "sbx_b1")
    assert await outputs.stored("org_a") == 0 and await outputs.kept() == []
    one = await outputs.open("stm_a1out", a1)
    one.write(b"x" * 1000)
    assert await outputs.stored("org_a") == 1000  # while it runs: saved or about to be
    await outputs.close("stm_a1out")
    for stream_id, owner, size in (("stm_a1err", a1, 10), ("stm_a2out", a2, 200), ("stm_b1out", b1, 7)):
        (await outputs.open(stream_id, owner)).write(b"y" * size)
        await outputs.close(stream_id)
    (await outputs.open("stm_nobody", None)).write(b"z" * 50)  # written before streams had owners
    await outputs.close("stm_nobody")
    (await outputs.open("stm_empty", a1)).write(b"")  # no byte: nothing stored, as before
    await outputs.close("stm_empty")
    assert await outputs.stored("org_a") == 1210 and await outputs.stored("org_b") == 7
    assert sorted(await outputs.kept(), key=str) == sorted([a1, a2, b1], key=str)
    # A restarted server (another replica) counts the same.
    again = again_on(outputs)
    await again.start()
    try:
        assert await again.stored("org_a") == 1210 and await again.stored("org_b") == 7
    finally:
        await again.close_store()


async def test_dropping_a_sandboxs_output_deletes_its_streams_only(outputs: OutputStreams) -> None:
    a1, a2 = StreamOwner("org_a", "sbx_a1"), StreamOwner("org_a", "sbx_a2")
    for stream_id, owner, size in (("stm_a1out", a1, 300), ("stm_a1err", a1, 30), ("stm_a2out", a2, 5)):
        (await outputs.open(stream_id, owner)).write(b"x" * size)
        await outputs.close(stream_id)
    (await outputs.open("stm_nobody")).write(b"z" * 50)
    await outputs.close("stm_nobody")
    assert await outputs.drop(a1) == 330
    assert await read_all(outputs, "stm_a1out") == b"" and await outputs.size("stm_a1err") == 0
    assert await read_all(outputs, "stm_a2out") == b"x" * 5 and await read_all(outputs, "stm_nobody") == b"z" * 50
    assert await outputs.stored("org_a") == 5 and await outputs.kept() == [a2]
    assert await outputs.drop(a1) == 0  # again: nothing left
    again = again_on(outputs)
    await again.start()
    try:
        assert await again.stored("org_a") == 5 and await again.kept() == [a2]
    finally:
        await again.close_store()


def test_an_owner_is_made_of_ids_never_of_paths() -> None:
    for org, sandbox in (("../etc", "sbx_1"), ("org_a", "sbx/1"), ("", "sbx_1"), ("org_a", ".."), ("org a", "s")):
        with pytest.raises(InvalidInput):
            StreamOwner(org, sandbox)


# ---- across processes (PostgreSQL only: file streams are one host's by design, and a
# killed server's file streams read as closed when it restarts)


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[PostgresOutputStreams, PostgresOutputStreams, str]]:
    """Two processes' views of one PostgreSQL store: a writer's and another replica's."""
    url, name = await fresh_database("output")
    writer, reader = PostgresOutputStreams(url, CAP), PostgresOutputStreams(url, CAP)
    await writer.start()
    await reader.start()
    try:
        yield writer, reader, url
    finally:
        await writer.close_store()
        await reader.close_store()
        await drop_database(name)


async def test_another_replica_follows_a_live_stream(
    replicas: tuple[PostgresOutputStreams, PostgresOutputStreams, str],
) -> None:
    outputs, shared, _url = replicas
    writer = await outputs.open(S1)
    assert await shared.is_open(S1)
    follower = Follower(shared, S1)
    writer.write(b"live ")
    await asyncio.wait_for(follower.first.wait(), 10)
    assert not follower.task.done()
    writer.write(b"and done")
    await outputs.close(S1)
    await asyncio.wait_for(follower.task, 10)
    assert b"".join(follower.got) == b"live and done"
    assert not await shared.is_open(S1)
    assert await shared.size(S1) == len(b"live and done")


async def test_replicas_share_the_secret(replicas: tuple[PostgresOutputStreams, PostgresOutputStreams, str]) -> None:
    outputs, shared, _url = replicas
    assert await outputs.secret() == await shared.secret()


async def test_a_stream_open_on_one_replica_cannot_be_opened_on_another(
    replicas: tuple[PostgresOutputStreams, PostgresOutputStreams, str],
) -> None:
    outputs, shared, _url = replicas
    await outputs.open(S1)
    with pytest.raises(InvalidInput, match=f"stream {S1} is already being written"):
        await shared.open(S1)


async def test_a_killed_writer_reads_as_closed_with_every_saved_byte(
    replicas: tuple[PostgresOutputStreams, PostgresOutputStreams, str],
) -> None:
    outputs, shared, url = replicas
    writer = await outputs.open(S1)
    writer.write(b"x" * (CHUNK + 10))  # a full chunk: saved at once
    task = asyncio.create_task(read_all(shared, S1))
    while await shared.size(S1) < CHUNK:  # noqa: ASYNC110 - another process's view: nothing to wait on
        await asyncio.sleep(0.02)
    assert not task.done() and await shared.is_open(S1)
    # The writer's host dies: its session ends without a close.
    session = outputs._session
    assert session is not None
    admin = await asyncpg.connect(url)
    try:
        await admin.execute("SELECT pg_terminate_backend($1)", session.get_server_pid())
    finally:
        await admin.close()
    got = await asyncio.wait_for(task, 10)
    assert got == b"x" * len(got) and len(got) >= CHUNK
    assert not await shared.is_open(S1)


async def test_a_writer_whose_session_was_lost_opens_and_saves_on_a_new_one(
    replicas: tuple[PostgresOutputStreams, PostgresOutputStreams, str],
) -> None:
    outputs, shared, url = replicas
    await outputs.open(S1)
    session = outputs._session
    assert session is not None
    admin = await asyncpg.connect(url)  # a database restart, as this process sees it
    try:
        await admin.execute("SELECT pg_terminate_backend($1)", session.get_server_pid())
    finally:
        await admin.close()
    writer = await outputs.open(S2)
    writer.write(b"after the loss")
    assert await shared.is_open(S1) and await shared.is_open(S2)  # both held again
    await outputs.close(S2)
    await outputs.close(S1)
    assert await read_all(shared, S2) == b"after the loss"  # to its end: released on the new session
    await closed_elsewhere(shared, S1)


async def closed_elsewhere(shared: PostgresOutputStreams, stream_id: str, within: float = 5.0) -> None:
    """Another replica sees the stream closed once the writer's release lands (a round trip
    after ``close`` returned)."""
    for _ in range(int(within / 0.02)):
        if not await shared.is_open(stream_id):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{stream_id} still open for another replica {within} s after its close")


async def test_a_close_answers_once_its_bytes_are_committed_and_the_release_follows(
    replicas: tuple[PostgresOutputStreams, PostgresOutputStreams, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What follows a close (the command's end recorded) does not wait for the lock's release: a
    round trip in series per command. Every byte is committed before the close returns, so a
    reader elsewhere reads them all, and ends once the release lands."""
    outputs, shared, _url = replicas
    on_session = outputs._on_session
    gate = asyncio.Event()

    async def held(query: str, *args: object) -> object:
        if "pg_advisory_unlock" in query:
            await gate.wait()
        return await on_session(query, *args)

    monkeypatch.setattr(outputs, "_on_session", held)
    writer = await outputs.open(S1)
    writer.write(b"every byte")
    await asyncio.wait_for(outputs.close(S1), 5)  # answered with the release held
    assert not await outputs.is_open(S1)
    assert await read_all(outputs, S1) == b"every byte"  # this process's readers: closed at once
    assert await shared.is_open(S1), "the release is held"
    follower = Follower(shared, S1)
    await asyncio.wait_for(follower.first.wait(), 10)
    assert b"".join(follower.got) == b"every byte", "committed before the close answered"
    await asyncio.sleep(0.3)
    assert not follower.task.done(), "open elsewhere until the release lands"
    gate.set()
    await asyncio.wait_for(follower.task, 10)
    assert not await shared.is_open(S1)
