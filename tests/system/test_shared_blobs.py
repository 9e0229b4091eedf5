"""Shared state across replicas (issue 20): a snapshot taken through one API server is
served by another, after the first one's host is gone for good.

Server A (its own data dir, the production profile on the shared Kafka + PostgreSQL)
snapshots a sandbox's file; A is killed -9 and its data dir deleted; server B (another
data dir, the same Kafka + PostgreSQL) downloads the archive and creates a sandbox from
the snapshot's tag, and the file is there.
"""

from __future__ import annotations

import base64
import io
import shutil
import tarfile
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.system.server import KEY, Server

pytestmark = pytest.mark.slow

CONTENT = b"made on server A\n" * 1000


def download(server: Server, path: str) -> bytes:
    req = urllib.request.Request(server.url + path, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        return bytes(resp.read())


def test_a_snapshot_outlives_the_server_and_host_that_took_it(
    tmp_path: Path, shared: Callable[[], dict[str, str]]
) -> None:
    a = Server(tmp_path / "a", **shared()).start()
    try:
        sid = a.data("POST", "/sandbox", {"name": "origin"})["sandboxId"]
        a.data("POST", f"/fs/{sid}", {"files": [{"path": "notes/kept.txt",
                                                 "content": base64.b64encode(CONTENT).decode()}]})
        snap = a.data("POST", f"/sandbox/{sid}/snapshot", {"name": "shared", "tag": "v1"})
    finally:
        a.kill9()
    shutil.rmtree(a.data_dir)  # the host is gone, and its disk with it

    b = Server(tmp_path / "b", **shared()).start()
    try:
        archive = download(b, f"/sandbox/snapshots/{snap['snapshotId']}/download")
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            member = tar.extractfile("notes/kept.txt")
            assert member is not None and member.read() == CONTENT
        assert b.data("GET", "/sandbox/snapshots/shared:v1")["snapshotId"] == snap["snapshotId"]
        child = b.data("POST", "/sandbox", {"snapshot": "shared:v1"})["sandboxId"]
        req = urllib.request.Request(f"{b.url}/fs/{child}?path=notes/kept.txt",
                                     headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.read() == CONTENT
    finally:
        b.stop()
