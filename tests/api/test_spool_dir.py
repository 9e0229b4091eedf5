"""Uploads and SFTP files spool in the data directory's private spool, not the system's /tmp
(memory where that is a tmpfs, and shared with the host's other users): an upload looked for
a ``tmp`` there that nothing made; SFTP never looked."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from typing import IO, Any

import pytest

from hutch.api import sftp
from hutch.api.keys import CONFIG, ENGINE
from hutch.api.routes import files as file_routes
from hutch.service.spool_room import Spooled, SpoolRoom
from tests.api.conftest import WIRE, Api


@pytest.mark.runs_on(*WIRE)
async def test_an_upload_spools_in_the_data_directory(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    spool_dir = api.client.server.app[CONFIG].data_dir / "spool"
    used: list[str | None] = []
    spool = file_routes.archives.spool

    async def watched(chunks: Any, most: int, directory: str | None = None) -> IO[bytes]:
        used.append(directory)
        return await spool(chunks, most, directory)

    monkeypatch.setattr(file_routes.archives, "spool", watched)
    sid = (await api.data("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["sandboxId"]
    await api.data("GET", f"/sandbox/{sid}?waitForStatus=idle&waitMs=30000")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("a.txt")
        info.size = 5
        tf.addfile(info, io.BytesIO(b"alpha"))
    done = await api.data("POST", f"/fs/upload/{sid}?path=/workspace/in", data=buf.getvalue())
    assert done["files"] == 1
    assert used == [str(spool_dir)]
    assert stat.S_IMODE(os.stat(spool_dir).st_mode) == 0o700
    assert not [p for p in os.listdir(spool_dir) if p.startswith("upload-")]  # and gone after
    room = await api.client.server.app[ENGINE].files.spooled(sid)
    assert room.directory == str(spool_dir)


def test_an_sftp_file_spools_where_its_room_says(tmp_path: Any) -> None:
    opened = sftp._Open("/home/agentuity/f", True, 1 << 25, Spooled(SpoolRoom(1 << 25), "org_a", str(tmp_path)))
    try:
        opened.reserve(sftp._SPOOL + 1)  # past the in-memory part: on disk, in the room's directory
        opened.data.rollover()
        assert os.path.dirname(os.readlink(f"/proc/self/fd/{opened.data.fileno()}")) == str(tmp_path)
    finally:
        opened.data.close()
