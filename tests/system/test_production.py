"""Faults on the production profile (Kafka + PostgreSQL), with real server processes.

* kill -9 the API during a workload of more than 1,000 operations, restart it: nothing
  acknowledged is lost and the projections equal a fresh rebuild from the log;
* restart the Kafka broker (kill -9) during a workload: no acknowledged event is lost and
  the server recovers by itself;
* restart PostgreSQL (immediate shutdown, as after a crash) during a workload: the
  projector resumes from its tracked position, without duplicates;
* a second API process sees the first one's writes; the projector can run as its own
  process; ``hutch audit`` keeps a trail of every event exactly once.

Broker and database restarts use private instances (other ports, fresh state) so the
shared test services are never disturbed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.services import PrivateService, drop_database, fresh_database
from tests.system.server import KEY, ROOT, Server

pytestmark = pytest.mark.slow

KEY_ID = "key_" + hashlib.sha256(KEY.encode()).hexdigest()[:12]


# ---------------------------------------------------------------- helpers


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def hutch(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "hutch", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert proc.returncode == 0, (args, proc.returncode, proc.stdout, proc.stderr[-3000:])
    return proc


async def _dump(url: str) -> dict[str, Any]:
    conn = await asyncpg.connect(url)
    try:
        return {
            "position": await conn.fetchval("SELECT position FROM projection_position"),
            "sandboxes": [(r[0], json.loads(r[1])) for r in await conn.fetch("SELECT sandbox_id, doc FROM sandboxes ORDER BY 1")],
            "executions": [(r[0], r[1], json.loads(r[2])) for r in await conn.fetch(
                "SELECT execution_id, seq, doc FROM executions ORDER BY 1")],
        }
    finally:
        await conn.close()


def assert_equals_a_fresh_rebuild(event_log: str, store: str, tmp_path: Path, admin_store: str | None = None) -> dict[str, Any]:
    """Rebuild the log into a new database and compare it with the live projections."""
    live = run(_dump(store))
    if admin_store is None:
        fresh, name = run(fresh_database("rebuild"))
    else:
        fresh, name = run(_create_on(admin_store))
    try:
        out = hutch("projections", "rebuild", "--event-log", event_log, "--store", fresh, "--data-dir", str(tmp_path / "rebuild"))
        result = json.loads(out.stdout)
        rebuilt = run(_dump(fresh))
    finally:
        if admin_store is None:
            run(drop_database(name))
    assert result["position"] == live["position"]
    assert rebuilt["sandboxes"] == live["sandboxes"]
    assert rebuilt["executions"] == live["executions"]
    return live


async def _create_on(admin: str) -> tuple[str, str]:
    name = f"rebuild_{random.randrange(10**9)}"
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return admin.rsplit("/", 1)[0] + "/" + name, name


class Workload:
    """Operations from several threads; remembers what the server acknowledged."""

    def __init__(self, server: Server, *, timeout: float = 30) -> None:
        self.server = server
        self.timeout = timeout
        self.lock = threading.Lock()
        self.sandboxes: list[str] = []
        self.executions: dict[str, str] = {}  # execution id -> sandbox id
        self.destroyed: set[str] = set()
        self.destroying: set[str] = set()  # DELETE sent (maybe not answered yet)
        self.acked = 0
        self.failed = 0
        self.failures: list[str] = []  # what the failed operations were answered, for the assertion's message
        self.pending_at_fault = 0  # operations not yet answered when the fault was injected

    def op(self, i: int) -> None:
        rnd = random.Random(i)
        with self.lock:
            live = [s for s in self.sandboxes if s not in self.destroyed]
        sid, status, body = None, -1, None
        try:
            if not live or i % 3 == 0:
                status, body = self.server.call("POST", "/sandbox", {"name": f"w{i}"}, timeout=self.timeout)
                if status == 201:
                    with self.lock:
                        self.sandboxes.append(body["data"]["sandboxId"])
            elif i % 17 == 0:
                sid = rnd.choice(live)
                with self.lock:
                    self.destroying.add(sid)
                status, _ = self.server.call("DELETE", f"/sandbox/{sid}", timeout=self.timeout)
                if status == 200:
                    with self.lock:
                        self.destroyed.add(sid)
            else:
                sid = rnd.choice(live)
                status, body = self.server.call("POST", f"/sandbox/{sid}/execute", {"command": ["echo", str(i)]},
                                                timeout=self.timeout)
                if status == 200:
                    with self.lock:
                        self.executions[body["data"]["executionId"]] = sid
            # 409: the sandbox ended meanwhile; 404: another thread of this workload deleted it
            # between choosing it and executing in it. Both are real answers, not failures.
            ok = 200 <= status < 300 or status == 409 or (status == 404 and sid in self.destroying)
        except OSError as err:
            ok, status, body = False, -1, repr(err)
        with self.lock:
            if ok:
                self.acked += 1
            else:
                self.failed += 1
                self.failures.append(f"op {i}: {status} {str(body)[:300]}")

    def run(self, ops: range, threads: int = 8, during: Callable[[], None] | None = None, at: int = 0) -> None:
        """Run ``ops``; call ``during`` (in this thread) once ``at`` operations were acknowledged."""
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(self.op, i) for i in ops]
            if during is not None:
                while self.acked < at and not all(f.done() for f in futures):
                    time.sleep(0.01)
                self.pending_at_fault = sum(not f.done() for f in futures)
                during()
            for f in futures:
                f.result()

    def check_all_acknowledged_are_there(self, server: Server) -> None:
        for sid in self.sandboxes:
            status, body = server.call("GET", f"/sandbox/{sid}?includeDeleted=true")
            assert status == 200, (sid, body)
            if sid in self.destroyed:
                assert body["data"]["status"] == "deleted"
        for eid, sid in self.executions.items():
            status, body = server.call("GET", f"/sandbox/execution/{eid}")
            assert status == 200 and body["data"]["sandboxId"] == sid, (eid, body)


# ---------------------------------------------------------------- kill -9 the API


def test_kill9_during_1000_operations_then_projections_equal_a_rebuild(
    tmp_path: Path, database: str, kafka_log: Callable[[str], str]
) -> None:
    log = kafka_log("kill9")
    server = Server(tmp_path / "data", HUTCH_EVENT_LOG=log, HUTCH_STORE=database).start()
    work = Workload(server, timeout=10)
    try:
        work.run(range(700), during=server.kill9, at=400)
        assert work.pending_at_fault > 0 and work.failed > 0, "the kill landed after the workload ended"
        server.start()
        work.run(range(700, 700 + 1000 - min(work.acked, 1000) + 100))
        assert work.acked >= 1000
        work.check_all_acknowledged_are_there(server)
    finally:
        server.stop()
    live = assert_equals_a_fresh_rebuild(log, database, tmp_path)
    assert len(live["sandboxes"]) >= len(work.sandboxes)


# ---------------------------------------------------------------- restart the broker


@pytest.fixture
def private_kafka() -> Iterator[PrivateService]:
    service = PrivateService("kafka", 19292).start()
    yield service
    service.destroy()


@pytest.fixture
def private_postgres() -> Iterator[PrivateService]:
    service = PrivateService("postgres", 15632).start()
    yield service
    service.destroy()


def test_kafka_broker_restart_during_a_workload_loses_nothing_acknowledged(
    tmp_path: Path, database: str, private_kafka: PrivateService
) -> None:
    log = private_kafka.settings["HUTCH_EVENT_LOG"].rsplit("/", 1)[0] + "/restart"
    server = Server(tmp_path / "data", HUTCH_EVENT_LOG=log, HUTCH_STORE=database).start()
    work = Workload(server, timeout=90)  # appends wait for the broker instead of failing

    def crash_and_restart() -> None:
        subprocess.run(["kill", "-9", str(private_kafka.pid())], check=True)
        time.sleep(2)
        private_kafka.start()

    try:
        work.run(range(300), during=crash_and_restart, at=100)
        assert work.pending_at_fault > 0, "the broker went down after the workload ended"
        # The server recovered by itself: new work succeeds without a restart.
        before = work.acked
        work.run(range(300, 400))
        assert work.acked - before == 100, work.failures[-10:]  # phase 2's are the last
        work.check_all_acknowledged_are_there(server)
        # Every acknowledged sandbox's create is in the log (the events API reads the log).
        for sid in work.sandboxes:
            events = server.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100")["events"]
            assert events[0]["type"] == "create"
    finally:
        server.stop()
    assert_equals_a_fresh_rebuild(log, database, tmp_path)


# ---------------------------------------------------------------- restart PostgreSQL


def test_postgres_restart_the_projector_resumes_without_duplicates(
    tmp_path: Path, private_postgres: PrivateService, kafka_log: Callable[[str], str]
) -> None:
    admin = private_postgres.settings["HUTCH_STORE"]
    store, _ = run(_create_on(admin))
    log = kafka_log("pgrestart")
    server = Server(tmp_path / "data", HUTCH_EVENT_LOG=log, HUTCH_STORE=store).start()
    work = Workload(server, timeout=60)

    def crash_and_restart() -> None:
        private_postgres.stop(HUTCH_PG_STOP_MODE="immediate")
        time.sleep(2)
        private_postgres.start()

    try:
        work.run(range(300), during=crash_and_restart, at=100)
        assert work.pending_at_fault > 0, "PostgreSQL went down after the workload ended"
        before = work.acked
        work.run(range(300, 400))
        assert work.acked - before == 100, work.failures[-10:]  # phase 2's are the last
        work.check_all_acknowledged_are_there(server)
    finally:
        server.stop()
    live = assert_equals_a_fresh_rebuild(log, store, tmp_path, admin_store=admin)
    # No event applied twice: every execution counted once on its sandbox.
    started: dict[str, int] = {}
    for _, _, ex in live["executions"]:
        started[ex["sandboxId"]] = started.get(ex["sandboxId"], 0) + 1
    for sid, doc in live["sandboxes"]:
        assert doc.get("executions", 0) == started.get(sid, 0), sid


# ---------------------------------------------------------------- more than one process


def test_a_second_api_process_sees_writes_and_a_separate_projector_serves_reads(
    tmp_path: Path, database: str, kafka_log: Callable[[str], str]
) -> None:
    log = kafka_log("two")
    with open(tmp_path / "projector.log", "wb") as errors:  # the child keeps its own copy of the fd
        projector = subprocess.Popen([sys.executable, "-m", "hutch", "projector", "--event-log", log, "--store", database,
                                      "--data-dir", str(tmp_path / "projector")], cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=errors)
    first = Server(tmp_path / "a", HUTCH_EVENT_LOG=log, HUTCH_STORE=database, HUTCH_PROJECTOR="external")
    second = Server(tmp_path / "b", HUTCH_EVENT_LOG=log, HUTCH_STORE=database)
    try:
        first.start()
        second.start()
        for i in range(20):
            created = first.data("POST", "/sandbox", {"name": f"two{i}"})
            # Read-your-writes on the writer, though another process applies the log.
            assert created["status"] == "idle"
            assert first.data("GET", f"/sandbox/{created['sandboxId']}")["name"] == f"two{i}"
            seen = time.monotonic()
            while second.call("GET", f"/sandbox/{created['sandboxId']}")[0] != 200:
                assert time.monotonic() - seen < 2, "the second API process did not see the write"
                time.sleep(0.005)
        listed = second.data("GET", "/sandbox?limit=100")
        assert listed["total"] == 20
    finally:
        first.stop()
        second.stop()
        projector.terminate()
        projector.wait(20)
    assert projector.returncode == 0, (tmp_path / "projector.log").read_text()[-3000:]


# ---------------------------------------------------------------- audit


def test_hutch_audit_keeps_every_event_once_and_names_the_key(
    tmp_path: Path, database: str, kafka_log: Callable[[str], str]
) -> None:
    log = kafka_log("audit")
    server = Server(tmp_path / "data", HUTCH_EVENT_LOG=log, HUTCH_STORE=database).start()
    try:
        server.data("POST", "/orgs", {"name": "acme"})
        acme = server.data("POST", "/sandbox?orgId=org_acme", {})["sandboxId"]  # the bootstrap key, acting for acme
        Workload(server).run(range(60), threads=4)
        trail = tmp_path / "audit.jsonl"
        first = hutch("audit", "--event-log", log, "--store", database, "--jsonl", str(trail), "--until-caught-up",
                      "--data-dir", str(tmp_path / "audit"))
        events = run(_log_events(log, tmp_path))
        assert json.loads(first.stdout)["written"] == len(events)
        # More work, then the same group again: only the new events, nothing twice.
        Workload(server).run(range(60, 90), threads=4)
        hutch("audit", "--event-log", log, "--store", database, "--jsonl", str(trail), "--until-caught-up",
              "--data-dir", str(tmp_path / "audit"))
    finally:
        server.stop()
    events = run(_log_events(log, tmp_path))
    lines = [json.loads(line) for line in trail.read_text().splitlines()]
    assert sorted(r["eventId"] for r in lines) == sorted(e.event_id for e in events)
    rows = run(_audit_rows(database))
    assert sorted(r["event_id"] for r in rows) == sorted(e.event_id for e in events)
    creates = [r for r in rows if r["type"] == "create"]
    assert creates and all(r["actor"] == KEY_ID for r in creates)
    # A new subscriber (another group) starts from the beginning of the log.
    other = tmp_path / "other.jsonl"
    hutch("audit", "--event-log", log, "--jsonl", str(other), "--group", "another", "--until-caught-up",
          "--store", "memory", "--data-dir", str(tmp_path / "audit2"))
    assert len(other.read_text().splitlines()) == len(events)
    # One organization's trail: its records only, each naming it.
    mine = tmp_path / "acme.jsonl"
    hutch("audit", "--event-log", log, "--jsonl", str(mine), "--group", "acme", "--org", "org_acme",
          "--until-caught-up", "--store", "memory", "--data-dir", str(tmp_path / "audit3"))
    acme_records = [json.loads(line) for line in mine.read_text().splitlines()]
    assert {r["orgId"] for r in acme_records} == {"org_acme"}
    assert len(acme_records) == len([e for e in events if e.org_id == "org_acme"]) >= 3  # org, create, start
    assert acme in {r["sandboxId"] for r in acme_records}
    assert {r["org_id"] for r in rows} == {"org_local", "org_acme"}


async def _log_events(url: str, tmp_path: Path) -> list[Any]:
    from hutch.service.composition import open_event_log

    log = open_event_log(url, tmp_path / "reader", read_only=True)
    await log.start()
    try:
        return await log.read()
    finally:
        await log.close()


async def _audit_rows(url: str) -> list[Any]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch("SELECT * FROM audit_trail ORDER BY position"))
    finally:
        await conn.close()
