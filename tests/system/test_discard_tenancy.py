"""A sandbox no event recorded, ended by a survivor (``lifecycle:discarded``, service/takeover.py),
is its tenant's: the end is filed under the organization that asked for the sandbox, never
under ``org_local`` (an operator's trail) nor another tenant's. Before, the discard carried no
organization: ``hutch audit --org org_local`` listed another tenant's sandbox id and why it
ended, and the tenant's own trail and events never showed it.

Two real server processes (the fake driver: what is under test is the log, the store and the
trail) on the shared Kafka broker and PostgreSQL server; one replica dies (or freezes) between
making a sandbox and recording it, the other takes it over."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from hutch.core.replicas import LEASE_SECONDS, RENEW_SECONDS
from tests.system.server import ROOT, Server

pytestmark = pytest.mark.slow

ENDED_WITHIN = LEASE_SECONDS + 2 * RENEW_SECONDS + 15  # the lease, a take-over round, this machine's slack


def _as(server: Server, secret: str, path: str) -> tuple[int, Any]:
    req = urllib.request.Request(server.url + path, headers={"Authorization": f"Bearer {secret}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _tenants(server: Server) -> dict[str, str]:
    """Two organizations and a member key of each: org id -> the key's secret."""
    keys = {}
    for name in ("acme", "rival"):
        org = server.data("POST", "/orgs", {"name": name})["id"]
        keys[org] = server.data("POST", f"/keys?orgId={org}", {"role": "member"})["secret"]
    return keys


def _discards(server: Server, deadline: float) -> list[dict[str, Any]]:
    """The log's lifecycle:discarded records, once there is one (the survivor's take-over)."""
    while True:
        found = [r for r in _records(server) if r["type"] == "lifecycle:discarded"]
        if found:
            return found
        assert time.monotonic() < deadline, "no lifecycle:discarded: the survivor ended nothing"
        time.sleep(0.5)


def _records(server: Server) -> list[dict[str, Any]]:
    return asyncio.run(_log_records(server.env["HUTCH_EVENT_LOG"], server.data_dir.parent / "reader"))


async def _log_records(url: str, data_dir: Path) -> list[dict[str, Any]]:
    from hutch.core.events import encode
    from hutch.service.composition import open_event_log

    log = open_event_log(url, data_dir, read_only=True)
    await log.start()
    try:
        return [encode(e) for e in await log.read()]
    finally:
        await log.close()


def _trail(server: Server, tmp_path: Path, org: str) -> set[str]:
    """The sandbox ids of ``hutch audit --org ORG``'s trail (a group of its own, from the start)."""
    out = tmp_path / f"{org}.jsonl"
    proc = subprocess.run([sys.executable, "-m", "hutch", "audit", "--event-log", server.env["HUTCH_EVENT_LOG"],
                           "--jsonl", str(out), "--group", f"audit-{org}", "--org", org, "--until-caught-up",
                           "--store", "memory", "--data-dir", str(tmp_path / f"audit-{org}")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {json.loads(line)["sandboxId"] for line in out.read_text().splitlines()}


async def _audit_orgs(database: str, sandbox_id: str) -> dict[str, str]:
    """type -> org of the sandbox's rows in the PostgreSQL trail."""
    conn = await asyncpg.connect(database)
    try:
        rows = await conn.fetch("SELECT type, org_id FROM audit_trail WHERE sandbox_id = $1", sandbox_id)
    finally:
        await conn.close()
    return {r["type"]: r["org_id"] for r in rows}


def _assert_filed_under(owner: str, keys: dict[str, str], survivor: Server, tmp_path: Path, database: str,
                        sandbox_id: str) -> None:
    rival = next(org for org in keys if org != owner)
    # The events API: its tenant reads the end, nobody else learns the sandbox was ever there.
    status, body = _as(survivor, keys[owner], f"/sandbox/sandboxes/{sandbox_id}/events")
    assert status == 200, body
    assert "lifecycle:discarded" in [e["type"] for e in body["data"]["events"]], body
    for other in (keys[rival], None):  # the other tenant; the operator's own organization (org_local)
        status, body = _as(survivor, other, f"/sandbox/sandboxes/{sandbox_id}/events") if other \
            else survivor.call("GET", f"/sandbox/sandboxes/{sandbox_id}/events")
        assert status == 404, body
    # The trail: the tenant's, not org_local's nor the other tenant's.
    assert sandbox_id in _trail(survivor, tmp_path, owner)
    assert sandbox_id not in _trail(survivor, tmp_path, "org_local")
    assert sandbox_id not in _trail(survivor, tmp_path, rival)
    # ``hutch audit`` into PostgreSQL: every row of the sandbox under its tenant.
    subprocess.run([sys.executable, "-m", "hutch", "audit", "--event-log", survivor.env["HUTCH_EVENT_LOG"],
                    "--store", database, "--until-caught-up", "--data-dir", str(tmp_path / "audit-pg")],
                   cwd=ROOT, check=True, capture_output=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    orgs = asyncio.run(_audit_orgs(database, sandbox_id))
    assert "lifecycle:discarded" in orgs and set(orgs.values()) == {owner}, orgs


def test_a_discarded_sandbox_is_filed_under_its_tenant(tmp_path: Path, database: str,
                                                        shared: Callable[[], dict[str, str]]) -> None:
    """The replica is killed -9 after its driver made the sandbox, before it appended the create:
    no event but the survivor's discard records it."""
    survivor = Server(tmp_path / "b", **shared()).start()
    doomed = Server(tmp_path / "a", HUTCH_CRASH_AT="create-made-unrecorded", **shared()).start()
    try:
        keys = _tenants(survivor)
        owner = next(iter(keys))
        with pytest.raises((ConnectionError, urllib.error.URLError)):  # no answer: the replica is gone
            doomed.call("POST", f"/sandbox?orgId={owner}", {})
        assert doomed.proc is not None and doomed.proc.wait(10) == -9, "the replica did not die at the crash point"
        [discard] = _discards(survivor, time.monotonic() + ENDED_WITHIN)
        sandbox_id = discard["sandboxId"]
        assert discard.get("orgId") == owner, discard
        assert [r["type"] for r in _records(survivor) if r["sandboxId"] == sandbox_id] == ["lifecycle:discarded"]
        status, _ = _as(survivor, keys[owner], f"/sandbox/{sandbox_id}")
        assert status == 404  # nothing recorded its creation: there is no sandbox to show, only its end
        listed = _as(survivor, keys[owner], "/sandbox?includeDeleted=true")[1]["data"]
        assert sandbox_id not in [s["sandboxId"] for s in listed["sandboxes"]]
        _assert_filed_under(owner, keys, survivor, tmp_path, database, sandbox_id)
    finally:
        for s in (doomed, survivor):
            s.stop()


def _stopped(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    return False


def test_a_create_landing_after_its_discard_is_filed_under_its_tenant_whole(
        tmp_path: Path, database: str, shared: Callable[[], dict[str, str]]) -> None:
    """The replica froze (SIGSTOP) before its append; the survivor ended the sandbox; then the
    append landed: the create, its start and the discard before them are all the tenant's."""
    survivor = Server(tmp_path / "b", **shared()).start()
    frozen = Server(tmp_path / "a", HUTCH_CRASH_AT="create-vouched-unrecorded:stop", **shared()).start()
    try:
        keys = _tenants(survivor)
        owner = next(iter(keys))
        answer: list[Any] = []

        def create() -> None:
            try:
                answer.append(frozen.call("POST", f"/sandbox?orgId={owner}", {}, timeout=120))
            except (ConnectionError, urllib.error.URLError) as err:
                answer.append(err)

        creating = threading.Thread(target=create)
        creating.start()
        assert frozen.proc is not None
        deadline = time.monotonic() + 30
        while not _stopped(frozen.proc.pid):
            assert time.monotonic() < deadline, "the replica did not stop at its append within 30 s"
            time.sleep(0.1)
        [discard] = _discards(survivor, time.monotonic() + ENDED_WITHIN)
        sandbox_id = discard["sandboxId"]
        os.kill(frozen.proc.pid, signal.SIGCONT)  # its append goes on, and lands late
        creating.join(120)
        assert answer and isinstance(answer[0], tuple) and answer[0][0] == 503, answer
        deadline = time.monotonic() + 20
        while (found := _as(survivor, keys[owner], f"/sandbox/{sandbox_id}"))[0] == 404:
            assert time.monotonic() < deadline, "the late append never landed"
            time.sleep(0.2)
        assert found[0] == 200 and found[1]["data"]["status"] == "failed", found
        assert {r.get("orgId") for r in _records(survivor) if r["sandboxId"] == sandbox_id} == {owner}
        _assert_filed_under(owner, keys, survivor, tmp_path, database, sandbox_id)
    finally:
        if frozen.proc is not None and frozen.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(frozen.proc.pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            survivor.destroy_every_sandbox()
        for s in (frozen, survivor):
            s.stop()
