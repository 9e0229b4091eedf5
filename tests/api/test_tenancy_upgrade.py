"""Tenancy across processes and versions: a key revoked through one API process is refused
by another on the same Kafka log and PostgreSQL store; a data dir (or store) written before
tenancy keeps working, all of it in org_local, with no migration step."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from hutch.core.events import Event, SandboxCreated, SandboxStarted, encode
from hutch.core.models import SandboxSpec
from hutch.core.serde import converter
from hutch.service.composition import open_event_log
from hutch.service.config import Config
from hutch.service.engine import now_iso
from tests.api.conftest import Api, AppFactory
from tests.services import drop_database, drop_topics, fresh_database, kafka_url


@pytest.fixture(params=["fake"])
def driver_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)  # about the log and the store: one driver is enough


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def call(url: str, method: str, path: str, key: str, body: Any = None) -> tuple[int, Any]:
    req = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body is not None
                                 else None, headers={"Authorization": f"Bearer {key}",
                                                     "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


@pytest.fixture
def production() -> Iterator[dict[str, str]]:
    store, database = asyncio.run(fresh_database("replicas"))
    log = kafka_url("replicas")
    yield {"HUTCH_EVENT_LOG": log, "HUTCH_STORE": store}
    asyncio.run(drop_database(database))
    asyncio.run(drop_topics(log))


def serve(tmp: Path, name: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    with (tmp / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hutch.cli", "serve", "--port", str(port), "--data-dir", str(tmp / name),
             "--driver", "fake"],
            env={**os.environ, **env, "HUTCH_API_KEY": "boot", "HUTCH_LOG_LEVEL": "WARNING"},
            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if call(url, "GET", "/healthz", "")[0] == 200:
                return proc, url
        except OSError:
            pass
        assert proc.poll() is None, (tmp / f"{name}.log").read_text()
        assert time.monotonic() < deadline, "server not ready"
        time.sleep(0.1)


def test_a_revocation_through_one_api_process_is_refused_by_another(tmp_path: Path,
                                                                    production: dict[str, str]) -> None:
    a, url_a = serve(tmp_path, "a", production)
    b, url_b = serve(tmp_path, "b", production)
    try:
        assert call(url_a, "POST", "/orgs", "boot", {"name": "alpha"})[0] == 201
        status, made = call(url_a, "POST", "/keys?orgId=org_alpha", "boot", {"role": "member"})
        assert status == 201
        secret, key_id = made["data"]["secret"], made["data"]["id"]
        deadline = time.monotonic() + 30
        while call(url_b, "GET", "/sandbox", secret)[0] != 200:  # B learns of the new key from the log
            assert time.monotonic() < deadline
            time.sleep(0.01)
        status, created = call(url_b, "POST", "/sandbox", secret, {})
        assert status == 201  # made through B by a key made through A
        assert call(url_a, "GET", f"/sandbox/{created['data']['sandboxId']}", secret)[0] == 200
        assert call(url_a, "DELETE", f"/keys/{key_id}?orgId=org_alpha", "boot")[0] == 200
        revoked_at = time.monotonic()
        while True:
            status, body = call(url_b, "GET", "/sandbox", secret)
            if status == 401:
                break
            assert time.monotonic() - revoked_at < 30, "B still takes a key revoked through A"
            time.sleep(0.005)
        lag_ms = (time.monotonic() - revoked_at) * 1000
        assert "revoked" in body["message"]
        print(f"revocation seen by the other API process after {lag_ms:.0f} ms")
    finally:
        for proc in (a, b):
            proc.terminate()
            proc.wait(timeout=30)


async def _old_store(dsn: str, events: list[Event]) -> None:
    import asyncpg

    from hutch.projections.base import fold
    from hutch.storage.schema import migrations

    sandboxes: dict[str, Any] = {}
    for event in events:
        fold(sandboxes, {}, {}, event)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
                           " applied_at timestamptz NOT NULL DEFAULT now())")
        for version, name, sql in migrations():
            if version <= 4:
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name)
        for sb in sandboxes.values():
            doc = converter.unstructure(sb)
            doc["spec"].pop("orgId")
            await conn.execute(
                "INSERT INTO sandboxes (sandbox_id, status, is_final, name, mode, created_at, updated_at, doc)"
                " VALUES ($1, $2, false, $3, 'interactive', $4, $4, $5::jsonb)",
                sb.sandbox_id, sb.status.value, sb.spec.name, sb.created_at, json.dumps(doc, default=sorted))
        await conn.execute("UPDATE projection_position SET position = $1", events[-1].position)
    finally:
        await conn.close()


def _old_record(event: Event) -> dict[str, Any]:
    """``event`` as a server from before tenancy wrote it: no orgId anywhere."""
    record = encode(event)  # the real one (the modules' name is patched, not this)
    record.pop("orgId", None)
    record.pop("projectId", None)
    record["data"].get("spec", {}).pop("orgId", None)
    return record


async def test_a_data_dir_from_before_tenancy_keeps_working(make_api: AppFactory, data_dir: Path,
                                                            profile: dict[str, str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    config = Config(data_dir=data_dir, api_key="test-key", **profile)  # type: ignore[arg-type]
    log = open_event_log(config.event_log, data_dir)
    await log.start()
    from hutch.eventlog import kafka_records, sqlite

    for module in (kafka_records, sqlite):  # write as the old server did
        monkeypatch.setattr(module, "encode", _old_record)
    spec = SandboxSpec(runtime="base:latest", runtime_id="srt_x", name="old-one")
    old = [Event("evt_" + "1" * 26, "sbx_" + "1" * 26, now_iso(), SandboxCreated(spec=spec), actor="key_old"),
           Event("evt_" + "2" * 26, "sbx_" + "1" * 26, now_iso(), SandboxStarted(), actor="key_old")]
    positions = await log.append(old)
    await log.close()
    monkeypatch.undo()
    if profile:  # and a PostgreSQL store as the old server left it: migrations 001-004, its rows
        await _old_store(profile["store"], [attrs.evolve(e, position=p) for e, p in zip(old, positions, strict=True)])
    api: Api = await make_api(driver="fake")
    got = await api.data("GET", "/sandbox/sbx_" + "1" * 26)
    assert got["name"] == "old-one" and got["org"] == {"id": "org_local", "name": "local"}
    assert (await api.data("GET", "/sandbox"))["total"] == 1
    # The bootstrap key is org_local's admin and the server's: it makes organizations and keys.
    await api.call("POST", "/orgs", json={"name": "beta"}, expect=201)
    beta = await api.data("POST", "/keys?orgId=org_beta", json={"role": "admin"}, expect=201)
    other = {"Authorization": f"Bearer {beta['secret']}"}
    await api.call("GET", "/sandbox/sbx_" + "1" * 26, headers=other, expect=404)
    assert (await api.data("GET", "/sandbox", headers=other))["total"] == 0
