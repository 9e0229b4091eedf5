"""A projection store belongs to one event log: a server whose store and log part ways is
refused at start with an error naming both and the fix, never started to skip the log's
events (issue: a new Kafka topic with an old PostgreSQL store answered 404 to every create).

Real server processes (``python -m hutch.api``) on real Kafka and PostgreSQL, and the embedded
SQLite log; the happy paths (restart, rebuild, a second API process) stay as they were.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import drop_database, drop_topics, fresh_database, kafka_url
from tests.system.server import ROOT, Server

pytestmark = pytest.mark.slow


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


@pytest.fixture
def database() -> Iterator[str]:
    url, name = run(fresh_database("identity"))
    yield url
    run(drop_database(name))


@pytest.fixture
def topics() -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for url in made:
        run(drop_topics(url))


def new_topic(topics: list[str]) -> str:
    url = kafka_url("identity")
    topics.append(url)
    return url


def refused(server: Server) -> str:
    """Start a server that must refuse; returns what it said."""
    with pytest.raises(RuntimeError) as caught:
        server.start(timeout=60)
    assert server.proc is not None and server.proc.returncode not in (None, 0)
    return str(caught.value)


def make_sandboxes(server: Server, n: int = 3) -> list[str]:
    ids = []
    for _ in range(n):
        ids.append(server.data("POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"])
    return ids


def assert_names_both_and_the_fix(said: str, store_log: str | None, log: str | None) -> None:
    assert "PROJECTION_LOG_MISMATCH" in said or "projection store" in said, said
    for identity in (store_log, log):
        if identity:
            assert identity in said, (identity, said)
    assert "hutch projections rebuild" in said, said


def identity_of(event_log: str, data_dir: Path) -> str:
    from hutch.service.composition import open_event_log

    async def ask() -> str:
        log = open_event_log(event_log, data_dir, read_only=True)
        await log.start()
        try:
            return str(await log.identity())
        finally:
            await log.close()

    return run(ask())


def test_a_new_topic_with_an_old_store_is_refused(tmp_path: Path, database: str, topics: list[str]) -> None:
    old = new_topic(topics)
    server = Server(tmp_path / "a", HUTCH_EVENT_LOG=old, HUTCH_STORE=database).start()
    try:
        make_sandboxes(server)
    finally:
        server.stop()
    old_identity = identity_of(old, tmp_path / "probe")
    new = new_topic(topics)
    said = refused(Server(tmp_path / "b", HUTCH_EVENT_LOG=new, HUTCH_STORE=database))
    # The refused server, a writer, gave the new topic its epoch before it looked at the store.
    assert_names_both_and_the_fix(said, old_identity, identity_of(new, tmp_path / "probe"))
    assert "PROJECTION_LOG_MISMATCH" in said and "Traceback" not in said
    # Nothing was appended to the new log on the refused server's behalf.
    assert run(_events_in(new, tmp_path / "probe")) == 0


async def _events_in(url: str, data_dir: Path) -> int:
    from hutch.service.composition import open_event_log

    log = open_event_log(url, data_dir, read_only=True)
    await log.start()
    try:
        return len(await log.read())
    finally:
        await log.close()


def test_a_recreated_topic_is_refused_and_rebuild_points_the_store_at_it(
    tmp_path: Path, database: str, topics: list[str]
) -> None:
    url = new_topic(topics)
    server = Server(tmp_path / "a", HUTCH_EVENT_LOG=url, HUTCH_STORE=database).start()
    try:
        make_sandboxes(server)
    finally:
        server.stop()
    before = identity_of(url, tmp_path / "probe")
    run(drop_topics(url))
    # The same name, a new log: its first writer (here a second deployment on another store)
    # writes a new epoch.
    other_store, other_name = run(fresh_database("recreated"))
    try:
        writer = Server(tmp_path / "w", HUTCH_EVENT_LOG=url, HUTCH_STORE=other_store).start()
        try:
            kept = make_sandboxes(writer, 2)
        finally:
            writer.stop()
    finally:
        run(drop_database(other_name))
    after = identity_of(url, tmp_path / "probe")
    assert after != before and after.startswith("kafka:") and url.rsplit("/", 1)[1] in after
    server = Server(tmp_path / "a", HUTCH_EVENT_LOG=url, HUTCH_STORE=database)
    assert_names_both_and_the_fix(refused(server), before, after)
    # The fix the error names: rebuild the store from the new log; then it serves that log.
    out = subprocess.run([sys.executable, "-m", "hutch", "projections", "rebuild", "--event-log", url,
                          "--store", database, "--data-dir", str(tmp_path / "rebuild")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["log"] == after
    server.start()
    try:
        listed = {sb["sandboxId"] for sb in server.data("GET", "/sandbox?limit=100")["sandboxes"]}
        assert listed == set(kept)
        created = make_sandboxes(server, 1)[0]  # and new writes show at once
        assert server.data("GET", f"/sandbox/{created}")["sandboxId"] == created
    finally:
        server.stop()


@pytest.mark.parametrize("profile", ["kafka", "sqlite"])
def test_an_older_log_with_a_newer_store_is_refused(
    tmp_path: Path, database: str, topics: list[str], profile: str
) -> None:
    """The store holds more than its own log: the log lost records (restored from an older
    backup, a file copied back). Refused: the store would skip the log's next events."""
    if profile == "sqlite":
        data = tmp_path / "a"
        server = Server(data, HUTCH_EVENT_LOG="sqlite", HUTCH_STORE=database).start()
        try:
            make_sandboxes(server, 1)
            server.stop()
            shutil.copy(data / "events.db", tmp_path / "older.db")  # the backup (WAL checkpointed at close)
            server.start()
            make_sandboxes(server, 2)
        finally:
            server.stop()
        for suffix in ("-wal", "-shm"):
            (data / f"events.db{suffix}").unlink(missing_ok=True)
        shutil.copy(tmp_path / "older.db", data / "events.db")
        identity = identity_of("sqlite", data)
        said = refused(Server(data, HUTCH_EVENT_LOG="sqlite", HUTCH_STORE=database))
    else:
        # Kafka keeps every record (unlimited retention); the store is moved ahead instead:
        # the same state as a log that lost its newest records.
        url = new_topic(topics)
        server = Server(tmp_path / "a", HUTCH_EVENT_LOG=url, HUTCH_STORE=database).start()
        try:
            make_sandboxes(server, 2)
        finally:
            server.stop()
        run(_move_store_ahead(database, 10_000))
        identity = identity_of(url, tmp_path / "probe")
        said = refused(Server(tmp_path / "a", HUTCH_EVENT_LOG=url, HUTCH_STORE=database))
    assert_names_both_and_the_fix(said, identity, None)
    assert "lost records" in said, said


async def _move_store_ahead(database: str, by: int) -> None:
    import asyncpg

    conn = await asyncpg.connect(database)
    try:
        await conn.execute("UPDATE projection_position SET position = position + $1", by)
    finally:
        await conn.close()


def test_a_swapped_events_db_is_refused(tmp_path: Path, database: str) -> None:
    data = tmp_path / "a"
    server = Server(data, HUTCH_EVENT_LOG="sqlite", HUTCH_STORE=database).start()
    try:
        make_sandboxes(server)
    finally:
        server.stop()
    before = identity_of("sqlite", data)
    (data / "events.db").rename(tmp_path / "kept.db")
    for suffix in ("-wal", "-shm"):
        (data / f"events.db{suffix}").unlink(missing_ok=True)
    # Another deployment's log, with as many events as the store holds and more.
    other = tmp_path / "other"
    writer = Server(other).start()
    try:
        make_sandboxes(writer, 6)
    finally:
        writer.stop()
    shutil.copy(other / "events.db", data / "events.db")
    after = identity_of("sqlite", data)
    assert after != before
    assert_names_both_and_the_fix(refused(Server(data, HUTCH_EVENT_LOG="sqlite", HUTCH_STORE=database)),
                                  before, after)


def test_the_happy_paths_stay_open(tmp_path: Path, database: str, topics: list[str]) -> None:
    """Restart, a second API process on the same log and store, and a legacy store (made before
    identities: bound to no log) all start; the legacy store binds to the log it meets."""
    url = new_topic(topics)
    first = Server(tmp_path / "a", HUTCH_EVENT_LOG=url, HUTCH_STORE=database).start()
    second = Server(tmp_path / "b", HUTCH_EVENT_LOG=url, HUTCH_STORE=database).start()
    try:
        made = make_sandboxes(first, 2)
        assert second.data("GET", f"/sandbox/{made[0]}")["sandboxId"] == made[0]
        made += make_sandboxes(second, 1)
    finally:
        second.stop()
        first.stop()
    run(_forget_binding(database))
    first.start()
    try:
        listed = {sb["sandboxId"] for sb in first.data("GET", "/sandbox?limit=100")["sandboxes"]}
        assert set(made) <= listed
    finally:
        first.stop()
    assert run(_binding(database)) == identity_of(url, tmp_path / "probe")


async def _forget_binding(database: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(database)
    try:
        await conn.execute("UPDATE projection_position SET log_identity = NULL")
    finally:
        await conn.close()


async def _binding(database: str) -> str | None:
    import asyncpg

    conn = await asyncpg.connect(database)
    try:
        return await conn.fetchval("SELECT log_identity FROM projection_position")
    finally:
        await conn.close()


def test_sandboxes_no_event_owns_are_destroyed_at_start(tmp_path: Path) -> None:
    """The embedded default rebuilds its views from events.db at every start, so a swapped
    file is no mismatch there; but the local driver's sandboxes made under the old log have no
    owner in the new one. Destroyed at start (as dead ones always were), not left running."""
    data = tmp_path / "data"
    server = Server(data, driver="local").start()
    try:
        orphan = server.data("POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"]
        server.data("POST", f"/sandbox/{orphan}/execute", {"command": ["sh", "-c", "sleep 300 >/dev/null 2>&1 &"]})
        ended = server.data("POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"]
        server.kill9()
        init_pid = json.loads((data / "sandboxes" / orphan / "meta.json").read_text())["init_pid"]
        assert Path(f"/proc/{init_pid}").exists()  # a killed server leaves its sandboxes running
        (data / "events.db").rename(tmp_path / "old-events.db")
        for suffix in ("-wal", "-shm"):
            (data / f"events.db{suffix}").unlink(missing_ok=True)
        server.start()
        assert server.call("GET", f"/sandbox/{orphan}")[0] == 404
        assert not (data / "sandboxes" / orphan).exists() and not (data / "sandboxes" / ended).exists()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{init_pid}").exists():
            assert time.monotonic() < deadline, "the unowned sandbox's processes outlived the start"
            time.sleep(0.05)
        assert "has no record of it; destroying it" in server.log.read_text()
        # The new log works as any other.
        fresh = server.data("POST", "/sandbox", {"runtime": "base:latest"})["sandboxId"]
        assert server.data("GET", f"/sandbox/{fresh}")["status"] in ("idle", "creating")
        server.destroy_every_sandbox()
    finally:
        server.stop()
