"""The SDK's snapshot calls against a live server (fake driver): every one round-trips."""

from __future__ import annotations

import io
import tarfile

import pytest

from hutch import SandboxClient, errors
from tests.sdk.test_sdk_live import live  # noqa: F401  (fixture)


async def test_snapshot_calls(live: SandboxClient, tmp_path) -> None:  # noqa: F811  # type: ignore[no-untyped-def]
    sb = await live.create()
    await live.write_files(sb.id, {"keep.txt": b"kept"})
    snap = await live.create_snapshot(sb.id, name="sdk", tag="v1")
    assert snap.snapshot_id.startswith("snp_") and snap.file_count == 1 and snap.files and snap.files[0].path == "keep.txt"
    assert (await live.get_snapshot("sdk:v1")).snapshot_id == snap.snapshot_id
    page, total = await live.list_snapshots(sandbox_id=sb.id)
    assert [s.snapshot_id for s in page] == [snap.snapshot_id] and total == 1
    assert (await live.tag_snapshot(snap.snapshot_id, "v2")).tag == "v2"
    assert [e.snapshot_id for e in await live.snapshot_lineage(name="sdk")] == [snap.snapshot_id]

    target = tmp_path / "snap.tar.gz"
    size = await live.download_snapshot(snap.snapshot_id, target)
    assert size == target.stat().st_size > 0
    with tarfile.open(target) as tf:
        assert tf.extractfile("keep.txt").read() == b"kept"  # type: ignore[union-attr]

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("tool.sh")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"hi\n"))
    built, new = await live.build_snapshot("base:latest", buf.getvalue(), name="built", content_hash="h1")
    assert new and built.file_count == 1
    again, new = await live.build_snapshot("base:latest", buf.getvalue(), name="built", content_hash="h1")
    assert not new and again.snapshot_id == built.snapshot_id

    await live.delete_snapshot(snap.snapshot_id)
    with pytest.raises(errors.SnapshotNotFound):
        await live.get_snapshot(snap.snapshot_id)
    partial = tmp_path / "gone.tar.gz"
    with pytest.raises(errors.NotFound):
        await live.download_snapshot(snap.snapshot_id, partial)
    assert not partial.exists()  # no half-written file left behind
